"""Exactly-once under kill -9: the collector dies at random moments and resumes where it was.

A 4-rank run is pre-written as format-v1 JSON lines (with malformed lines and a torn
last line in every file); ``bedside collect`` is then killed again and again, in
batch mode while more data lands between runs and in follow mode while RunLogger
processes append. After every kill the store must be a consistent prefix of the
files; after a last clean run, every line is in the store exactly once.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pytest

from bedside.collectors import failpoints
from bedside.collectors.appendfile import AppendFile
from bedside.collectors.layout import RunLayout, rank_of_file
from bedside.collectors.runinfo import RunInfo, write_run_info
from bedside.collectors.store import Store

pytestmark = pytest.mark.slow(
    reason="SIGKILLs `bedside collect` 8 times over 4 ranks x 20,000 lines; every restart pays Python's and DuckDB's start"
)

WORLD = 4
PREWRITTEN_LINES = 10_000
APPENDED_LINES = 10_000
BATCH_KILLS = int(os.environ.get("BEDSIDE_HARNESS_COLLECT_KILLS", "6"))  # bench/harness.py --long raises these
FOLLOW_KILLS = int(os.environ.get("BEDSIDE_HARNESS_FOLLOW_KILLS", "2"))
WRITER_STEPS = 300
SEED = 20240611
ROW_TABLES = ("steps", "rank_steps", "evals", "checkpoints", "actions", "events", "faults")
RANK_STEP = (
    '{{"kind":"rank_step","time":{time},"rank":{rank},"step":{step},"timeline":0,"seq":{seq},'
    '"metrics":{{"step_time":0.1,"compute_time":0.07,"comm_time":0.02,"tokens_per_s":{tps}}}}}\n'
)


def malformed_lines(rank: int) -> tuple[bytes, ...]:
    """Lines the collector must reject, each for one reason only (the rank is the file's)."""
    return (
        b"not json at all\n",
        b"\n",
        b"[1, 2, 3]\n",
        b"\xff\xfe not UTF-8\n",
        b'{"kind":"rank_step","time":1.0,"rank":%d,"step":1,"timeline":0,"seq":1,"metrics":{"comm_time":"x"}}\n' % rank,
        b'{"kind":"rank_step","time":1.0,"rank":%d,"step":-1,"timeline":0,"seq":0,"metrics":{}}\n' % rank,
        b'{"kind":"eval","time":1.0,"rank":%d,"step":1,"timeline":0,"seq":0}\n' % rank,
    )


WRITER = f"""
import sys, time
from bedside.collectors.writer import RunLogger
logs = [RunLogger(sys.argv[1], rank=r, world_size={WORLD}, resume=True, timeline=0, flush_every_s=0.02) for r in range({WORLD})]
for step in range({WRITER_STEPS}):
    for log in logs:
        log.rank_step(step, step_time=0.01, compute_time=0.007)
    time.sleep(0.002)
for log in logs:
    log.close()
"""


# -- writing the run ---------------------------------------------------------------


def block(rank: int, first_seq: int, count: int, rng: random.Random) -> bytes:
    """``count`` lines for rank ``rank``'s file, about 1 in 500 malformed; ``seq`` is the line number."""
    lines = []
    for i in range(count):
        seq = first_seq + i
        if rng.random() < 0.002:
            lines.append(rng.choice(malformed_lines(rank)))
        else:
            tps = rng.uniform(1e4, 1e5)
            lines.append(RANK_STEP.format(time=1.7e9 + seq, rank=rank, step=seq, seq=seq, tps=tps).encode())
    return b"".join(lines)


def append_blocks(run: Path, count: int, rng: random.Random) -> None:
    """Append ``count`` lines to every rank file, ending with a torn line (a writer killed mid-line).

    AppendFile first ends the torn line left by the previous block, which makes it one
    malformed line, exactly as the writer does when a rank restarts."""
    for rank in range(WORLD):
        out = AppendFile(RunLayout(run).rank_file(rank))
        data = block(rank, out.next_seq, count, rng)
        out.write(data + RANK_STEP.format(time=1.0, rank=rank, step=0, seq=0, tps=1.0)[:40].encode())
        out.close()


def make_run(tmp_path: Path, rng: random.Random, lines: int = PREWRITTEN_LINES) -> Path:
    run = tmp_path / "run"
    write_run_info(RunLayout(run), RunInfo(name="crash", world_size=WORLD))
    append_blocks(run, lines, rng)
    return run


# -- the collector process and killing it ----------------------------------------


def start_collect(run: Path, log: Path, *extra: str, die_before_commit: int = 0) -> subprocess.Popen:
    """``bedside collect RUN`` in 1 MiB batches; ``die_before_commit``: it kills itself (SIGKILL) with the rows of
    its Nth write transaction in and the COMMIT not run (``collectors/failpoints.py``)."""
    args = ["collect", str(run), "--batch-mb", "1", "--quiet", *extra]
    env = {**os.environ, failpoints.ENV: f"store.commit={die_before_commit}"} if die_before_commit else None
    with open(log, "ab") as err:
        return subprocess.Popen([sys.executable, "-m", "bedside.app.cli", *args], stderr=err, env=env)


def wait_until_store_open(proc: subprocess.Popen, store: Path, timeout: float = 60.0) -> None:
    """Return once ``proc`` holds the store open (or has exited), so kills land past start-up."""
    fds, target = Path(f"/proc/{proc.pid}/fd"), os.path.realpath(store)
    deadline = time.monotonic() + timeout
    while proc.poll() is None and time.monotonic() < deadline:
        try:
            if any(os.readlink(fd) == target for fd in fds.iterdir()):
                return
        except OSError:  # no /proc here, or a descriptor closed while we looked
            if not fds.parent.exists():
                return
        time.sleep(0.005)


def wait_until_committing(proc: subprocess.Popen, store: Path, timeout: float = 60.0) -> None:
    """Return once ``proc`` has committed rows to the store's write-ahead log (which opening the store emptied):
    batches are going in one after another, so a kill now lands inside ingestion, not before or after it."""
    wal = store.with_name(store.name + ".wal")
    deadline = time.monotonic() + timeout
    while proc.poll() is None and time.monotonic() < deadline:
        if wal.exists() and wal.stat().st_size > 0:
            return
        time.sleep(0.002)


def kill_at_random(proc: subprocess.Popen, run: Path, rng: random.Random, *, mid_ingest: bool = False) -> bool:
    """SIGKILL ``proc`` 0.05-1 s after it opened the store, or (``mid_ingest``) 0-0.2 s after its first commit;
    True when it was still running."""
    wait_until_store_open(proc, RunLayout(run).store)
    if mid_ingest:
        wait_until_committing(proc, RunLayout(run).store)
    time.sleep(rng.uniform(0.0, 0.2) if mid_ingest else rng.uniform(0.05, 1.0))
    proc.send_signal(signal.SIGKILL)
    code = proc.wait(timeout=60)
    assert code in (0, -signal.SIGKILL), f"collector failed on its own with exit code {code}"
    return code == -signal.SIGKILL


# -- what the store holds --------------------------------------------------------


@dataclass(frozen=True)
class StoredSource:
    source_id: int
    path: str
    committed: int
    lines: int
    rejected: int


KEY_TABLES = ROW_TABLES + ("rejected_lines",)
KEYS_OF_SOURCE = "SELECT line_offset FROM ({}) ORDER BY line_offset".format(
    " UNION ALL ".join(f"SELECT line_offset FROM {t} WHERE source_id = ?" for t in KEY_TABLES)
)


def line_starts(data: bytes) -> np.ndarray:
    ends = np.flatnonzero(np.frombuffer(data, dtype=np.uint8) == 10)
    return np.concatenate(([0], ends[:-1] + 1)).astype(np.int64) if len(ends) else np.empty(0, np.int64)


def stored_sources(cur) -> list[StoredSource]:
    rows = cur.execute("SELECT source_id, path, committed_offset, lines, rejected FROM sources").fetchall()
    return [StoredSource(*row) for row in rows]


def check_source(run: Path, cur, source: StoredSource) -> None:
    """The store holds exactly the lines before the committed offset, each once."""
    data = (run / source.path).read_bytes()[: source.committed]
    assert source.committed == 0 or data.endswith(b"\n"), f"{source.path}: offset inside a line"
    offsets = cur.execute(KEYS_OF_SOURCE, [source.source_id] * len(KEY_TABLES)).fetchnumpy()["line_offset"]
    assert np.array_equal(offsets, line_starts(data)), f"{source.path}: rows are not the committed lines, once each"
    rejected = cur.execute("SELECT count(*) FROM rejected_lines WHERE source_id = ?", [source.source_id]).fetchall()
    assert (source.lines, source.rejected) == (len(offsets) - rejected[0][0], rejected[0][0]), source.path


def check_consistent(run: Path) -> int:
    """Check the store after a crash; return the bytes it has committed in all."""
    path = RunLayout(run).store
    if not path.exists():
        return 0
    with Store.open(path, read_only=True) as store:
        if store.schema_version() == 0:
            return 0
        cur = store.cursor()
        sources = stored_sources(cur)
        for source in sources:
            check_source(run, cur, source)
        return sum(s.committed for s in sources)


# -- what the files hold -----------------------------------------------------------


def expected_records(run: Path) -> tuple[Counter, Counter]:
    """(rank, seq) of every valid line, and rejected lines per file, read from the files."""
    valid, rejected = Counter(), Counter()
    for path in RunLayout(run).source_files():
        for line in path.read_bytes().split(b"\n")[:-1]:
            record = parse(line, rank_of_file(path))
            if record is None:
                rejected[RunLayout(run).relative(path)] += 1
            else:
                valid[(record["rank"], record["seq"])] += 1
    return valid, rejected


def parse(line: bytes, rank: int) -> dict | None:
    """The record on ``line`` of rank ``rank``'s file, None for a line this test wrote as malformed."""
    if line + b"\n" in malformed_lines(rank):
        return None
    try:
        record = json.loads(line)
    except ValueError:
        return None
    return record if isinstance(record, dict) else None


def assert_all_once(run: Path) -> None:
    valid, rejected = expected_records(run)
    assert max(valid.values()) == 1, "the test wrote a (rank, seq) twice"
    files = {RunLayout(run).relative(p): p.stat().st_size for p in RunLayout(run).source_files()}
    with Store.open(RunLayout(run).store, read_only=True) as store:
        cur = store.cursor()
        sources = stored_sources(cur)
        assert {s.path: s.committed for s in sources} == files
        stored = cur.execute("SELECT rank, seq FROM rank_steps UNION ALL SELECT rank, seq FROM events").fetchall()
        assert Counter(stored) == valid
        assert {s.path: s.rejected for s in sources} == {path: rejected[path] for path in files}
        assert cur.execute("SELECT count(*) FROM rejected_lines").fetchall() == [(sum(rejected.values()),)]
        for source in sources:
            check_source(run, cur, source)


# -- the test ----------------------------------------------------------------------


def complete_bytes(run: Path) -> int:
    """Bytes of complete lines in the run's files (what a finished collect commits)."""
    return sum(p.read_bytes().rfind(b"\n") + 1 for p in RunLayout(run).source_files())


class Outcome(NamedTuple):
    """One collect run of the crash loop: whether it was killed, and the bytes committed around it."""

    killed: bool
    before: int
    after: int
    complete: int

    @property
    def interrupted(self) -> bool:
        return self.killed and self.after < self.complete


def batch_crashes(run: Path, log: Path, rng: random.Random) -> list[Outcome]:
    """Kill ``bedside collect`` repeatedly while data keeps arriving between runs: every other run from outside
    at a random moment of its ingestion, the others from inside, just before one of its first commits, the
    narrowest window there is (the rows of a batch in, its offsets and COMMIT not yet)."""
    outcomes, before = [], 0
    for kill in range(BATCH_KILLS):
        append_blocks(run, APPENDED_LINES, rng)
        if kill % 2:
            proc = start_collect(run, log, die_before_commit=rng.randint(2, 6))
            killed = proc.wait(timeout=120) == -signal.SIGKILL
        else:
            killed = kill_at_random(start_collect(run, log), run, rng, mid_ingest=True)
        after = check_consistent(run)
        assert after >= before, "committed offsets went backwards"
        outcomes.append(Outcome(killed, before, after, complete_bytes(run)))
        before = after
    return outcomes


def follow_crashes(run: Path, log: Path, rng: random.Random) -> None:
    """Kill ``bedside collect --follow`` while four RunLogger ranks append."""
    for _ in range(FOLLOW_KILLS):
        writer = subprocess.Popen([sys.executable, "-c", WRITER, str(run)])
        kill_at_random(start_collect(run, log, "--follow", "--rescan-every", "0.2"), run, rng)
        assert writer.wait(timeout=120) == 0
        check_consistent(run)


def test_collector_killed_at_random_ingests_every_line_exactly_once(tmp_path: Path) -> None:
    rng = random.Random(SEED)
    run = make_run(tmp_path, rng)
    log = tmp_path / "collect.log"
    outcomes = batch_crashes(run, log, rng)
    follow_crashes(run, log, rng)
    final = start_collect(run, log)
    assert final.wait(timeout=120) == 0, log.read_text(errors="replace")
    assert_all_once(run)
    assert "warning" not in log.read_text(errors="replace")
    interrupted = sum(o.interrupted for o in outcomes)
    assert interrupted >= min(4, BATCH_KILLS), f"too few kills landed inside ingestion: {outcomes}"


@pytest.mark.slow(reason="eight `bedside collect` runs, six of them killed before their 1st to 6th commit")
def test_a_collect_killed_before_each_of_its_commits_in_turn_repeats_and_loses_nothing(tmp_path: Path) -> None:
    """The random kills above land in the window between a batch's rows and its offsets only by chance; here each
    of a collect's first commits is the one it dies before, in turn (new lines arrive before each run, three
    batches' worth), so a batch whose rows and offsets were committed apart is always caught between the two."""
    rng = random.Random(SEED)
    run = make_run(tmp_path, rng, lines=1_000)
    log = tmp_path / "collect.log"
    assert start_collect(run, log).wait(timeout=120) == 0  # the store made: its migrations are not counted below
    for commit in range(1, 7):
        append_blocks(run, 3_000, rng)
        assert start_collect(run, log, die_before_commit=commit).wait(timeout=120) in (0, -signal.SIGKILL)
    for rank in range(WORLD):  # the writers come back: opening a file ends its torn line
        AppendFile(RunLayout(run).rank_file(rank)).close()
    assert start_collect(run, log).wait(timeout=120) == 0, log.read_text(errors="replace")
    assert_all_once(run)
