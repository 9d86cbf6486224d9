"""Scoring findings against ground truth: the margin, ranks, delay, culprit, false alarms, the per-kind table,
and the demo's scorecard over the recorded sample run."""

from __future__ import annotations

import dataclasses
import json
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from bedside.app.service.detection import detect_store
from bedside.app.service.schema import SCHEMAS
from bedside.app.service.scorecard import demo_scorecard
from bedside.collectors.ingest import Collector
from bedside.collectors.store import Store
from bedside.detectors.faults import SIMULATED_FAULTS, TRAINER_FAULTS, FaultType, Label, Window
from bedside.detectors.finding import FINDING_KINDS
from bedside.detectors.scoring import (
    FINDING_COLUMNS,
    Margin,
    false_alarms,
    labels_of,
    match,
    precision_recall,
    why_missed,
)

SAMPLE_RUN = Path(__file__).resolve().parents[1] / "sample_runs" / "tiny-faults"
STRAGGLER = Label("straggler", "straggler", Window(100, 140), (3,), "straggler:rank=3,from=100,steps=41", 2.0)
NAN = Label("nan", "nonfinite", Window(200), (0,), "nan:rank=0,step=200")


def findings(*rows: tuple[str, int, tuple[int, ...]], timeline: int = 0, severity: str = "warning") -> pd.DataFrame:
    """Findings of ``timeline`` and ``severity`` from (kind, start step, ranks)."""
    return pd.DataFrame(
        [
            (f"{kind}@{start}/{i}", kind, severity, timeline, start, ranks)
            for i, (kind, start, ranks) in enumerate(rows)
        ],
        columns=list(FINDING_COLUMNS),
    )


@pytest.mark.parametrize(
    ("start", "ranks", "found"),
    [
        (100, (3,), True),
        (98, (3,), True),
        (97, (3,), False),
        (140, (3,), True),
        (150, (3,), True),
        (151, (3,), False),
        (120, (), True),
        (120, (2, 3), True),
        (120, (2,), False),
    ],
    ids=lambda v: str(v),
)
def test_a_finding_matches_a_label_within_the_margin_when_it_blames_its_ranks(start, ranks, found) -> None:
    rows = match(findings(("straggler", start, ranks)), [STRAGGLER], Margin(before=2, after=10))
    assert rows["found"].tolist() == [found]


def test_delay_and_culprit_come_from_the_earliest_matching_finding() -> None:
    rows = match(
        findings(("straggler", 110, (3,)), ("straggler", 104, (2, 3)), ("loss_spike", 100, ())),
        [STRAGGLER],
        Margin(before=5),
    )
    [row] = rows.to_dict("records")
    assert (row["delay"], row["culprit"], row["finding_id"]) == (4, False, "straggler@104/1")


@pytest.mark.parametrize(
    ("starts", "delay"),
    [
        ((190, 200), 0),
        ((190, 198, 205), -2),
        ((190, 195), -5),
        ((205, 203), 3),
        ((190,), -10),
    ],
    ids=str,
)
def test_the_finding_nearest_the_onset_gives_the_delay_not_an_earlier_one_in_the_margin(starts, delay) -> None:
    """On time means from two steps before the fault on; only when no finding is, the latest before it counts."""
    rows = match(findings(*(("nonfinite", start, (0,)) for start in starts)), [NAN], Margin(before=12, after=12))
    assert rows["delay"].tolist() == [delay]


def test_false_alarms_are_findings_no_label_explains() -> None:
    found = findings(
        ("straggler", 120, (1,)),
        ("throughput_drop", 130, ()),
        ("nonfinite", 200, ()),
        ("grad_spike", 201, ()),
        ("sdc", 50, (5,)),
        ("nonfinite", 150, ()),
    )
    alarms = false_alarms(found, [STRAGGLER, NAN], Margin())
    # a peer's straggler finding in the window is no alarm, nor the drop a straggler causes
    assert alarms["start_step"].tolist() == [50, 150]


def test_an_info_finding_is_no_false_alarm_but_still_catches_its_fault() -> None:
    bump = findings(("loss_spike", 50, ()), ("nonfinite", 200, (0,)), severity="info")
    assert false_alarms(bump, [NAN], Margin()).empty
    assert match(bump, [NAN], Margin())["found"].tolist() == [True]


def test_after_a_rewind_a_finding_matches_and_explains_only_faults_of_its_timeline() -> None:
    # the run rewinds to step 90 and starts timeline 1; the straggler fires again on it
    rewound = dataclasses.replace(STRAGGLER, timeline=1)
    abandoned = findings(("straggler", 110, (3,)), ("throughput_drop", 112, ()))
    new_branch = findings(("straggler", 104, (3,)), ("throughput_drop", 106, ()), timeline=1)
    assert match(abandoned, [rewound], Margin())["found"].tolist() == [False]
    assert match(new_branch, [STRAGGLER], Margin())["found"].tolist() == [False]
    assert false_alarms(abandoned, [rewound], Margin())["start_step"].tolist() == [110, 112]
    both = pd.concat([abandoned, new_branch], ignore_index=True)
    rows = match(both, [STRAGGLER, rewound], Margin())
    assert rows[["timeline", "delay"]].values.tolist() == [[0, 10], [1, 4]]
    assert false_alarms(both, [STRAGGLER, rewound], Margin()).empty


def test_labels_are_one_per_fault_and_timeline() -> None:
    args = {"spec": "nan:rank=1,step=10", "first": 10, "last": 10, "every": 1, "expected_kind": "nonfinite"}
    records = pd.DataFrame(
        {"timeline": [0, 1], "step": 10, "fault": "nan", "target_ranks": "[1]", "args": json.dumps(args)}
    )
    assert [label.timeline for label in labels_of(records)] == [0, 1]


def test_the_table_counts_recall_precision_and_alarms_per_kind() -> None:
    found = findings(("straggler", 101, (3,)), ("sdc", 50, (5,)), ("sdc", 60, (5,)))
    labels = [STRAGGLER, NAN]
    table = precision_recall(match(found, labels, Margin()), false_alarms(found, labels, Margin()), steps=20_000)
    rows = table.set_index("kind").to_dict("index")
    assert rows["straggler"]["recall"] == 1.0 and rows["straggler"]["precision"] == 1.0
    assert rows["straggler"]["culprit_accuracy"] == 1.0 and rows["straggler"]["median_delay"] == 1
    assert rows["nonfinite"]["recall"] == 0.0 and rows["sdc"]["faults"] == 0
    assert rows["sdc"]["false_alarms_per_10k"] == 1.0


def test_a_fault_recorded_at_every_firing_is_one_label() -> None:
    args = {"spec": "nan:rank=1,from=10,steps=3", "first": 10, "last": 12, "every": 1, "expected_kind": "nonfinite"}
    records = pd.DataFrame(
        {"timeline": 0, "step": [10, 11, 12], "fault": "nan", "target_ranks": "[1]", "args": json.dumps(args)}
    )
    assert labels_of(records) == [Label("nan", "nonfinite", Window(10, 12), (1,), args["spec"])]


def test_every_trainer_fault_expects_a_finding_kind() -> None:
    assert {t.expected_kind for t in TRAINER_FAULTS.values()} <= set(FINDING_KINDS)
    assert TRAINER_FAULTS["grad_bitflip"].expected_kind == "sdc"


SHARED_FAULT_DIFFERENCES = {
    # the trainer corrupts real token data in shards the tiny runs all read every step, so no shard stands
    # out and the loss shows it first (its seed draws the corruption); the simulator raises the loss of the
    # chosen shards' samples by ``excess``, which the bad_shard detector pins on them
    "bad_shard": {
        "expected_kind": ("loss_spike", "bad_shard"),
        "settings": ((), ("excess",)),
        "magnitude": (None, "excess"),
        "extra": (("seed",), ()),
    },
    # the trainer stops one real process; the simulator also hangs a host, and its peers' collective
    # times out after ``timeout_s``, which only the simulator models
    "hang": {"targets": ("rank", "node"), "settings": ((), ("timeout_s",))},
    # the trainer poisons a rank it is told of and records every firing as it happens; the simulator
    # defaults to rank 0 and writes each fault once, its window saying every step it covers
    "inf": {"targets": ("rank", "rank_or_zero"), "each_firing": (True, False)},
    "nan": {"targets": ("rank", "rank_or_zero"), "each_firing": (True, False)},
    # the trainer slows a real rank by a measured factor or a fixed delay, checked by its injector; the
    # simulator slows ranks or a host, in compute or in the data wait, by a factor it records as magnitude
    "straggler": {
        "targets": ("rank", "node"),
        "settings": ((), ("factor",)),
        "choices": ((), ("phase",)),
        "magnitude": (None, "factor"),
        "extra": (("delay_ms", "factor"), ()),
    },
}
"""What the trainer's and the simulator's faults of one name may differ in: (trainer, simulator) by field."""


def _facts(ftype: FaultType) -> dict[str, Any]:
    """A fault type's fields, with mappings and sets as their sorted keys."""
    values = {f.name: getattr(ftype, f.name) for f in dataclasses.fields(ftype)}
    return {key: tuple(sorted(v)) if isinstance(v, Mapping | frozenset) else v for key, v in values.items()}


def test_the_trainer_and_the_simulator_differ_on_a_shared_fault_only_where_allowed() -> None:
    shared = sorted(set(TRAINER_FAULTS) & set(SIMULATED_FAULTS))
    differences = {}
    for name in shared:
        trainer, simulator = _facts(TRAINER_FAULTS[name]), _facts(SIMULATED_FAULTS[name])
        differences[name] = {key: (trainer[key], simulator[key]) for key in trainer if trainer[key] != simulator[key]}
    assert differences == SHARED_FAULT_DIFFERENCES


def test_the_demo_scorecard_scores_the_sample_run(tmp_path: Path) -> None:
    run = shutil.copytree(SAMPLE_RUN, tmp_path / "tiny-faults")
    with Store.open(None, schemas=SCHEMAS) as store:
        Collector(run, store).ingest_available()
        detect_store(store)
        card = demo_scorecard(store, margin=12)
    assert list(card.columns) == ["step", "fault", "target_ranks", "found_as", "delay_steps", "why_missed"]
    assert card.values.tolist() == [
        [80, "bad_shard", "[0,1]", "loss_spike", 0, ""],
        [105, "straggler", "[1]", "straggler", 0, ""],
        [150, "grad_bitflip", "[1]", "sdc", 0, ""],
        [170, "param_bitflip", "[0]", "sdc", 0, ""],
        [185, "nan", "[0]", "nonfinite", 0, ""],
    ]


@pytest.mark.parametrize(
    ("rows", "why"),
    [
        ([("straggler", 120, (2,))], "a straggler finding in steps 88-152 named rank(s) 2, not 3"),
        ([("straggler", 400, (3,)), ("straggler", 30, (3,))], "the nearest straggler finding starts at step 30, outside steps 88-152"),
        ([("loss_spike", 120, ())], "no straggler finding on timeline 0: the effect did not stand out from the run's own noise"),
    ],
)  # fmt: skip
def test_a_missed_fault_says_why_in_words(rows: list, why: str) -> None:
    # The demo's scorecard printed None for a straggler it missed on a busy machine, and nothing more.
    assert not match(findings(*rows), [STRAGGLER], Margin(12, 12))["found"].any()
    assert why_missed(findings(*rows), STRAGGLER, 12) == why
