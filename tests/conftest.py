"""Shared fixtures: a run directory, raw rank files, an ingested store, the real CLI."""

from __future__ import annotations

import fcntl
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from importlib import metadata
from pathlib import Path

import cli_zygote
import pytest
from receiver import Receiver

from bedside.collectors.controlkey import KEY_ENV, ensure_control_key
from bedside.collectors.ingest import Collector
from bedside.collectors.kit.runqueue import RunQueueClock
from bedside.collectors.layout import RunLayout
from bedside.collectors.runinfo import RunInfo, write_run_info
from bedside.collectors.store import Store

CLI_TIMEOUT_S = 120
REPORTED_LIBRARIES = ("duckdb", "pyarrow", "pandas", "torch", "watchdog")
TEST_BUDGET_S = 20.0  # a test's setup, call and teardown together; past it the test says why (see slow below)
SUITE_BUDGET_S = 20 * 60.0  # the README's test command on two busy cores (docs/performance.md)
TINY_FAULTS = Path(__file__).resolve().parents[1] / "sample_runs" / "tiny-faults"
HEAVIEST_FILES = 25  # the summary names the files that used the most CPU, where a cut of the suite's time starts


def _version(distribution: str) -> str:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return "not installed"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", f"slow(reason): a test allowed past the {TEST_BUDGET_S:.0f} s budget of the default run, and why"
    )
    config.addinivalue_line(
        "markers",
        "alone(reason): a test whose timing is what it checks (a live run raced by an operator, real-time lag):"
        " under xdist no other test runs beside it",
    )


class MachineShare:
    """Under xdist, who runs beside whom. One lock file per run of the suite (``folder``: xdist gives each worker a
    folder in it): every test holds it shared, a test marked ``alone`` exclusive. A turnstile before the exclusive
    hold keeps it from being starved by the others' shared holds. Not under xdist (``folder`` None): nothing to
    share, nothing held."""

    def __init__(self, folder: Path | None) -> None:
        self.files = (
            None if folder is None else (_lock_file(folder / "alone.lock"), _lock_file(folder / "turnstile.lock"))
        )

    @contextmanager
    def held(self, *, alone: bool) -> Iterator[None]:
        """The hold of one test: setup, call and teardown."""
        self._take(alone=alone)
        try:
            yield
        finally:
            self._let_go()

    def _take(self, *, alone: bool) -> None:
        if self.files is None:
            return
        lock, turnstile = self.files
        fcntl.flock(turnstile, fcntl.LOCK_EX)
        if alone:
            fcntl.flock(lock, fcntl.LOCK_EX)
        else:
            fcntl.flock(turnstile, fcntl.LOCK_UN)
            fcntl.flock(lock, fcntl.LOCK_SH)

    def _let_go(self) -> None:
        if self.files is None:
            return
        lock, turnstile = self.files
        fcntl.flock(lock, fcntl.LOCK_UN)
        fcntl.flock(turnstile, fcntl.LOCK_UN)


def _lock_file(path: Path) -> int:
    """A descriptor to flock, open for the worker's life."""
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)


SHARE = pytest.StashKey[MachineShare]()


def machine_share(config: pytest.Config) -> MachineShare:
    if SHARE not in config.stash:
        under_xdist = os.environ.get("PYTEST_XDIST_WORKER") is not None
        config.stash[SHARE] = MachineShare(Path(config.option.basetemp).parent if under_xdist else None)
    return config.stash[SHARE]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    """A test marked ``alone`` runs with no other test beside it (setup and teardown included, so the module fixtures
    it starts too); the rest share the machine (``MachineShare``)."""
    item.stash[CPU_AT], item.stash[WAITED_AT] = cpu_seconds(), RUN_QUEUE.read() or 0.0
    with machine_share(item.config).held(alone=item.get_closest_marker("alone") is not None):
        return (yield)


CPU_AT = pytest.StashKey[float]()
WAITED_AT = pytest.StashKey[float]()
RUN_QUEUE = RunQueueClock()
"""This process's main thread's wait for a CPU: on a busy machine, what inflates an in-process test's wall time."""


def cpu_seconds() -> float:
    """The CPU this process used, and the processes it started and reaped (a test's torchrun, CLI, browser): what a
    test costs the machine, which a busy machine does not inflate the way it inflates wall time."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime + cli_zygote.children_cpu()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    """Each phase's report carries the CPU seconds of that phase, and how long the test's thread waited for a CPU."""
    report = yield
    now, waited = cpu_seconds(), RUN_QUEUE.read() or 0.0
    report.user_properties.append(("cpu", now - item.stash.get(CPU_AT, now)))
    report.user_properties.append(("waited", waited - item.stash.get(WAITED_AT, waited)))
    item.stash[CPU_AT], item.stash[WAITED_AT] = now, waited
    return report


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto``: three workers a core, at most eight. Much of a worker's time in the heavy tests is spent
    waiting on the processes it started (torchrun ranks, the CLI, a browser, a server) or sleeping in a poll,
    so more workers than cores keep the cores busy; past eight, torchrun launches only crowd each other."""
    return min(3 * (os.cpu_count() or 1), 8)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Files with a slow test first (xdist hands out whole files in this order, so the longest start first and
    none is left to run by itself at the end), and files with a test marked ``alone`` last: such a test waits for
    every test in flight to end, and the workers that finish meanwhile wait idle; at the end there is nothing
    left to wait for. A slow test's reason travels with its reports, for the summary."""
    slow_files, alone_files = set(), set()
    for item in items:
        if (marker := item.get_closest_marker("slow")) is not None:
            item.user_properties.append(("slow", marker.kwargs.get("reason") or marker.args[0]))
            slow_files.add(item.path)
        if item.get_closest_marker("alone") is not None:
            alone_files.add(item.path)
    # stable: each file's tests keep their order
    items.sort(key=lambda item: (item.path in alone_files, item.path not in slow_files))


_seconds: dict[str, float] = {}
_cpu: dict[str, float] = {}
_waited: dict[str, float] = {}
_reasons: dict[str, str] = {}
_started: list[float] = []


def pytest_sessionstart() -> None:
    _started.append(time.monotonic())


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _seconds[report.nodeid] = _seconds.get(report.nodeid, 0.0) + report.duration
    _cpu[report.nodeid] = _cpu.get(report.nodeid, 0.0) + dict(report.user_properties).get("cpu", 0.0)
    _waited[report.nodeid] = _waited.get(report.nodeid, 0.0) + dict(report.user_properties).get("waited", 0.0)
    _reasons.update((report.nodeid, value) for name, value in report.user_properties if name == "slow")


def pytest_terminal_summary(terminalreporter, config: pytest.Config) -> None:
    """The tests past the per-test budget (module fixtures count to the first test that asks for them), each
    with its CPU seconds and its reason or the lack of one; the suite's time against its budget, and its CPU (a
    figure that the machine's load moves far less than wall time, to compare runs on different days).

    A test's time is judged less the time its thread waited for a CPU: with two workers a core, an in-process
    test of 4 s of CPU took 36 s of wall time, the machine's load, not the test's (a wait in a process the test
    starts is not known here, and counts)."""
    net = {n: s - _waited.get(n, 0.0) for n, s in _seconds.items()}
    over = sorted(((s, n) for n, s in _seconds.items() if net[n] > TEST_BUDGET_S), reverse=True)
    if over:
        terminalreporter.section(f"tests over the {TEST_BUDGET_S:.0f} s budget, less their wait for a CPU")
        for seconds, nodeid in over:
            reason = _reasons.get(nodeid, "NO REASON GIVEN")
            cpu, waited = _cpu.get(nodeid, 0.0), _waited.get(nodeid, 0.0)
            terminalreporter.write_line(
                f"{seconds:6.1f} s ({waited:5.1f} s waiting for a CPU, {cpu:5.1f} s CPU) {nodeid}: {reason}"
            )
    files: dict[str, float] = {}
    for nodeid, cpu in _cpu.items():
        files[nodeid.split("::")[0]] = files.get(nodeid.split("::")[0], 0.0) + cpu
    heaviest = sorted(((cpu, name) for name, cpu in files.items()), reverse=True)[:HEAVIEST_FILES]
    if len(files) > 1:
        terminalreporter.section(f"the {len(heaviest)} files that used the most CPU")
        for cpu, name in heaviest:
            terminalreporter.write_line(f"{cpu:6.1f} s CPU {name}")
    took = time.monotonic() - _started[0]
    terminalreporter.write_line(
        f"bedside suite: {took:.0f} s of its {SUITE_BUDGET_S:.0f} s budget on two busy cores;"
        f" the tests used {sum(_cpu.values()):.0f} s of CPU"
    )


def pytest_report_header(config) -> str:
    versions = [f"python {platform.python_version()}"] + [f"{n} {_version(n)}" for n in REPORTED_LIBRARIES]
    return "bedside libraries: " + ", ".join(versions)


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    """Where a test's run lives (not created: writers and helpers create what they need)."""
    return tmp_path / "run"


@pytest.fixture
def write_lines(run_dir: Path) -> Callable[..., Path]:
    """Append lines (bytes, str, or a dict as JSON; newline added) to a rank's telemetry file."""

    def write(lines: Iterable[bytes | str | dict], rank: int = 0, end: bytes = b"\n") -> Path:
        path = RunLayout(run_dir).rank_file(rank)
        path.parent.mkdir(parents=True, exist_ok=True)
        raw = [_raw(line) for line in lines]
        with open(path, "ab") as fh:
            fh.write(b"\n".join(raw) + end)
        return path

    return write


def _raw(line: bytes | str | dict) -> bytes:
    if isinstance(line, dict):
        return json.dumps(line, separators=(",", ":")).encode()
    return line.encode() if isinstance(line, str) else line


@pytest.fixture
def ingest() -> Iterator[Callable[..., Store]]:
    """Ingest everything present in a run into RUN/bedside.duckdb with a new Collector (options passed
    on); the store stays open for the test, and a second call ingests into the same store."""
    stores: dict[Path, Store] = {}

    def run(run_dir: Path, **collector_options) -> Store:
        if run_dir not in stores:
            stores[run_dir] = Store.open(RunLayout(run_dir).store)
        Collector(run_dir, stores[run_dir], **collector_options).ingest_available()
        return stores[run_dir]

    yield run
    for store in stores.values():
        store.close()


def _cli(*args: str | Path) -> list[str]:
    return [sys.executable, "-m", "bedside.app.cli", *map(str, args)]


@pytest.fixture(scope="session")
def bedside() -> Iterator[Callable[..., subprocess.CompletedProcess]]:
    """Run the real ``bedside`` CLI in a new process and wait for it (text output captured): forked from a process
    that has imported its libraries (``cli_zygote``), or a new interpreter where the environment differs."""
    zygote = cli_zygote.Zygote()

    def run(
        *args: str | Path, timeout: float = CLI_TIMEOUT_S, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess:
        """``env`` adds to (or overrides) this process's environment."""
        if env is None and (done := zygote.run([str(arg) for arg in args], timeout)) is not None:
            return done
        return subprocess.run(
            _cli(*args), capture_output=True, text=True, timeout=timeout, env={**os.environ, **env} if env else None
        )

    yield run
    zygote.close()


@contextmanager
def bedside_processes() -> Iterator[Callable[..., subprocess.Popen]]:
    """Start the real ``bedside`` CLI in the background (Popen options passed on); killed on leaving."""
    started: list[subprocess.Popen] = []

    def start(*args: str | Path, **popen_options) -> subprocess.Popen:
        started.append(subprocess.Popen(_cli(*args), **popen_options))
        return started[-1]

    try:
        yield start
    finally:
        for process in started:
            if process.poll() is None:
                process.kill()
            process.wait()


@pytest.fixture
def start_bedside() -> Iterator[Callable[..., subprocess.Popen]]:
    """``bedside_processes`` for one test."""
    with bedside_processes() as start:
        yield start


@pytest.fixture(scope="session")
def record() -> Callable[..., dict]:
    """A format v1 record with a valid envelope (rank 0, step 1, timeline 0, seq 0) and ``fields``."""

    def build(kind: str, **fields) -> dict:
        return {"kind": kind, "time": 1_700_000_000.0, "rank": 0, "step": 1, "timeline": 0, "seq": 0, **fields}

    return build


@pytest.fixture(scope="session")
def read_records() -> Callable[[Path], list[dict]]:
    """Every line of a JSONL file, parsed."""

    def read(path: Path) -> list[dict]:
        return [json.loads(line) for line in path.read_text().splitlines()]

    return read


def copy_of_tiny_faults(parent: Path, collected: Path | None = None) -> Path:
    """A private copy of sample_runs/tiny-faults in ``parent`` with its control key: without a store, or as
    ``collected`` (a copy that ``bedside collect`` ingested) left it."""
    source, ignore = (collected, None) if collected else (TINY_FAULTS, shutil.ignore_patterns("bedside.duckdb*"))
    run = Path(shutil.copytree(source, parent / "tiny-faults", ignore=ignore))
    ensure_control_key(RunLayout(run))  # as its trainer did when it started: requests can be signed
    return run


@pytest.fixture
def tiny_faults(tmp_path: Path) -> Path:
    """A private copy of sample_runs/tiny-faults (2 ranks, a bad shard, a straggler, bit flips, a NaN), no store."""
    return copy_of_tiny_faults(tmp_path)


@pytest.fixture(scope="session")
def _tiny_faults_collected(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = copy_of_tiny_faults(tmp_path_factory.mktemp("collected"))
    subprocess.run(_cli("collect", run, "--quiet"), check=True, capture_output=True, timeout=CLI_TIMEOUT_S)
    return run


@pytest.fixture
def collected_tiny_faults(_tiny_faults_collected: Path, tmp_path: Path) -> Path:
    """``tiny_faults`` as ``bedside collect`` left it (every line ingested, detection run, the store closed): a
    private copy of a store collected once per test process."""
    return copy_of_tiny_faults(tmp_path / "collected", _tiny_faults_collected)


@pytest.fixture
def control_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> RunLayout:
    """A live run's folder as the trainer leaves it, before any telemetry: run.json, the control key and an empty
    ``control/requests/``; no key in the environment."""
    monkeypatch.delenv(KEY_ENV, raising=False)
    layout = RunLayout(tmp_path / "run")
    layout.control_requests.mkdir(parents=True)
    write_run_info(layout, RunInfo(name="run", world_size=2))
    ensure_control_key(layout)
    return layout


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    """A real HTTP receiver on 127.0.0.1 (tests/receiver.py), closed after the test."""
    server = Receiver()
    yield server
    server.close()


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Iterator[Path]:
    """A directory with copies of both sample runs for the dashboard; the desk serving it lives for the module."""
    from dashboard_app import FAULTS, REWIND, copy_run

    from bedside.app.dashboard import registry

    folder = tmp_path_factory.mktemp("runs")
    copy_run(FAULTS, folder)
    copy_run(REWIND, folder)
    yield folder
    registry.close_all()


@pytest.fixture(scope="module")
def clean_runs(tmp_path_factory) -> Path:
    """A directory with one run that has nothing to find (``dashboard_app.clean_run``)."""
    from dashboard_app import clean_run

    folder = tmp_path_factory.mktemp("clean")
    clean_run(folder)
    return folder


@pytest.fixture
def served(runs: Path) -> Path:
    """The dashboard pointed at the directory of runs, without an operator token."""
    from dashboard_app import serve

    serve(runs)
    return runs
