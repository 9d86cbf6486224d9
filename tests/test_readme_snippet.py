"""The README's loop snippets run as written: the RunLogger loop alone, under two torchrun ranks, and refusing a
rerun; the kit's loop on two ranks with every signal the detectors read and a control reader."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from bedside.collectors.ingest import Collector
from bedside.collectors.store import Store

pytestmark = pytest.mark.slow(reason="the README's snippets run as written, one of them on two torchrun ranks")

ROOT = Path(__file__).resolve().parents[1]
STEPS = 200


LOOP, KIT_LOOP = "## Instrument your training loop", "### Every signal, and actions from the dashboard: the kit"


def snippet(heading: str = LOOP) -> str:
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index(heading) :]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match, f"the README's section {heading!r} has no python block"
    return match.group(1)


def run_snippet(folder: Path, ranks: int, heading: str = LOOP) -> subprocess.CompletedProcess[str]:
    script = folder / "loop.py"
    script.write_text(snippet(heading))
    launch = (
        [sys.executable]
        if ranks == 1
        else [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}"]
    )
    return subprocess.run(
        [*launch, str(script)],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )


@pytest.mark.parametrize("ranks", [1, 2])
def test_the_snippet_writes_one_job_step_and_every_rank_s_steps(tmp_path: Path, ranks: int) -> None:
    done = run_snippet(tmp_path, ranks)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "warn" not in done.stderr.lower(), done.stderr[-3000:]
    run = tmp_path / "runs" / "my-run"
    store = Store.open(run / "bedside.duckdb")
    try:
        Collector(run, store).ingest_available()
        cursor = store.cursor()
        steps = cursor.execute("SELECT count(*), sum(tokens), count(grad_norm) FROM step_metrics").fetchone()
        assert steps == (STEPS, 32 * STEPS, STEPS)  # tokens counted once, not once per rank
        per_rank = cursor.execute("SELECT rank, count(*) FROM rank_step_metrics GROUP BY rank ORDER BY rank").fetchall()
        assert per_rank == [(rank, STEPS) for rank in range(ranks)]
    finally:
        store.close()


def test_running_the_snippet_again_into_its_run_is_refused_with_the_way_out(tmp_path: Path) -> None:
    assert run_snippet(tmp_path, 1).returncode == 0
    again = run_snippet(tmp_path, 1)
    assert again.returncode != 0
    assert "resume=True" in again.stderr, again.stderr[-3000:]


def test_the_kit_snippet_records_every_signal_on_two_ranks_and_reads_control_requests(tmp_path: Path) -> None:
    done = run_snippet(tmp_path, 2, KIT_LOOP)
    assert done.returncode == 0, done.stderr[-3000:]
    run = tmp_path / "runs" / "my-kit-run"
    store = Store.open(run / "bedside.duckdb")
    try:
        Collector(run, store).ingest_available()
        cursor = store.cursor()
        assert cursor.execute("SELECT count(*), count(loss) FROM step_metrics").fetchone() == (STEPS, STEPS)
        per_rank = cursor.execute(
            "SELECT rank, count(*), count(local_grad_norm), count(compute_time), count(param_checksum)"
            " FROM rank_step_metrics GROUP BY rank ORDER BY rank"
        ).fetchall()
        assert per_rank == [(rank, STEPS, STEPS, STEPS, STEPS // 10) for rank in range(2)]
        disagreeing = cursor.execute(
            "SELECT count(*) FROM (SELECT step FROM rank_step_metrics WHERE param_checksum IS NOT NULL"
            " GROUP BY step HAVING count(DISTINCT param_checksum) > 1)"
        ).fetchone()
        assert disagreeing == (0,)  # DDP replicas agree bit for bit
        assert cursor.execute("SELECT beats > 0 FROM control_reader").fetchone() == (True,)
    finally:
        store.close()
