"""``bedside simulate``: the CLI end to end through collect and query, the timing of a synchronous job,
every fault's signature and ground truth, nuisances, determinism, and refused input."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from bedside.app.cli import main
from bedside.app.simulation import NOISE_FAMILIES, SimulationConfig, SimulationError, simulate_run
from bedside.collectors.query import run_query
from bedside.detectors.datasets import simulate
from bedside.detectors.datasets.faults import parse_fault
from bedside.detectors.datasets.models import standard_noise
from bedside.detectors.datasets.topology import Topology
from bedside.detectors.faults import SIMULATED_FAULTS, Label
from bedside.detectors.finding import FINDING_KINDS

STEPS, RANKS = 200, 8
FAULTS = {
    "spike:step=60,sigma=12,shape=grad_leading,lead=4": "loss_spike",
    "spike:step=75,sigma=10": "loss_spike",
    "sdc_grad:rank=2,step=90,scale_log2=10": "sdc",
    "param_corrupt:rank=5,step=33": "sdc",
    "sdc_quiet:rank=6,step=44,rel=0.005": "sdc",
    "nan:rank=1,step=130": "nonfinite",
    "straggler:rank=3,factor=1.5,from=140,steps=20": "straggler",
    "straggler:host=1,factor=1.2,from=170,every=5": "straggler",
    "bad_shard:shards=3-4,from=1": "bad_shard",
    "eval_stall:from=150": "eval_stall",
    "throughput_drop:from=185,factor=0.8": "throughput_drop",
}


def query(run: Path, sql: str) -> pd.DataFrame:
    return run_query(run, sql)[0].frame


def cli_json(bedside, run: Path, sql: str) -> list[dict]:
    done = bedside("query", run, sql, "--format", "json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def simulate_and_collect(bedside, run: Path, *args: str) -> None:
    done = bedside("simulate", "--out", run, *args)
    assert done.returncode == 0, done.stderr
    collected = bedside("collect", run, "--quiet")
    assert collected.returncode == 0, collected.stderr


@pytest.fixture(scope="module")
def faulty_run(tmp_path_factory, bedside) -> Path:
    """8 ranks on 2 hosts, 200 steps, one of each fault, nuisances on; simulated and collected by the CLI."""
    run = tmp_path_factory.mktemp("simulate") / "run"
    injected = [arg for spec in FAULTS for arg in ("--inject", spec)]
    simulate_and_collect(
        bedside, run, "--ranks", str(RANKS), "--steps", str(STEPS), "--ranks-per-host", "4", "--seed", "7", *injected
    )
    return run


@pytest.fixture(scope="module")
def rank_steps(faulty_run: Path) -> pd.DataFrame:
    return query(faulty_run, "SELECT * EXCLUDE (extra) FROM rank_step_metrics ORDER BY step, rank")


def pivot(rank_steps: pd.DataFrame, column: str) -> pd.DataFrame:
    """(step, rank) table of one column."""
    return rank_steps.pivot(index="step", columns="rank", values=column)


# -- the run as the collector sees it -------------------------------------------------


def test_collect_rejects_nothing_and_the_views_hold_every_record(faulty_run: Path, bedside) -> None:
    [status] = cli_json(
        bedside, faulty_run, "SELECT sum(rejected)::INT AS rejected, count(*) AS files FROM ingest_status"
    )
    assert status == {"rejected": 0, "files": RANKS + 1}
    [counts] = cli_json(
        bedside,
        faulty_run,
        """
        SELECT (SELECT count(*) FROM rank_step_metrics) AS rank_steps, (SELECT count(*) FROM step_metrics) AS steps,
               (SELECT count(DISTINCT step) FROM eval_scores) AS evals,
               (SELECT count(*) FROM eval_scores WHERE split = 'heldout') AS scores,
               (SELECT count(*) FROM fault_labels) AS labels, (SELECT status FROM run) AS status,
               (SELECT count(*) FROM rank_step_metrics WHERE param_checksum IS NOT NULL) AS checksums""",
    )
    assert counts == {
        "rank_steps": RANKS * STEPS,
        "steps": STEPS,
        "evals": 4,
        "scores": 8,
        "labels": len(FAULTS),
        "status": "finished",
        "checksums": RANKS * STEPS // 10,
    }


def test_topology_and_the_nuisances_are_in_run_json(faulty_run: Path) -> None:
    ranks = query(faulty_run, "SELECT rank, host, dp, tp, pp FROM ranks ORDER BY rank")
    assert ranks["host"].tolist() == ["node-0000"] * 4 + ["node-0001"] * 4
    assert ranks["dp"].tolist() == list(range(RANKS)) and set(ranks["tp"]) == set(ranks["pp"]) == {0}
    config = json.loads((faulty_run / "run.json").read_text())["config"]
    assert config["inject"] == list(FAULTS)
    assert config["nuisances"]["resume"]["step"] == 100
    assert {"common_mode", "diurnal", "jitter", "eval_stalls", "checkpoint_stalls", "mixture_switch"} <= set(
        config["nuisances"]
    )


def test_every_fault_is_labeled_once_with_its_expected_kind(faulty_run: Path) -> None:
    labels = query(faulty_run, "SELECT step, rank, fault, target_ranks, args FROM fault_labels ORDER BY step")
    written = [
        Label.from_record(*row) for row in labels[["step", "fault", "target_ranks", "args"]].itertuples(index=False)
    ]
    generated = simulate(SimulationConfig(ranks=RANKS, steps=STEPS, ranks_per_host=4, seed=7, inject=tuple(FAULTS)))
    assert written == generated.labels  # the dataset's ground truth is what the run directory says
    args = [json.loads(a) for a in labels["args"]]
    assert sorted((a["spec"], a["expected_kind"]) for a in args) == sorted(FAULTS.items())
    assert set(labels["rank"]) == {0}
    host = next(i for i, a in enumerate(args) if a["spec"].startswith("straggler:host"))
    assert json.loads(labels["target_ranks"][host]) == [4, 5, 6, 7]
    window = tuple(args[host][key] for key in ("first", "last", "every", "magnitude"))
    assert window == (170, None, 5, 1.2)
    leading = next(i for i, a in enumerate(args) if "grad_leading" in a["spec"])
    assert labels["step"][leading] == 56 and args[leading]["peak"] == 60


# -- timing of a synchronous job ------------------------------------------------------


def test_every_rank_reports_the_same_wall_step_time_and_phases_add_up(rank_steps: pd.DataFrame) -> None:
    assert (rank_steps.groupby("step")["step_time"].nunique() == 1).all()
    phases = rank_steps[["data_time", "compute_time", "comm_time", "optimizer_time"]].sum(axis=1)
    assert np.allclose(phases, rank_steps["step_time"], rtol=1e-4)
    assert (rank_steps.groupby("rank")["time"].apply(lambda t: t.is_monotonic_increasing)).all()
    assert (rank_steps.groupby("step")["time"].nunique() == 1).all()


def test_a_straggler_computes_factor_times_longer_and_its_peers_wait(rank_steps: pd.DataFrame) -> None:
    compute, comm = pivot(rank_steps, "compute_time"), pivot(rank_steps, "comm_time")
    window, before = compute.loc[140:159], compute.loc[120:139]
    peers = [r for r in range(RANKS) if r != 3]
    ratio = (window[3] / window[peers].median(axis=1)).median()
    assert ratio == pytest.approx(1.5, rel=0.04)
    assert (before[3] / before[peers].median(axis=1)).median() == pytest.approx(1.0, abs=0.04)
    delay = (window[3] - window[peers].median(axis=1)).median()
    waited = (comm.loc[140:159, peers].median(axis=1) - comm.loc[120:139, peers].median().median()).median()
    assert waited == pytest.approx(delay, rel=0.25)
    assert comm.loc[140:159, 3].median() < comm.loc[140:159, peers].min().min()


def test_a_host_straggler_is_intermittent_on_every_rank_of_the_host(rank_steps: pd.DataFrame) -> None:
    compute = pivot(rank_steps, "compute_time")
    host, others = [4, 5, 6, 7], [0, 1, 2, 3]
    ratio = compute[host].median(axis=1) / compute[others].median(axis=1)
    assert ratio.loc[[170, 175, 180]].min() > 1.12
    assert ratio.loc[[171, 172, 176, 181]].max() < 1.06


def test_a_throughput_drop_slows_every_step(faulty_run: Path, rank_steps: pd.DataFrame) -> None:
    """With the common-mode slowdowns that run.json records divided out."""
    first = rank_steps.groupby("step")["step_time"].first()
    step_time = pd.Series(first.to_numpy(dtype=float), index=first.index.astype(int))
    for window in json.loads((faulty_run / "run.json").read_text())["config"]["nuisances"]["common_mode"]:
        step_time.loc[window["first"] : window["last"]] /= window["slowdown"]
    before = step_time[(step_time.index > 101) & (step_time.index < 170) & ~step_time.index.isin(range(140, 160))]
    assert step_time.loc[186:200].median() / before.median() == pytest.approx(1.25, rel=0.06)


# -- losses, norms, checksums, evals ----------------------------------------------------


def test_spikes_nan_and_sdc_show_in_loss_and_norms(faulty_run: Path, rank_steps: pd.DataFrame) -> None:
    steps = query(faulty_run, "SELECT step, loss, grad_norm FROM step_metrics ORDER BY step").set_index("step")
    loss, grad = steps["loss"], steps["grad_norm"]
    assert loss[75] > 1.08 * loss.loc[70:80].median()
    base_loss, base_grad = loss.loc[54:59].median(), grad.loc[50:55].median()
    assert grad.loc[58:59].min() > 1.4 * base_grad and loss.loc[58:59].max() < 1.05 * base_loss  # the norm leads
    assert loss[60] > 1.08 * base_loss
    assert np.isnan(loss[130]) and np.isnan(grad[130]) and loss.drop(130).notna().all()
    local = pivot(rank_steps, "local_grad_norm")
    assert local.loc[130].isna().tolist() == [r == 1 for r in range(RANKS)]
    assert 600 < local.loc[90, 2] / local.loc[90].drop(2).median() < 1800
    assert grad[90] > 50 * grad.loc[85:89].median()
    logs = query(faulty_run, "SELECT step, message FROM event_log WHERE level = 'error'")
    assert logs.to_dict("records") == [{"step": 130, "message": "non-finite gradient norm (nan): update skipped"}]


def test_checksums_agree_across_replicas_until_one_diverges(rank_steps: pd.DataFrame) -> None:
    checksums = pivot(rank_steps.dropna(subset=["param_checksum"]), "param_checksum")
    assert (checksums.loc[[10, 20, 30]].nunique(axis=1) == 1).all()
    assert checksums.loc[40].drop(5).nunique() == 1 and checksums.loc[40, 5] != checksums.loc[40, 0]
    later = checksums.loc[50:]
    assert (later[5] != later[0]).all() and (later[6] != later[0]).all() and (later[5] != later[6]).all()
    assert (later.drop(columns=[5, 6]).nunique(axis=1) == 1).all()


def test_steps_reading_the_bad_shard_have_a_higher_loss(faulty_run: Path) -> None:
    steps = query(
        faulty_run,
        "SELECT step, loss, list_has_any(CAST(shards AS INTEGER[]), [3, 4]) AS bad "
        "FROM step_metrics WHERE step >= 20 AND step NOT BETWEEN 55 AND 80 AND step <> 130 "
        "ORDER BY step",
    )
    residual = steps["loss"] - steps["loss"].rolling(9, center=True, min_periods=3).median()
    assert steps["bad"].sum() >= 5
    assert residual[steps["bad"]].median() > 0.15 and residual[~steps["bad"]].abs().median() < 0.05


def test_eval_stalls_while_training_loss_keeps_falling(faulty_run: Path) -> None:
    evals = query(faulty_run, "SELECT step, value, cum_tokens FROM eval_scores WHERE name = 'loss' ORDER BY step")
    value = evals.set_index("step")["value"]
    assert value[50] > value[100] > value[150] and value[200] == pytest.approx(value[150], rel=0.02)
    assert evals["cum_tokens"].is_monotonic_increasing
    loss = query(faulty_run, "SELECT step, loss FROM step_metrics").set_index("step")["loss"]
    assert loss.loc[186:200].median() < loss.loc[145:155].median()


def test_checkpoints_and_a_resume_are_events_not_faults(faulty_run: Path) -> None:
    events = query(faulty_run, "SELECT step, event, duration_s FROM checkpoint_events ORDER BY time")
    assert events[["step", "event"]].values.tolist() == [
        [100, "save_started"],
        [100, "saved"],
        [100, "loaded"],
        [200, "save_started"],
        [200, "saved"],
    ]
    restarts = query(faulty_run, "SELECT rank FROM event_log WHERE kind = 'rank_info' AND step = 100")
    assert sorted(restarts["rank"]) == list(range(RANKS))
    beats = query(faulty_run, "SELECT count(*) AS n FROM event_log WHERE kind = 'heartbeat'")
    assert beats["n"][0] > 0


# -- hang, scale, options -----------------------------------------------------------------


def test_a_hung_rank_goes_silent_while_its_peers_block_and_keep_beating(tmp_path: Path, bedside) -> None:
    run = tmp_path / "hang"
    simulate_and_collect(bedside, run, "--ranks", "8", "--steps", "100", "--inject", "hang:rank=2,step=40,timeout_s=60")
    last = query(run, "SELECT rank, max(step) AS step, max(time) AS t FROM rank_step_metrics GROUP BY rank")
    assert set(last["step"]) == {39}
    events = query(
        run,
        "SELECT rank, kind, count(*) AS n, min(time) AS t FROM event_log "
        "WHERE step = 39 GROUP BY ALL ORDER BY rank, kind",
    )
    assert 2 not in set(events["rank"])
    beats = events[events["kind"] == "heartbeat"]
    assert sorted(beats["rank"]) == [0, 1, 3, 4, 5, 6, 7] and set(beats["n"]) == {5}
    assert (beats["t"].to_numpy() > last["t"].max()).all()
    assert query(run, "SELECT status FROM run")["status"][0] == "failed"
    label = query(run, "SELECT step, fault, target_ranks FROM fault_labels")
    assert label.values.tolist() == [[40, "hang", "[2]"]]


def test_a_thousand_ranks_collect_cleanly(tmp_path: Path, bedside) -> None:
    run = tmp_path / "wide"
    simulate_and_collect(
        bedside, run, "--ranks", "1024", "--steps", "20", "--pp", "4", "--inject", "straggler:host=5,factor=1.3,from=10"
    )
    [counts] = cli_json(
        bedside,
        run,
        """
        SELECT (SELECT sum(rejected)::INT FROM ingest_status) AS rejected,
               (SELECT count(*) FROM rank_step_metrics) AS rows,
               (SELECT count(DISTINCT host) FROM ranks) AS hosts, (SELECT max(pp) FROM ranks) AS last_stage,
               (SELECT count(*) FROM rank_step_metrics GROUP BY step ORDER BY 1 LIMIT 1) AS per_step""",
    )
    assert counts == {"rejected": 0, "rows": 1024 * 20, "hosts": 128, "last_stage": 3, "per_step": 1024}


def test_the_last_pipeline_stage_is_slower_and_stages_keep_their_own_checksums(tmp_path: Path) -> None:
    run = tmp_path / "pp"
    simulate_run(SimulationConfig(ranks=8, steps=60, pp=2, ranks_per_host=4, seed=3), run)
    frame = query(run, "SELECT step, rank, pp, compute_time, comm_time, param_checksum FROM rank_step_metrics")
    by_stage = frame.groupby("pp")[["compute_time", "comm_time"]].median()
    assert by_stage.loc[1, "compute_time"] / by_stage.loc[0, "compute_time"] == pytest.approx(1.12, rel=0.03)
    assert by_stage.loc[0, "comm_time"] > by_stage.loc[1, "comm_time"] + 0.05
    checked = frame.dropna(subset=["param_checksum"]).groupby(["step", "pp"])["param_checksum"].nunique()
    assert set(checked) == {1}
    assert frame.dropna(subset=["param_checksum"]).groupby("step")["param_checksum"].nunique().min() == 2


@pytest.mark.parametrize("noise", NOISE_FAMILIES)
def test_every_noise_family_writes_a_clean_run(tmp_path: Path, noise: str) -> None:
    run = tmp_path / noise
    simulate_run(SimulationConfig(ranks=4, steps=120, noise=noise, inject=("spike:step=80,sigma=30",)), run)
    frame = query(
        run,
        "SELECT (SELECT sum(rejected) FROM ingest_status) AS rejected, "
        "(SELECT count(*) FROM step_metrics WHERE loss > 0) AS steps",
    )
    assert frame.values.tolist() == [[0, 120]]


@pytest.mark.parametrize("family", NOISE_FAMILIES)
def test_noise_families_are_standardized(family: str) -> None:
    draws = standard_noise(np.random.default_rng(0), family, 200_000)
    assert draws.mean() == pytest.approx(0, abs=0.02) and draws.std() == pytest.approx(1, abs=0.03)


def test_without_nuisances_the_run_is_clean(tmp_path: Path) -> None:
    run = tmp_path / "clean"
    simulate_run(SimulationConfig(ranks=4, steps=100, nuisances=False), run)
    lr = query(run, "SELECT DISTINCT lr FROM step_metrics")
    assert len(lr) == 1
    kinds = query(run, "SELECT DISTINCT kind FROM event_log ORDER BY kind")["kind"].tolist()
    assert kinds == ["rank_info", "run_end"]
    nuisances = json.loads((run / "run.json").read_text())["config"]["nuisances"]
    assert nuisances["resume"] is None and nuisances["jitter"] == [] and nuisances["common_mode"] == []
    assert not (run / "ground_truth").exists()


def test_the_same_seed_writes_the_same_bytes(tmp_path: Path) -> None:
    config = SimulationConfig(ranks=8, steps=120, seed=5, inject=("straggler:rank=1,from=30", "nan:step=50"))
    for name in ("a", "b"):
        simulate_run(config, tmp_path / name / "run")
    files = sorted(p.relative_to(tmp_path / "a") for p in (tmp_path / "a").rglob("*") if p.is_file())
    assert len(files) == 8 + 2
    assert all((tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes() for f in files)
    simulate_run(SimulationConfig(ranks=8, steps=120, seed=6), tmp_path / "c" / "run")
    rank0 = Path("run/telemetry/rank-00000.jsonl")
    assert (tmp_path / "a" / rank0).read_bytes() != (tmp_path / "c" / rank0).read_bytes()


def test_a_fault_leaves_the_other_signals_unchanged(tmp_path: Path) -> None:
    """Each signal has its own random stream: the benchmark compares a faulty run with its clean twin."""
    for name, inject in (("clean", ()), ("faulty", ("straggler:rank=1,factor=2,from=30",))):
        simulate_run(SimulationConfig(ranks=4, steps=60, seed=2, inject=inject), tmp_path / name)
    sql = "SELECT step, loss, grad_norm FROM step_metrics ORDER BY step"
    pd.testing.assert_frame_equal(query(tmp_path / "clean", sql), query(tmp_path / "faulty", sql))
    compute = "SELECT step, compute_time FROM rank_step_metrics WHERE rank = 1 ORDER BY step"
    ratio = query(tmp_path / "faulty", compute)["compute_time"] / query(tmp_path / "clean", compute)["compute_time"]
    steps = query(tmp_path / "clean", compute)["step"]
    assert ratio[steps < 30].median() == pytest.approx(1.0, abs=0.05)  # the fault is there, and only there
    assert ratio[steps >= 30].median() == pytest.approx(2.0, rel=0.1)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--ranks", "0"], "argument --ranks: expected an integer from 1 to 65536, got 0"),
        (["--ranks", "6", "--pp", "4"], "bedside: error: --pp 4 must divide --ranks 6"),
        (["--inject", "melt:rank=1,step=3"], "bad fault spec 'melt:rank=1,step=3': unknown fault 'melt'"),
        (
            ["--inject", "nan:rank=9,step=3"],
            "bad fault spec 'nan:rank=9,step=3': rank 9 is out of range for world size 8",
        ),
        (["--inject", "straggler:rank=1,factor=0.5,from=3"], "factor must be > 1 and <= 100, got 0.5"),
        (
            ["--inject", "spike:step=30,shape=wobbly"],
            "shape must be one of single, grad_leading, divergent, got 'wobbly'",
        ),
        (
            ["--inject", "hang:rank=1,step=10", "--inject", "nan:step=20"],
            "step 20 is never reached, the run hangs at step 10",
        ),
        (["--inject", "bad_shard:from=3"], "bad_shard needs shard= or shards= (one of them)"),
        (["--inject", "sdc_grad:rank=1,step=500"], "step 500 is after the run's last step 50"),
    ],
)
def test_bad_options_are_one_error_line(tmp_path: Path, capsys, args: list[str], message: str) -> None:
    run = tmp_path / "run"
    argv = ["simulate", "--out", str(run), "--steps", "50", *(["--ranks", "8"] if "--ranks" not in args else []), *args]
    try:
        status = main(argv)
    except SystemExit as exit:
        status = exit.code
    assert status == 2
    assert message in capsys.readouterr().err.strip().splitlines()[-1]
    assert not run.exists()


def test_an_existing_run_is_never_overwritten(tmp_path: Path, bedside) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "notes.txt").write_text("mine")
    done = bedside("simulate", "--out", run, "--ranks", "2", "--steps", "5")
    assert done.returncode == 2 and "already exists and is not empty" in done.stderr
    assert [p.name for p in run.iterdir()] == ["notes.txt"]


@pytest.mark.parametrize(
    ("spec", "ranks", "window"),
    [
        ("straggler:host=1,factor=1.05,from=10,steps=5", (8, 9, 10, 11, 12, 13, 14, 15), (10, 14, 1)),
        ("straggler:ranks=2-3,from=10,every=4", (2, 3), (10, None, 4)),
        ("nan:step=7", (0,), (7, 7, 1)),
        ("spike:step=20,sigma=3,shape=divergent", tuple(range(32)), (20, None, 1)),
        ("sdc_grad:rank=5,from=12,every=3,scale_log2=20", (5,), (12, None, 3)),
        ("eval_stall:from=30,steps=10", tuple(range(32)), (30, 39, 1)),
    ],
)
def test_fault_specs_parse_into_targets_and_windows(spec: str, ranks: tuple, window: tuple) -> None:
    fault = parse_fault(spec, Topology(32, 1, 8), 100)
    assert fault.ranks == ranks
    assert (fault.window.first, fault.window.last, fault.window.every) == window


def test_the_api_refuses_a_bad_config() -> None:
    with pytest.raises(SimulationError, match="ranks must be >= 1"):
        SimulationConfig(ranks=0, steps=10)
    with pytest.raises(SimulationError, match="noise must be one of"):
        SimulationConfig(ranks=2, steps=10, noise="cauchy")


@pytest.mark.parametrize("name", sorted(SIMULATED_FAULTS))
def test_every_fault_is_documented_and_expects_a_finding_kind(name: str) -> None:
    doc = (Path(__file__).resolve().parents[1] / "docs" / "simulate.md").read_text()
    assert f"`{name}`" in doc
    assert SIMULATED_FAULTS[name].expected_kind in FINDING_KINDS
