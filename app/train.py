"""``bedside train``: launch the instrumented trainer's ranks on this node, as torchrun would."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from bedside.collectors.controlkey import ControlKeyError, ensure_control_key
from bedside.collectors.errors import BedsideError
from bedside.collectors.layout import RunLayout

from .options import integer_in

TRAINER_MODULE = "bedside.trainer.train"


def add_parser(commands: argparse._SubParsersAction) -> None:
    """Register ``bedside train``."""
    p = commands.add_parser(
        "train",
        help="train a preset under torchrun, writing telemetry into RUN",
        description="Run the instrumented trainer with torchrun (gloo on CPU, nccl on CUDA). "
        f"The same as: torchrun --nproc-per-node N -m {TRAINER_MODULE} ...",
    )
    p.add_argument("--preset", default="tiny_cpu", help="training preset (default tiny_cpu)")
    p.add_argument("--out", type=Path, required=True, help="run directory to write")
    p.add_argument("--nproc", type=integer_in(1, 1024), default=2, help="ranks on this node (default 2)")
    p.add_argument("--steps", type=integer_in(1, 10**9), help="override the preset's number of steps")
    p.add_argument(
        "--parallelism",
        choices=("ddp", "fsdp"),
        help="override the preset's data parallelism: ddp, or fsdp (FSDP2 fully_shard, ZeRO-3 style)",
    )
    p.add_argument(
        "--checkpoint-every",
        type=integer_in(1, 10**9),
        metavar="N",
        help="override the preset's checkpoint interval (steps)",
    )
    p.add_argument(
        "--keep-checkpoints",
        type=integer_in(1, 10**6),
        metavar="N",
        help="override how many of the newest checkpoints are kept (tiny_cpu: 3); a rewind can only go "
        "back as far as the oldest one",
    )
    p.add_argument(
        "--resume", action="store_true", help="continue RUN from its latest good checkpoint, on a new timeline"
    )
    p.add_argument(
        "--inject",
        action="append",
        default=[],
        metavar="SPEC",
        help="inject a fault with ground truth, e.g. nan:rank=0,step=25 (docs/faults.md); repeatable",
    )
    p.set_defaults(handler=cmd_train)


def train_command(options: list[str]) -> list[str]:
    """The command line of ``bedside train OPTIONS`` run by this interpreter (a child process)."""
    return [sys.executable, "-m", "bedside.app.cli", "train", *options]


def rank_argv(args: argparse.Namespace) -> list[str]:
    """What each rank's ``bedside.trainer.train`` is given: the arguments after ``-m TRAINER_MODULE`` of the
    torchrun command that ``bedside train`` stands for."""
    command = ["--preset", args.preset, "--out", str(args.out)]
    command += ["--steps", str(args.steps)] if args.steps else []
    command += ["--parallelism", args.parallelism] if args.parallelism else []
    command += ["--checkpoint-every", str(args.checkpoint_every)] if args.checkpoint_every else []
    command += ["--keep-checkpoints", str(args.keep_checkpoints)] if args.keep_checkpoints else []
    command += ["--resume"] if args.resume else []
    return command + [option for spec in args.inject for option in ("--inject", spec)]


def check_before_launch(args: argparse.Namespace) -> None:
    """Refuse a bad preset, override or fault spec here, once, rather than in every rank."""
    from bedside.trainer.config import preset  # the trainer is needed by this command only (and not torch, yet)
    from bedside.trainer.faults import fault_plan

    try:
        config = preset(
            args.preset,
            steps=args.steps,
            parallelism=args.parallelism,
            checkpoint_every=args.checkpoint_every,
            keep_checkpoints=args.keep_checkpoints,
        )
        fault_plan(args.inject, config, rank=0, world_size=args.nproc)
    except ValueError as exc:
        raise BedsideError(str(exc)) from exc


def cmd_train(args: argparse.Namespace) -> int:
    """Check the options, make the run's control key, launch the ranks and wait; the exit status is torchrun's.

    The key exists before any rank starts, so a request can be filed from the first step on.
    """
    check_before_launch(args)
    try:
        ensure_control_key(RunLayout(args.out))
    except ControlKeyError as exc:
        raise BedsideError(str(exc)) from exc
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # read once, as torch loads its OpenMP runtime
    from bedside.trainer.launch import launch

    return launch(rank_argv(args), args.nproc)
