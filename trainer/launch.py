"""Start one node's training ranks, as ``torchrun --standalone`` does, with torch's elastic agent in this process.

torchrun starts each rank as a new interpreter, which imports torch and the trainer again: about 2.5 s of CPU a
rank before its first step, paid on every launch and every restart. Here the ranks are forked from the agent,
which has imported both already. Where CUDA is present they are spawned instead (a process that forks after
touching CUDA cannot use it in the child; the agent's device count may touch it), and pay the import as under
torchrun. Either way each rank runs in a session of its own, as torchrun's do: Ctrl-C or SIGTERM reaches the
agent, which stops the ranks with that signal, and ``kill -9`` of the agent alone leaves them running.
"""

from __future__ import annotations

import os
import signal
import sys
import uuid

import torch
from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.launcher.api import LaunchConfig, elastic_launch

from . import train


def launch(argv: list[str], nproc: int) -> int:
    """Run ``bedside.trainer.train ARGV`` on ``nproc`` ranks of this node; torchrun's exit status: 0 when every
    rank finished, 1 when one failed (its failure printed as torchrun prints it), 128 + N when signal N stopped
    the job."""
    config = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=nproc,
        run_id=str(uuid.uuid4()),
        rdzv_backend="c10d",
        rdzv_endpoint="localhost:0",
        max_restarts=0,
        start_method="spawn" if torch.cuda.is_available() else "fork",
    )
    try:
        elastic_launch(config, training_rank)(argv)
    except ChildFailedError as failed:
        print(failed.format_msg(), file=sys.stderr)
        return 1
    except SignalException as stopped:
        return 128 + int(stopped.sigval)
    return 0


def training_rank(argv: list[str]) -> None:
    """One rank, in a process the agent started: out of the agent's session and rid of its signal handlers (a
    forked rank inherits both), then the trainer's entry point."""
    os.setsid()
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for signum in (signal.SIGHUP, signal.SIGQUIT):
        signal.signal(signum, signal.SIG_DFL)
    train.main(argv)
