"""Start one node's training ranks, as ``torchrun --standalone`` does, with torch's elastic agent in this process.

torchrun starts each rank as a new interpreter, which imports torch and the trainer again: about 2.5 s of CPU a
rank before its first step, paid on every launch and every resume. Here the ranks are forked from a fork server
that imports them once (``multiprocessing``'s forkserver, preloaded with the trainer): one import a launch
however many ranks it starts, and none in this process, which only waits on them. The server is a fresh
single-threaded interpreter that never touches CUDA, so a forked rank inherits no lock held by another thread
(the agent's rendezvous and store threads run by then) and can use CUDA. Each rank runs in a session of its own,
as torchrun's do: Ctrl-C or SIGTERM reaches the agent, which stops the ranks with that signal, and ``kill -9``
of the agent alone leaves them running.
"""

from __future__ import annotations

import importlib
import multiprocessing
import os
import sys
import uuid

from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.launcher.api import LaunchConfig, elastic_launch

TRAINER = "bedside.trainer.train"
"""What the fork server imports for its ranks, and this process never does: the agent only waits on them."""
PRELOADED = (TRAINER, "torch._dynamo", __name__)
"""The fork server's imports, each once a launch rather than once a rank: the trainer, this module (the ranks'
entry point), and ``torch._dynamo``, which DDP imports when it wraps a model (about 1.2 s of CPU)."""


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
        start_method="forkserver",
    )
    multiprocessing.set_forkserver_preload(list(PRELOADED))
    try:
        elastic_launch(config, training_rank)(argv)
    except ChildFailedError as failed:
        print(failed.format_msg(), file=sys.stderr)
        return 1
    except SignalException as stopped:
        return 128 + int(stopped.sigval)
    return 0


def training_rank(argv: list[str]) -> None:
    """One rank, in a process the fork server started: out of the launcher's session (the fork server is in it),
    then the trainer's entry point."""
    os.setsid()
    importlib.import_module(TRAINER).main(argv)
