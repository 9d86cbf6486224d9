"""What every registered detector promises, tested over the registry (the shape of ruptures' test_detection.py).

Settings out of their declared range are refused by name; empty and all-NaN telemetry give nothing; a
rewind mid-run is taken in stride; one batch or many small ones give the same findings; every finding is of
a kind its detector declares. ``telemetry_frames.faulty_run`` gives every detector something to find, so that the
batch-versus-streaming comparison compares findings, not two empty lists.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import telemetry_frames as tf

from bedside.detectors.errors import DetectorConfigError
from bedside.detectors.limits import Below, Range
from bedside.detectors.registry import build_detectors, detector_classes, detector_names, finding_kinds
from bedside.detectors.telemetry import RunState, TelemetryBatch

RANKS = tf.FAULTY_RANKS
NAMES = detector_names()


def out_of_range(limit: Range) -> list[object]:
    """Values a setting of this range must refuse: zero, negative, NaN, infinity where invalid; text, a
    boolean; a fraction for an integer; just past either end."""
    candidates: list[object] = [0, -1, -0.5, math.nan, math.inf, -math.inf, "1", True, None]
    if limit.integer:
        candidates.append(2.5)
    if limit.low is not None:
        candidates.append(limit.low - (1 if limit.integer else 1e-9))
    if limit.high is not None:
        candidates.append(limit.high + (1 if limit.integer else 1e-9))
    return [v for v in candidates if not limit.admits(v)]


BAD_SETTINGS = [
    (name, setting, value)
    for name, cls in detector_classes().items()
    for setting, limit in cls.limits.items()
    for value in out_of_range(limit)
]


def test_the_registry_fills_itself_with_every_detector() -> None:
    assert {
        "bad_shard",
        "checkpoint_corrupt",
        "eval_stall",
        "grad_spike",
        "hang",
        "loss_spike",
        "nonfinite",
        "sdc",
        "straggler",
        "throughput_drop",
    } <= set(NAMES)
    assert [d.name for d in build_detectors()] == list(NAMES) == sorted(NAMES)


@pytest.mark.parametrize(("name", "setting", "value"), BAD_SETTINGS, ids=str)
def test_a_setting_out_of_range_is_refused_by_name(name: str, setting: str, value: object) -> None:
    with pytest.raises(DetectorConfigError, match=f"detector '{name}': setting {setting} = .* is out of range"):
        build_detectors({name: {setting: value}}, only=[name])


@pytest.mark.parametrize("name", NAMES)
def test_an_unknown_setting_is_refused(name: str) -> None:
    with pytest.raises(DetectorConfigError, match=f"bad settings for detector '{name}'.*no_such_setting"):
        detector_classes()[name](no_such_setting=1)


@pytest.mark.parametrize("name", NAMES)
def test_every_setting_has_a_range_that_admits_its_default(name: str) -> None:
    cls = detector_classes()[name]
    defaults = cls.defaults()
    assert set(defaults) == set(cls.limits)
    assert all(cls.limits[setting].admits(value) for setting, value in defaults.items())


ORDERS = [(name, order) for name, cls in detector_classes().items() for order in cls.orders]


@pytest.mark.parametrize(("name", "order"), ORDERS, ids=str)
def test_settings_that_only_work_in_one_order_are_refused_the_other_way(name: str, order: Below) -> None:
    defaults = detector_classes()[name].defaults()
    assert defaults[order.lower] < defaults[order.upper]
    top = defaults[order.upper]
    wrong = [top + 1] + ([] if order.or_equal else [top])
    for value in wrong:
        with pytest.raises(
            DetectorConfigError, match=f"detector '{name}': setting {order.lower} = .* must be .*{order.upper} = "
        ):
            build_detectors({name: {order.lower: value}}, only=[name])
    if order.or_equal:
        build_detectors({name: {order.lower: top}}, only=[name])


def test_the_spike_detectors_declare_their_orders() -> None:
    assert {(o.lower, o.upper) for o in detector_classes()["loss_spike"].orders} == {
        ("z_recover", "z_alarm"),
        ("min_points", "window"),
    }


@pytest.mark.parametrize("name", NAMES)
def test_a_detector_declares_its_kinds_and_one_that_emits_one_kind_is_named_after_it(name: str) -> None:
    kinds = detector_classes()[name].kinds
    assert kinds and len({k.name for k in kinds}) == len(kinds)
    assert len(kinds) > 1 or kinds[0].name == name
    assert all(finding_kinds()[k.name] is k for k in kinds)


@pytest.mark.parametrize("name", NAMES)
def test_empty_telemetry_gives_nothing(name: str) -> None:
    [detector] = build_detectors(only=[name])
    detector.bind(RunState())
    assert detector.update(TelemetryBatch()) == []
    assert detector.tick(tf.T0) == []
    assert detector.finish() == []


@pytest.mark.parametrize("name", NAMES)
def test_all_nan_metrics_give_nothing(name: str) -> None:
    batch = tf.faulty_run(faults=False)
    metrics = {
        "steps": ("loss", "grad_norm", "lr", "tokens", "flops"),
        "evals": ("value", "cum_tokens", "cum_flops"),
        "rank_steps": ("step_time", "data_time", "compute_time", "comm_time", "optimizer_time", "local_grad_norm"),
    }
    nan = TelemetryBatch(
        **{
            field: getattr(batch, field).assign(**dict.fromkeys(metrics.get(field, ()), np.nan))
            for field in ("steps", "rank_steps", "evals")
        }
    )
    [detector] = build_detectors(only=[name])
    assert tf.replay(detector, nan, run=RunState(world_size=RANKS)) == {}


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("rewound", [False, True], ids=["one timeline", "rewind mid-run"])
def test_one_batch_or_many_small_ones_give_the_same_findings_of_declared_kinds(name: str, rewound: bool) -> None:
    batch = tf.faulty_run(rewind_at=800 if rewound else None)
    whole = tf.as_json(detect(name, batch))
    for parts in (9, 40):  # cut at the same times in every frame, as a live feed that has caught up reads them
        assert tf.as_json(detect(name, batch, parts=parts)) == whole
    declared = {k.name for k in detector_classes()[name].kinds}
    assert {f["kind"] for f in whole.values()} <= declared


def test_the_faulty_run_gives_every_detector_something_to_find() -> None:
    assert {f.kind for name in NAMES for f in detect(name, tf.faulty_run()).values()} == set(finding_kinds())


def detect(name: str, batch: TelemetryBatch, *, parts: int = 1) -> dict:
    [detector] = build_detectors(only=[name])
    return tf.replay(detector, batch, parts=parts, by_time=True, run=RunState(world_size=RANKS))


def test_a_detector_that_forgets_its_kinds_or_a_setting_s_range_fails_to_load_with_a_reason() -> None:
    from bedside.detectors.detector import Detector
    from bedside.detectors.limits import COUNT, ranges

    kind = next(iter(finding_kinds().values()))
    with pytest.raises(DetectorConfigError, match="detector 'kindless' must declare kinds"):
        type("Kindless", (Detector,), {"name": "kindless", "limits": ranges(), "update": lambda self, batch: []})

    def init(self, *, window: int = 5, lag: int = 1) -> None:
        Detector.__init__(self)

    with pytest.raises(DetectorConfigError, match=r"its settings are \['lag', 'window'\], its limits \['window'\]"):
        type(
            "Rangeless",
            (Detector,),
            {
                "name": "rangeless",
                "kinds": (kind,),
                "limits": ranges(window=COUNT),
                "__init__": init,
                "update": lambda self, batch: [],
            },
        )
