"""A pass costs what changed, not how many rank files the run has.

What the collector opens and lists is seen through Python's audit hooks (``open``, ``os.listdir``,
``os.scandir``): the real calls of the real collector and follower, recorded while a test asks.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from test_follow import following  # the Follower in a thread of the test

from bedside.collectors.batch import Chunk, lines_table
from bedside.collectors.ingest import Collector
from bedside.collectors.layout import RunLayout
from bedside.collectors.store import Store

FILES = 40
EVENTUALLY_S = 10.0
_seen: list[tuple[str, str]] | None = None


def _audit(event: str, args: tuple) -> None:
    if _seen is not None and event in ("open", "os.listdir", "os.scandir") and args and args[0] is not None:
        _seen.append((event, str(args[0])))


sys.addaudithook(_audit)


@contextmanager
def file_calls(folder: Path) -> Iterator[list[tuple[str, str]]]:
    """The opens and listings of ``folder`` and the files in it while the block runs (any thread)."""
    global _seen
    _seen, calls = [], []
    try:
        yield calls
    finally:
        seen, _seen = _seen, None
        calls.extend((event, path) for event, path in seen if path.startswith(str(folder)))


def opened(calls: list[tuple[str, str]]) -> set[str]:
    return {Path(path).name for event, path in calls if event == "open"}


def listed(calls: list[tuple[str, str]]) -> bool:
    return any(event != "open" for event, _ in calls)


@pytest.fixture
def many_ranks(run_dir: Path, write_lines: Callable[..., Path], record: Callable[..., dict]) -> RunLayout:
    for rank in range(FILES):
        write_lines([record("rank_step", rank=rank, metrics={"step_time": 0.3})], rank=rank)
    return RunLayout(run_dir)


def test_the_lines_of_many_files_share_one_record_batch() -> None:
    chunks = [Chunk(rank + 1, rank, 100 * rank, f'{{"n":{rank}}}\n{{"m":{rank}}}\n'.encode()) for rank in range(500)]
    table, rejected = lines_table(chunks)
    assert table.column("line").num_chunks == 1 and rejected == []
    assert table.num_rows == 1000
    assert table.slice(998).to_pylist() == [
        {"source_id": 500, "file_rank": 499, "line_offset": 49_900, "line": '{"n":499}\n'},
        {"source_id": 500, "file_rank": 499, "line_offset": 49_910, "line": '{"m":499}\n'},
    ]


def test_a_pass_opens_only_the_files_that_grew(
    many_ranks: RunLayout, write_lines: Callable[..., Path], record: Callable[..., dict]
) -> None:
    with Store.open(many_ranks.store) as store:
        collector = Collector(many_ranks.root, store)
        assert collector.ingest_available().lines == FILES
        with file_calls(many_ranks.telemetry) as nothing_new:
            assert collector.ingest_available().bytes == 0
        for rank in (3, 7):
            write_lines([record("rank_step", rank=rank, step=2, metrics={"step_time": 0.3})], rank=rank)
        with file_calls(many_ranks.telemetry) as two_grew:
            assert collector.ingest_available().lines == 2
    assert opened(nothing_new) == set()
    assert opened(two_grew) == {"rank-00003.jsonl", "rank-00007.jsonl"}


def wait_for_rows(store: Store, rows: int) -> None:
    cursor = store.cursor()
    deadline = time.monotonic() + EVENTUALLY_S
    while cursor.execute("SELECT count(*) FROM rank_steps").fetchone()[0] < rows:
        assert time.monotonic() < deadline, f"fewer than {rows} rank_steps rows in the store"
        time.sleep(0.02)


def test_between_rescans_the_follower_looks_only_at_the_files_that_events_name(
    many_ranks: RunLayout, write_lines: Callable[..., Path], record: Callable[..., dict]
) -> None:
    with following(many_ranks.root, rescan_every_s=60.0) as store:
        wait_for_rows(store, FILES)
        with file_calls(many_ranks.telemetry) as calls:
            write_lines([record("rank_step", rank=5, step=2, metrics={"step_time": 0.3})], rank=5)
            wait_for_rows(store, FILES + 1)
            time.sleep(0.2)  # a pass that would follow the first one
    assert opened(calls) == {"rank-00005.jsonl"}
    assert not listed(calls)


def test_a_new_rank_file_between_rescans_is_found_by_its_event(
    many_ranks: RunLayout, write_lines: Callable[..., Path], record: Callable[..., dict]
) -> None:
    with following(many_ranks.root, rescan_every_s=60.0) as store:
        wait_for_rows(store, FILES)
        write_lines([record("rank_step", rank=FILES, metrics={"step_time": 0.3})], rank=FILES)
        wait_for_rows(store, FILES + 1)
