"""Regenerate the recorded sample runs: real trainer runs with injected faults.

Run from the repository root:  OMP_NUM_THREADS=1 python sample_runs/generate.py

Each run trains ``tiny_cpu`` under torchrun with a fault plan (and, for some, operator
actions filed while it trains), then keeps only what a run directory holds for bedside
to read (run.json, telemetry/, ground_truth/): no checkpoints, no store. Timings
differ from one machine to the next, and so does the exact step at which a filed
action is applied; the faults, their steps and their ground truth do not.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bedside.collectors.control import request_action
from bedside.collectors.layout import RunLayout

HERE = Path(__file__).resolve().parent
KEPT = ("run.json", "telemetry", "ground_truth")

RUNS = {
    "tiny-faults": {
        "nproc": 2,
        "steps": 200,
        "inject": [
            "bad_shard:shards=0-3,from=80,steps=15",
            "straggler:rank=1,factor=2.0,from=105,steps=35",
            "grad_bitflip:rank=1,step=150",
            "param_bitflip:rank=0,step=170",
            "nan:rank=0,step=185",
        ],
    },
    "tiny-rewind": {
        "nproc": 2,
        "steps": 160,
        "checkpoint_every": 20,
        "inject": [
            "bad_shard:shards=0-1,from=70",
            "repeat_batch:from=120",
        ],
        # (once step >= this, action, args, reason): the on-call's response to the spike
        "actions": [
            (78, "rewind", {"to_step": 60}, "loss spike: shards 0 and 1 serve garbage from step 70"),
            (78, "quarantine", {"shard": 0}, "garbage tokens"),
            (78, "quarantine", {"shard": 1}, "garbage tokens"),
        ],
    },
}


def generate(name: str, nproc: int, steps: int, inject: list[str], checkpoint_every: int = 50,
             actions: tuple = ()) -> Path:
    """Train one sample run in a scratch folder, file its actions, and copy its telemetry here."""
    with tempfile.TemporaryDirectory() as scratch:
        run = Path(scratch) / name
        command = [sys.executable, "-m", "bedside.app.cli", "train", "--out", str(run), "--nproc", str(nproc),
                   "--steps", str(steps), "--checkpoint-every", str(checkpoint_every)]
        training = subprocess.Popen(command + [option for spec in inject for option in ("--inject", spec)])
        for after_step, action, args, reason in actions:
            wait_for_step(run, after_step, training)
            request_action(RunLayout(run), action, args, operator="sample-runs", reason=reason)
        if training.wait() != 0:
            raise SystemExit(f"{name}: training exited with code {training.returncode}")
        target = HERE / name
        shutil.rmtree(target, ignore_errors=True)
        target.mkdir()
        for entry in KEPT:
            source = run / entry
            (shutil.copytree if source.is_dir() else shutil.copy2)(source, target / entry)
    return target


def wait_for_step(run: Path, step: int, training: subprocess.Popen) -> None:
    """Block until rank 0 has recorded ``step`` (or training has ended)."""
    rank0 = RunLayout(run).rank_file(0)
    while training.poll() is None:
        if rank0.exists() and any(json.loads(line).get("step", 0) >= step
                                  for line in rank0.read_text().splitlines()[-20:] if line.startswith("{")):
            return
        time.sleep(0.05)


def main() -> None:
    for name, plan in RUNS.items() if len(sys.argv) < 2 else ((n, RUNS[n]) for n in sys.argv[1:]):
        print(f"{name}: {generate(name, **plan)}")


if __name__ == "__main__":
    main()
