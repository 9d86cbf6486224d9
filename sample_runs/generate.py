"""Regenerate the recorded sample runs: real trainer runs with injected faults.

Run from the repository root:  OMP_NUM_THREADS=1 python sample_runs/generate.py

Each run trains ``tiny_cpu`` under torchrun with a fault plan, then keeps only what a
run directory holds for bedside to read (run.json, telemetry/, ground_truth/): no
checkpoints, no store. Timings differ from one machine to the next; the faults, their
steps and their ground truth do not.
"""
from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
KEPT = ("run.json", "telemetry", "ground_truth")

RUNS = {
    "tiny-faults": {
        "nproc": 2,
        "steps": 200,
        "inject": [
            "bad_shard:shards=0-3,from=120,steps=20",
            "straggler:rank=1,factor=2.0,from=60,steps=40",
            "grad_bitflip:rank=1,step=150",
            "param_bitflip:rank=0,step=170",
            "nan:rank=0,step=185",
        ],
    },
}


def generate(name: str, nproc: int, steps: int, inject: list[str]) -> Path:
    """Train one sample run in a scratch folder and copy its telemetry here."""
    with tempfile.TemporaryDirectory() as scratch:
        run = Path(scratch) / name
        command = [sys.executable, "-m", "bedside.app.cli", "train", "--out", str(run), "--nproc", str(nproc),
                   "--steps", str(steps)] + [option for spec in inject for option in ("--inject", spec)]
        subprocess.run(command, check=True)
        target = HERE / name
        shutil.rmtree(target, ignore_errors=True)
        target.mkdir()
        for entry in KEPT:
            source = run / entry
            (shutil.copytree if source.is_dir() else shutil.copy2)(source, target / entry)
    return target


def main() -> None:
    for name, plan in RUNS.items():
        print(f"{name}: {generate(name, **plan)}")


if __name__ == "__main__":
    main()
