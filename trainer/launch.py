"""Start one node's training ranks, as ``torchrun --standalone`` does, with torch's elastic agent in this process.

torchrun starts each rank as a new interpreter, which imports torch and the trainer again: about 2.5 s of CPU a rank
before its first step, paid on every launch and every resume. Here the ranks are forked from a fork server
(``multiprocessing``'s forkserver protocol): one import a launch however many ranks it starts. The fork server is
forked from this process as the launch starts, with torch and the trainer imported here once and before any thread
of the agent's runs (its rendezvous and store threads come later), so a rank inherits no lock held by another
thread; nothing here touches CUDA, so a rank can use it. Spawning the server instead, as ``multiprocessing`` does,
paid a new interpreter's import of torch and the trainer again (about 5 s of CPU a launch); where this process
already runs a second thread or has used CUDA, or on a Python whose forkserver internals differ, the server is
spawned that way. Each rank runs in a session of its own, as torchrun's do: Ctrl-C or SIGTERM reaches the agent,
which stops the ranks with that signal, and ``kill -9`` of the agent alone leaves them running.
"""

from __future__ import annotations

import importlib
import inspect
import multiprocessing
import os
import signal
import socket
import sys
import uuid
from multiprocessing import connection, forkserver, resource_tracker, util

from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.launcher.api import LaunchConfig, elastic_launch

TRAINER = "bedside.trainer.train"
"""What the fork server imports for its ranks, and this process never does: the agent only waits on them."""
PRELOADED = (TRAINER, "torch._dynamo", __name__)
"""The fork server's imports, each once a launch rather than once a rank: the trainer, this module (the ranks'
entry point), and ``torch._dynamo``, which DDP imports when it wraps a model (about 1.2 s of CPU)."""
SERVER_MAIN = ("listener_fd", "alive_r", "preload", "main_path", "sys_path")
"""``multiprocessing.forkserver.main``'s parameters on the Pythons whose fork server this module forks (3.11 to
3.13); another signature, and the server is spawned as ``multiprocessing`` does."""


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
    fork_the_fork_server()
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


def fork_the_fork_server() -> None:
    """Start ``multiprocessing``'s fork server as a fork of this process, with ``PRELOADED`` imported here first
    (where it cannot be, the first rank spawns one as usual)."""
    server = forkserver._forkserver
    if (
        tuple(inspect.signature(forkserver.main).parameters) != SERVER_MAIN
        or not hasattr(server, "_forkserver_pid")
        or server._forkserver_pid is not None
        or not os.path.isdir("/proc/self/task")
        or len(os.listdir("/proc/self/task")) > 1  # any thread, a library's pool as well as Python's
    ):
        return
    for name in PRELOADED:
        importlib.import_module(name)
    if sys.modules["torch"].cuda.is_initialized():  # a process that has used CUDA cannot hand it to a fork
        return
    resource_tracker.ensure_running()  # the ranks share this process's, as with a spawned server
    with socket.socket(socket.AF_UNIX) as listener:
        address = connection.arbitrary_address("AF_UNIX")  # type: ignore[attr-defined]  # (not in the stubs)
        listener.bind(address)
        if not util.is_abstract_socket_namespace(address):
            os.chmod(address, 0o600)
        listener.listen()
        alive_r, alive_w = os.pipe()  # every client holds the write end: the server ends when they all have
        sys.stdout.flush(), sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _serve_forks(listener.fileno(), alive_r)  # never returns
        os.close(alive_r)
    # what ForkServer.ensure_running records of the server it spawns (attributes that the stubs do not declare)
    vars(server).update(_forkserver_address=address, _forkserver_alive_fd=alive_w, _forkserver_pid=pid)


def _serve_forks(listener: int, alive_r: int) -> None:
    """The fork server, in the child: only its two descriptors and the standard streams kept, the signal handlers
    an interpreter starts with (its forks restore these), and out by ``os._exit`` whatever happens."""
    try:
        low = 3
        for kept in sorted((listener, alive_r)):
            os.closerange(low, kept)
            low = kept + 1
        os.closerange(low, os.sysconf("SC_OPEN_MAX"))
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        forkserver.main(listener, alive_r, [])
    finally:
        os._exit(0)
