"""How fast a TensorBoard log dir and a W&B offline run import: scalars per CPU second, conversion only.

Run:  python bench/import_speed.py [--steps 20000] [--workdir DIR]

torch's ``SummaryWriter`` writes STEPS steps of five scalars (``train/loss``, ``train/learning_rate``,
``grad_norm``, ``tokens_per_s``, ``step_time``) into one event file, and ``wandb`` in offline mode (in a child
process, no network) logs the same five keys for STEPS steps. Each source is then converted by
``import_tensorboard`` / ``import_wandb`` (reading, checking every record's checksum, renaming, writing the run
directory; ingestion is ``bench/ingest.py``'s subject) and the script prints the input's size, the CPU and wall
seconds of the conversion, and scalars per CPU second.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from bedside.collectors.importers import import_tensorboard, import_wandb

TAGS = ("train/loss", "train/learning_rate", "grad_norm", "tokens_per_s", "step_time")
LOG_WANDB = """
import sys, wandb
run = wandb.init(mode="offline", dir=sys.argv[1], project="bench")
tags = sys.argv[3].split(",")
for step in range(int(sys.argv[2])):
    wandb.log({tag: 1.0 / (step + 1 + i) for i, tag in enumerate(tags)}, step=step)
run.finish()
"""


def write_tensorboard(folder: Path, steps: int) -> Path:
    from torch.utils.tensorboard import SummaryWriter

    with SummaryWriter(str(folder)) as writer:
        for step in range(steps):
            for i, tag in enumerate(TAGS):
                writer.add_scalar(tag, 1.0 / (step + 1 + i), step)
    return folder


def write_wandb(folder: Path, steps: int) -> Path:
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_DISABLE_GIT": "true"}
    subprocess.run([sys.executable, "-c", LOG_WANDB, str(folder), str(steps), ",".join(TAGS)], env=env, check=True)
    return next(folder.glob("wandb/offline-run-*"))


def timed(convert: Callable[[Path, Path], object], source: Path, out: Path, steps: int) -> str:
    size = sum(p.stat().st_size for p in source.rglob("*") if p.is_file())
    wall, cpu = time.perf_counter(), time.process_time()
    convert(source, out)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    scalars = steps * len(TAGS)
    return f"{size / 2**20:9.1f} MiB {cpu:8.2f} CPU-s {wall:8.2f} wall-s {scalars / cpu:12,.0f} scalars/CPU-s"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20_000, help="steps of five scalars each")
    parser.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "bedside-bench-import")
    args = parser.parse_args()
    shutil.rmtree(args.workdir, ignore_errors=True)
    tensorboard = write_tensorboard(args.workdir / "tb", args.steps)
    wandb = write_wandb(args.workdir / "wb", args.steps)
    print(f"{args.steps} steps x {len(TAGS)} scalars")
    print(f"tensorboard {timed(import_tensorboard, tensorboard, args.workdir / 'tb-run', args.steps)}")
    print(f"wandb       {timed(import_wandb, wandb, args.workdir / 'wb-run', args.steps)}")


if __name__ == "__main__":
    main()
