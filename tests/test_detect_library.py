"""``bedside.detectors.detect``: the detectors over plain DataFrames, as docs/detectors.md shows them."""

from __future__ import annotations

import contextlib
import io
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import telemetry_frames as tf

from bedside.detectors import detect
from bedside.detectors.errors import DetectorConfigError, DetectorInputError
from bedside.detectors.incidents import IncidentBook
from bedside.detectors.registry import build_detectors
from bedside.detectors.runner import DetectorRunner
from bedside.detectors.telemetry import RunState

DOC = Path(__file__).resolve().parents[1] / "docs" / "detectors.md"


def notebook_examples() -> list[str]:
    """The python blocks of docs/detectors.md's "Detectors as a library" section: plain frames, a generated dataset."""
    section = DOC.read_text().split("## Detectors as a library", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, re.S)


def run_example(code: str) -> tuple[dict, str]:
    """The names an example defines and what it prints."""
    out = io.StringIO()
    namespace: dict = {}
    with contextlib.redirect_stdout(out):
        exec(code, namespace)
    return namespace, out.getvalue()


def test_the_section_has_two_examples() -> None:
    assert len(notebook_examples()) == 2


def test_the_documented_notebook_example_finds_its_spike() -> None:
    namespace, printed = run_example(notebook_examples()[0])
    found = namespace["found"]
    assert [(f.kind, f.start_step) for f in found.findings] == [("loss_spike", 401)]
    assert "('loss_spike', 401, 'loss spiked from step 401" in printed
    assert [i.kinds for i in found.incidents] == [("loss_spike",)]


def test_the_documented_dataset_example_scores_the_detectors_against_the_labels() -> None:
    """What the docs say of it: both faults found at once, the straggler by its rank, and no false alarm (an
    eval_stall from step 450 came with the nuisances before the eval forecast had a prediction interval)."""
    code = notebook_examples()[1]
    namespace, printed = run_example(code)
    matches = namespace["matches"]
    assert matches[["fault", "found", "delay"]].values.tolist() == [["straggler", True, 0], ["spike", True, 0]]
    assert matches["culprit"].tolist() == [True, None]
    assert namespace["alarms"].empty and "eval_stall" not in printed
    quiet, _ = run_example(code.replace("seed=1,", "seed=1, nuisances=False,"))
    assert quiet["matches"]["found"].all() and "eval_stall" not in set(quiet["findings"]["kind"])


def test_detect_gives_what_the_runner_and_the_incident_book_give() -> None:
    batch = tf.faulty_run()
    found = detect(
        **{name: getattr(batch, name) for name in ("steps", "rank_steps", "evals", "checkpoints", "actions", "filed")},
        world_size=tf.FAULTY_RANKS,
    )
    runner = DetectorRunner(build_detectors(), RunState(world_size=tf.FAULTY_RANKS))
    book = IncidentBook()
    book.add(runner.update(batch))
    book.add(runner.finish())
    assert found.findings == runner.ordered()
    assert [i.incident_id for i in found.incidents] == list(dict.fromkeys(book.incident_of(f) for f in found.findings))
    assert {f.kind for f in found.findings} >= {"straggler", "sdc", "hang", "nonfinite", "checkpoint_corrupt"}


def test_frames_without_their_optional_columns_are_completed() -> None:
    batch = tf.faulty_run()
    bare = detect(
        steps=batch.steps[["step", "loss"]],
        evals=batch.evals[["step", "name", "value", "cum_flops"]],
        only=["loss_spike", "eval_stall"],
    )
    assert {f.kind for f in bare.findings} == {"loss_spike", "eval_stall"}


@pytest.mark.parametrize("with_times", [True, False])
def test_a_rewound_frame_without_times_is_read_branch_after_branch(with_times: bool) -> None:
    # Timeline 0 blows up from step 501; timeline 1 goes back to step 451 and trains clean. Without times, the
    # rows were ordered by step and the two branches interleaved: the spike ended and reopened at every row of
    # timeline 1, 100 findings instead of one.
    rng = np.random.default_rng(0)
    first, second = np.arange(1, 601), np.arange(451, 1201)
    grad = np.exp(rng.normal(0, 0.05, len(first) + len(second)))
    grad[500 : len(first)] *= np.linspace(1, 50, 100)
    steps = pd.DataFrame(
        {
            "timeline": np.repeat([0, 1], [len(first), len(second)]),
            "step": np.r_[first, second],
            "grad_norm": grad,
        }
    )
    if with_times:
        steps["time"] = np.arange(len(steps), dtype=float)
    [found] = detect(steps=steps, only=["grad_spike"]).findings
    assert found.timeline == 0 and 501 <= found.start_step <= 503 and not found.active
    assert found.evidence["ended_by"] == "rewind to step 451 on timeline 1"


def test_settings_and_only_reach_the_detectors() -> None:
    steps = tf.faulty_run().steps
    assert detect(steps=steps, only=["loss_spike"], settings={"loss_spike": {"z_alarm": 1e6}}).findings == []
    with pytest.raises(DetectorConfigError, match="setting z_alarm = 0 is out of range"):
        detect(steps=steps, settings={"loss_spike": {"z_alarm": 0}})


def test_no_telemetry_finds_nothing() -> None:
    assert detect().findings == [] and detect(steps=pd.DataFrame()).incidents == []


@pytest.mark.parametrize(
    ("frames", "message"),
    [
        ({"steps": pd.DataFrame({"loss": [1.0, 2.0]})}, "steps: column step is missing"),
        ({"steps": pd.DataFrame({"step": [1, None], "loss": [1.0, 2.0]})}, "steps: column step .* has missing values"),
        ({"rank_steps": pd.DataFrame({"step": [1, 2], "step_time": 1.0})}, "rank_steps: column rank is missing"),
        (
            {"steps": pd.DataFrame({"step": [1.5, 2.0], "loss": [1.0, 2.0]})},
            "steps: column step must hold whole numbers",
        ),
        ({"topology": pd.DataFrame({"host": ["a"]})}, "topology: column rank is missing"),
    ],
)
def test_a_frame_without_what_the_detectors_need_is_refused(frames: dict, message: str) -> None:
    with pytest.raises(DetectorInputError, match=message):
        detect(**frames)


def test_importing_the_package_loads_no_detector_until_it_is_used() -> None:
    code = (
        "import sys, bedside.detectors as d\n"
        "assert 'scipy' not in sys.modules and 'bedside.detectors.registry' not in sys.modules\n"
        "assert 'loss_spike' in d.detector_names()\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_a_step_with_nan_in_a_whole_number_column_names_the_column() -> None:
    steps = pd.DataFrame({"step": np.arange(1, 4), "timeline": [0, np.nan, 0], "loss": 1.0})
    with pytest.raises(DetectorInputError, match="timeline"):
        detect(steps=steps)
