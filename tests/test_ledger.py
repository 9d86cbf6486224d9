"""The ledger across runs: the hosts that a runs directory's incidents name, counted per host, with how few hosts
account for half of the evictions; over simulated runs whose slow hosts are known, through the CLI and the
dashboard's Runs page."""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pandas as pd
import pytest
from dashboard_app import open_page, serve

from bedside.app.cli import main as cli
from bedside.app.dashboard import registry
from bedside.app.dashboard.ledger import concentration, host_ledger

SLOW = {"run-a": 1, "run-b": 1, "run-c": 2}
"""Each run's slow host (simulated: 24 ranks, 8 per host, host k holds ranks 8k to 8k+7)."""


@pytest.fixture(scope="module")
def runs_dir(tmp_path_factory) -> Path:
    """Three simulated runs, their incidents found by ``bedside detect`` (in this process: three CLI starts
    would cost more than the runs)."""
    folder = tmp_path_factory.mktemp("runs")
    for seed, (name, host) in enumerate(SLOW.items()):
        first = 8 * host
        fault = f"straggler:ranks={first}-{first + 7},factor=1.6,from=200"
        args = ["simulate", "--ranks", "24", "--steps", "320", "--seed", str(seed), "--no-nuisances"]
        with redirect_stdout(io.StringIO()), redirect_stderr(io.StringIO()):
            assert cli([*args, "--out", str(folder / name), "--inject", fault]) == 0
            assert cli(["detect", str(folder / name)]) == 0
    return folder


def ledger_of(bedside: Callable, runs_dir: Path, *extra: str) -> tuple[pd.DataFrame, str]:
    done = bedside("ledger", runs_dir, "--format", "json", *extra)
    assert done.returncode == 0, done.stderr
    return pd.DataFrame(json.loads(done.stdout)), done.stderr


def test_the_ledger_counts_each_slow_host_once_per_run_and_says_how_concentrated_it_is(
    bedside: Callable, runs_dir: Path
) -> None:
    table, said = ledger_of(bedside, runs_dir)
    assert list(table["host"]) == ["node-0001", "node-0002"]
    assert list(table["runs"]) == [2, 1] and list(table["evictions"]) == [2, 1]
    assert table["ranks"].iloc[0] == ", ".join(str(r) for r in range(8, 16))
    assert said.strip() == "1 of 3 hosts account for half of all evictions (3), over the newest 3 runs"


def test_the_ledger_reads_only_the_newest_runs(bedside: Callable, runs_dir: Path) -> None:
    newest = max(runs_dir.iterdir(), key=lambda p: p.stat().st_mtime)
    table, said = ledger_of(bedside, runs_dir, "--last", "1")
    assert list(table["host"]) == [f"node-000{SLOW[newest.name]}"] and "newest 1 runs" in said


@pytest.mark.parametrize(
    ("counts", "said"),
    [
        ([5, 3, 1, 1], "1 of 10 hosts account for half of all evictions (10)"),
        ([2, 2, 2, 2], "2 of 10 hosts account for half of all evictions (8)"),
        ([0, 0], "1 of 10 hosts account for half of all incidents (2)"),
    ],
)
def test_concentration_is_the_fewest_hosts_that_hold_half(counts: list[int], said: str) -> None:
    ledger = pd.DataFrame({"host": [f"h{i}" for i in range(len(counts))], "evictions": counts, "incidents": 1})
    assert concentration(ledger, 10) == said


def test_an_empty_directory_of_incidents_gives_an_empty_ledger() -> None:
    assert host_ledger({"quiet": pd.DataFrame(columns=["incident_id", "rank", "host", "evict", "kinds"])}).empty
    assert concentration(host_ledger({}), 3) is None


def test_the_runs_page_shows_the_ledger(runs_dir: Path) -> None:
    serve(runs_dir)
    try:
        app = open_page("runs")
        [shown] = [d.value for d in app.dataframe if "evictions" in d.value.columns]
        assert list(shown["host"]) == ["node-0001", "node-0002"]
        assert any(c.value.startswith("1 of 3 hosts account for half of all evictions (3)") for c in app.caption)
    finally:
        registry.close_all()
