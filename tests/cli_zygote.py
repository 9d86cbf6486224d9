"""The ``bedside`` CLI as a process of its own for each command, without the second of CPU that a new interpreter
spends starting and importing pandas, DuckDB, pyarrow and the detectors before the command's own work.

A zygote process imports those once; for each command it forks a child, which takes the caller's working
directory, gets /dev/null for stdin and files for stdout and stderr, runs ``bedside.app.cli`` as ``python -m``
would (its own ``sys.argv``) and exits through the interpreter's normal shutdown (atexit, non-daemon threads).
The child is a real process: its own pid, file descriptors and exit status, killed when over its timeout.

The zygote's environment is fixed when it starts (``/proc/PID/environ`` of a child is the zygote's, and the
interpreter reads ``PYTHON*``, ``TZ`` and the locale as it starts), so a command whose environment differs from
it, or that a test runs while another is in flight, runs from a new interpreter instead
(``Zygote.run`` returns None). Where the next command's environment differs the same way, the environment has
moved for good (libraries set variables as they run: torch's inductor its cache folder, transformers its CUDA
check, Streamlit matplotlib's backend), and a new zygote is started in it. Starting cold is tested where it
matters: ``test_boundaries`` (what ``--help`` imports), the README's commands and the demo.
"""

from __future__ import annotations

import gc
import json
import locale
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

PRELOADED = (
    "bedside.app.cli",
    "bedside.app.service.owner",
    "bedside.collectors.audit",
    "bedside.collectors.ingest",
    "bedside.collectors.query",
    "bedside.collectors.runs",
    "bedside.detectors.registry",
)
"""What the commands import lazily and most of them need (a module left out is imported by the child)."""
PER_TEST = {"PYTEST_CURRENT_TEST"}  # set by pytest around each test; no command reads it
_children_cpu = [0.0]


def children_cpu() -> float:
    """The CPU seconds of every command run so far by this process's zygote: theirs is the zygote's to reap, so
    they are not among this process's children in ``getrusage``."""
    return _children_cpu[0]


class Zygote:
    """The test side: one zygote per test process, started on first use."""

    def __init__(self) -> None:
        self._process: subprocess.Popen | None = None
        self._environ: dict[str, str] = {}
        self._moved_to: dict[str, str] | None = None  # the environment of the last command that ran cold
        self._busy = threading.Lock()

    def run(self, argv: list[str], timeout: float) -> subprocess.CompletedProcess | None:
        """``bedside ARGV`` in a child of the zygote, as ``subprocess.run(..., capture_output=True, text=True,
        timeout=timeout)`` would return it; None when it must run from a new interpreter instead."""
        if not self._busy.acquire(blocking=False):
            return None
        try:
            environ = _without(os.environ, PER_TEST)
            if environ != _without(self._environ, PER_TEST) and self._process is not None:
                if environ != self._moved_to:  # a test's own environment, maybe: this command runs cold
                    self._moved_to = environ
                    return None
                self.close()  # the environment moved for good (a library set a variable as it ran): a zygote for it
            process = self._started()
            request = {"argv": argv, "cwd": os.getcwd(), "timeout": timeout}
            process.stdin.write(json.dumps(request) + "\n")
            process.stdin.flush()
            line = process.stdout.readline()
            if not line:
                raise RuntimeError(f"the CLI zygote died (exit status {process.wait()})")
            answer = json.loads(line)
            _children_cpu[0] += answer["cpu"]
        finally:
            self._busy.release()
        command = [sys.executable, "-m", "bedside.app.cli", *argv]
        out, err = (_text(Path(answer[name])) for name in ("stdout", "stderr"))
        if answer["returncode"] is None:
            raise subprocess.TimeoutExpired(command, timeout, out, err)
        return subprocess.CompletedProcess(command, answer["returncode"], out, err)

    def _started(self) -> subprocess.Popen:
        if self._process is None or self._process.poll() is not None:
            self._environ = dict(os.environ)
            self._process = subprocess.Popen(
                [sys.executable, __file__], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
            )
        return self._process

    def close(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.stdin.close()
            self._process.wait()


def _without(environ: os._Environ | dict[str, str], names: set[str]) -> dict[str, str]:
    return {name: value for name, value in environ.items() if name not in names}


def _text(path: Path) -> str:
    """What ``subprocess.run(text=True)`` makes of a captured stream: decoded by the locale, newlines translated."""
    data = path.read_bytes()
    path.unlink()
    return data.decode(locale.getpreferredencoding(False)).replace("\r\n", "\n").replace("\r", "\n")


# -- the zygote ------------------------------------------------------------------------------------------------
def _know_our_store_code() -> None:
    """What a command's first store open computes once a process, computed once for every child: the views and
    macros our migrations define (``catalog``), built in an in-memory store. DuckDB's threads end with it, so the
    children fork from a process no more threaded than before."""
    from bedside.app.service.schema import SCHEMAS
    from bedside.collectors.store import Store, catalog

    with Store.open(None, schemas=SCHEMAS) as store:
        versions = store.versions()
    catalog.expected_catalog(versions)
    catalog.definitions(versions)


def serve() -> None:
    """Answer each request line on stdin with a line on stdout, one command at a time, until stdin closes."""
    import importlib

    for name in PRELOADED:
        importlib.import_module(name)
    _know_our_store_code()
    gc.freeze()  # a child's collections leave the preloaded objects alone, and their pages shared
    requests, answers = sys.stdin, sys.stdout
    while line := requests.readline():
        request = json.loads(line)
        out, err = (tempfile.mkstemp(prefix=f"bedside-cli-{name}-") for name in ("out", "err"))
        answers.flush()
        pid = os.fork()
        if pid == 0:
            _child(request, out[0], err[0])  # never returns
        os.close(out[0]), os.close(err[0])
        returncode, cpu = _wait(pid, request["timeout"])
        answers.write(json.dumps({"returncode": returncode, "cpu": cpu, "stdout": out[1], "stderr": err[1]}))
        answers.write("\n")
        answers.flush()


def _child(request: dict, out: int, err: int) -> None:
    """Become ``python -m bedside.app.cli ARGV`` in the caller's working directory; leave by SystemExit, so the
    interpreter shuts down as after any command."""
    null = os.open(os.devnull, os.O_RDONLY)
    for descriptor, target in ((null, 0), (out, 1), (err, 2)):
        os.dup2(descriptor, target)
    os.close(null), os.close(out), os.close(err)
    os.chdir(request["cwd"])
    from bedside.app import cli

    sys.argv = [cli.__file__, *request["argv"]]
    sys.exit(cli.main())


def _wait(pid: int, timeout: float) -> tuple[int | None, float]:
    """The child's exit status as ``subprocess`` gives it (-N: killed by signal N), or None, having killed it, when
    it ran past ``timeout``; and the CPU seconds it used."""
    handle = os.pidfd_open(pid)
    try:
        late = not select.select([handle], [], [], timeout)[0]
    finally:
        os.close(handle)
    if late:
        os.kill(pid, signal.SIGKILL)
    _, status, usage = os.wait4(pid, 0)
    return None if late else os.waitstatus_to_exitcode(status), usage.ru_utime + usage.ru_stime


if __name__ == "__main__":
    serve()
