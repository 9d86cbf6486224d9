"""Entry point of one training rank, run by torchrun:

    torchrun --nproc-per-node 2 -m bedside.trainer.train --preset tiny_cpu --out runs/r1 --steps 200

``bedside train`` runs ``main`` in ranks it starts itself (``launch.py``). Backend: nccl when CUDA is available,
else gloo.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import sys
from types import FrameType

import torch
import torch.distributed as dist

from bedside.collectors.writer import RankPlacement, RunLogger

from .config import PARALLELISMS, PRESETS, preset
from .faults import fault_plan
from .trainer import Trainer


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="bedside.trainer.train", description=__doc__.splitlines()[0])
    parser.add_argument("--preset", choices=sorted(PRESETS), default="tiny_cpu")
    parser.add_argument("--out", required=True, help="run directory")
    parser.add_argument("--steps", type=int, help="override the preset's number of steps")
    parser.add_argument("--parallelism", choices=PARALLELISMS, help="override the preset's parallelism")
    parser.add_argument("--checkpoint-every", type=int, help="override the preset's checkpoint interval (steps)")
    parser.add_argument("--keep-checkpoints", type=int, help="override how many of the newest checkpoints are kept")
    parser.add_argument("--resume", action="store_true", help="continue from the latest good checkpoint in OUT")
    parser.add_argument(
        "--inject",
        action="append",
        default=[],
        metavar="SPEC",
        help="inject a fault, e.g. straggler:rank=1,factor=2,from=20 (docs/faults.md); repeatable",
    )
    args = parser.parse_args(argv)
    try:  # a bad spec fails here, before the process group and the run directory exist
        fault_plan(args.inject, preset(args.preset), rank=_env_int("RANK"), world_size=_env_int("WORLD_SIZE", 1))
    except ValueError as exc:
        parser.error(str(exc))
    return args


def _env_int(name: str, default: int = 0) -> int:
    return int(os.environ.get(name) or default)


def init_distributed() -> torch.device:
    """Join the process group torchrun set up; the device this rank trains on."""
    if torch.cuda.is_available():
        local_rank = int(os.environ.get("LOCAL_RANK", 0))
        torch.cuda.set_device(local_rank)
        dist.init_process_group("nccl")
        return torch.device("cuda", local_rank)
    dist.init_process_group("gloo")
    return torch.device("cpu")


def gather_topology() -> tuple[RankPlacement, ...]:
    """Every rank's host, local rank and mesh coordinates: data parallel only, so dp = rank and the
    tensor- and pipeline-parallel coordinates are 0 (a mesh of world_size x 1 x 1)."""
    mine = (socket.gethostname(), int(os.environ.get("LOCAL_RANK", 0)))
    everyone: list[tuple[str, int]] = [None] * dist.get_world_size()  # type: ignore[list-item]
    dist.all_gather_object(everyone, mine)
    return tuple(
        RankPlacement(rank=r, host=host, local_rank=local, dp=r, tp=0, pp=0) for r, (host, local) in enumerate(everyone)
    )


class Terminated(Exception):
    """SIGTERM arrived: torchrun stopping the survivors of a failed rank, or the scheduler ending the job."""


def _raise_terminated(signum: int, _frame: FrameType | None) -> None:
    raise Terminated(f"stopped by {signal.Signals(signum).name} (a peer rank failed or the job was stopped)")


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    # Python's default for SIGTERM is to die on the spot, losing the records still queued for the
    # writer thread (the last steps before a peer's crash). Raised as an exception instead, it
    # unwinds through the logger, which flushes them and records this rank's end.
    signal.signal(signal.SIGTERM, _raise_terminated)
    config = preset(
        args.preset,
        steps=args.steps,
        parallelism=args.parallelism,
        checkpoint_every=args.checkpoint_every,
        keep_checkpoints=args.keep_checkpoints,
    )
    device = init_distributed()
    topology = gather_topology()
    placement = topology[dist.get_rank()]
    with RunLogger(
        args.out,
        name=os.path.basename(os.path.abspath(args.out)),
        config=config.to_json(),
        placement=placement,
        topology=topology,
        resume=args.resume,
        timeline=0,  # on a resume, Checkpointing.resume moves every rank to the timeline they agree on
    ) as logger:
        faults = fault_plan(args.inject, config, rank=dist.get_rank(), world_size=dist.get_world_size(), logger=logger)
        Trainer(config, logger, device, faults=faults).train(resume=args.resume)
    dist.destroy_process_group()


def exit_without_teardown() -> None:
    """Leave once the run is over: its records are written and closed, its checkpoints saved and the process group
    destroyed, so the interpreter's teardown of torch's modules (about 0.7 s of CPU a rank, while torchrun waits on
    every rank) would release nothing this rank still holds."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
    exit_without_teardown()
