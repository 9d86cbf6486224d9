"""A generated dataset read directly by the detectors: ``detect(**simulate(config).frames())`` sees what the
service sees once ``bedside simulate``'s run directory is written and ingested, and finds the same.

The written files round ``rank_step`` timings and local gradient norms to 6 significant digits and their
times to the microsecond, so the frames agree to that precision and the findings' scores to about 1e-7;
everything else (ids, kinds, steps, ranks, severity, whether active, the evidence's keys) agrees exactly.
A finding that sits exactly on a threshold can still fall either side of it: a hang whose ``timeout_s``
equals the hang detector's ``min_seconds`` (60 s) puts the peers' ``run_end`` on the threshold itself,
past it only once the written times are rounded, so the hangs here time out after the default 600 s.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pandas as pd
import pytest

from bedside.app.service.detection import detect_run
from bedside.app.service.feed import StoreFeed
from bedside.app.service.schema import SCHEMAS
from bedside.app.simulation import SimulationConfig, simulate_run
from bedside.collectors.layout import RunLayout
from bedside.collectors.store import Store
from bedside.detectors import detect
from bedside.detectors.datasets import simulate
from bedside.detectors.finding import Finding

CONFIGS = {
    "gaussian, 8 ranks on 2 hosts, a hang": SimulationConfig(
        ranks=8,
        steps=300,
        seed=7,
        ranks_per_host=4,
        inject=(
            "spike:step=120,sigma=12,shape=grad_leading,lead=4",
            "nan:rank=1,step=150",
            "straggler:host=1,factor=1.3,from=200,steps=30",
            "sdc_grad:rank=2,step=240,scale_log2=10",
            "hang:rank=6,step=290",
        ),
    ),
    "student, 8 ranks x 2 stages, a resume": SimulationConfig(
        ranks=8,
        steps=400,
        seed=3,
        pp=2,
        ranks_per_host=4,
        noise="student",
        inject=(
            "straggler:rank=3,factor=1.5,from=200,steps=40",
            "sdc_grad:rank=2,step=300,scale_log2=10",
            "param_corrupt:rank=5,step=133",
        ),
    ),
    "lognormal, 8 ranks, job-wide faults": SimulationConfig(
        ranks=8,
        steps=300,
        seed=5,
        noise="lognormal",
        inject=("bad_shard:shards=3-4,from=1", "eval_stall:from=150", "throughput_drop:from=250,factor=0.8"),
    ),
    "2 ranks, no nuisances": SimulationConfig(
        ranks=2,
        steps=150,
        seed=11,
        nuisances=False,
        inject=("spike:step=100,sigma=20,shape=divergent", "sdc_quiet:rank=1,step=60"),
    ),
    "16 ranks x 4 stages, odd cadences": SimulationConfig(
        ranks=16, steps=60, seed=9, pp=4, ranks_per_host=3, eval_every=7, checkpoint_every=11, checksum_every=3
    ),
    "3 ranks, hung at step 2": SimulationConfig(ranks=3, steps=5, inject=("hang:rank=1,step=2",)),
}
FRAMES = ("steps", "rank_steps", "evals", "checkpoints", "events")
WRITTEN_DIGITS = 1e-5
"""Relative precision of the written files' numbers (6 significant digits, and times to the microsecond)."""


@dataclass(frozen=True)
class Served:
    """A simulated run as the service sees it: written, ingested and detected over in batch mode."""

    config: SimulationConfig
    findings: list[Finding]
    frames: dict[str, Any]


@pytest.fixture(scope="module", params=list(CONFIGS), ids=list(CONFIGS))
def served(request, tmp_path_factory) -> Served:
    config = CONFIGS[request.param]
    run_dir = tmp_path_factory.mktemp("dataset") / "run"
    simulate_run(config, run_dir)
    findings = detect_run(run_dir)
    with Store.open(RunLayout(run_dir).store, schemas=SCHEMAS) as store:
        feed = StoreFeed(store)
        batch = feed.next_batch()
        assert not feed.behind
        frames = {name: getattr(batch, name) for name in FRAMES}
        frames |= {"topology": feed.topology(), "world_size": feed.world_size()}
    return Served(config, findings, frames)


def test_the_frames_are_those_the_store_feed_gives(served: Served) -> None:
    frames = simulate(served.config).frames()
    assert frames.keys() == served.frames.keys()
    for name in FRAMES:
        pd.testing.assert_frame_equal(
            frames[name], served.frames[name], check_exact=False, rtol=WRITTEN_DIGITS, atol=0, obj=name
        )
    pd.testing.assert_frame_equal(frames["topology"], served.frames["topology"], check_exact=True)
    assert frames["world_size"] == served.frames["world_size"] == served.config.ranks


def test_the_detectors_find_on_the_frames_what_the_service_finds_on_the_run(served: Served) -> None:
    found = detect(**simulate(served.config).frames()).findings
    assert served.findings, "no finding to compare: the agreement would prove little"
    assert [_identity(f) for f in found] == [_identity(f) for f in served.findings]
    assert [f.score for f in found] == pytest.approx([f.score for f in served.findings], rel=1e-6)


def test_the_frames_of_a_run_that_hangs_stop_where_its_files_stop() -> None:
    run = simulate(CONFIGS["gaussian, 8 ranks on 2 hosts, a hang"])
    frames = run.frames()
    assert frames["steps"]["step"].max() == frames["rank_steps"]["step"].max() == run.config.last_step == 289
    ends = frames["events"][frames["events"]["kind"] == "run_end"]
    assert sorted(ends["rank"]) == [0, 1, 2, 3, 4, 5, 7]


def test_the_frames_of_a_resumed_run_hold_its_restart() -> None:
    run = simulate(CONFIGS["student, 8 ranks x 2 stages, a resume"])
    frames, resume = run.frames(), run.nuisances.resume
    assert resume is not None
    assert frames["checkpoints"].query("event == 'loaded'")["step"].tolist() == [resume]
    restarted = frames["events"].query("kind == 'rank_info' and step > 0")
    assert sorted(restarted["rank"]) == list(range(8)) and set(restarted["step"]) == {resume}


def _identity(finding: Finding) -> tuple[Any, ...]:
    """What must agree exactly: which finding, where, how bad, whether it lasts, and what its evidence holds."""
    return (
        finding.finding_id,
        finding.kind,
        finding.timeline,
        finding.start_step,
        finding.end_step,
        finding.ranks,
        finding.severity,
        finding.active,
        sorted(finding.evidence),
    )
