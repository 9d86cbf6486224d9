"""Detector quality on labeled runs: precision, recall, delay, false alarms, culprit accuracy.

Run:  python bench/detect_quality.py [--seeds 3] [--noise gaussian,student,lognormal] [--quick]
      [--suite simulated,foreign,first_contact] [--foreign-seeds 3]

Simulated suite: each scenario is simulated (``bedside simulate``'s API: nuisances on, the noise model
varied) with faults of a range of magnitudes, ingested into a store and run through
every detector in batch mode; the recorded runs of our own trainer in sample_runs/ are
scored too. Findings are scored against the ground truth by detectors/scoring.py, with
a margin per kind (below). Reported per kind: precision, recall, median and p90 delay in
steps (finding onset - fault onset), false alarms per 10k steps, culprit-rank accuracy,
and recall against magnitude. Last, the streaming update cost per step at 1,024 ranks, fed one step and ten
steps per update.

First-contact suite: the first minutes of runs (tests/first_contact_runs.py): initial descents of four shapes and
four time scales, falls of 3x to 300x, five noise models, a fault (an LR blow-up to 3x or 30x, a creep of 1.15x a
step, a spike of 2x or 3x, a 2x plateau of 5 steps, a NaN) at steps 20 to 2,000: recall within 3 steps of the
step the fault has the loss at 2x, by fault and onset, and the alarms before the fault per 10k steps by noise.

Foreign suite: runs from a generator written apart from the simulator (tests/foreign_runs.py: AR(1) Student-t
noise, warmup and LR drops, a mixture switch, MoE bursts, short runs, sparse ranks in pipeline stages of
different work), under each of its noise models with ``--foreign-seeds`` seeds, run through
``bedside.detectors.detect`` and scored the same way; the generator's honesty is checked on every run (a
labelled spike or sick rank stands out of everything unlabelled), then the per-kind table, recall by
magnitude, and the named rows with pass or fail and the figure measured.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

from bedside.app.service.detection import detect_store
from bedside.app.service.feed import StoreFeed
from bedside.app.service.schema import SCHEMAS
from bedside.app.simulation import SimulationConfig, simulate_run
from bedside.collectors.ingest import Collector
from bedside.collectors.store import Store
from bedside.detectors.faults import Label
from bedside.detectors.runner import DetectorRunner
from bedside.detectors.scoring import false_alarms, findings_frame, labels_of, match, precision_recall

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

import first_contact_runs as first  # noqa: E402
import foreign_benchmark as foreign  # noqa: E402  (the foreign generator lives with the tests)
from foreign_runs import NOISES as FOREIGN_NOISES  # noqa: E402
from foreign_runs import standout  # noqa: E402

MARGIN = foreign.MARGIN

STEPS = 1500


def scenarios(quick: bool) -> list[tuple[str, list[str]]]:
    """(name, fault specs) of every faulty scenario; magnitude sweeps in the names."""
    out: list[tuple[str, list[str]]] = [("clean", [])]
    for sigma in (5, 8, 20) if quick else (3, 5, 8, 20, 50):
        out.append((f"spike {sigma} sigma", [f"spike:step=600,sigma={sigma}", f"spike:step=1100,sigma={sigma}"]))
    out.append(("spike grad-leading", ["spike:step=700,sigma=10,shape=grad_leading"]))
    out.append(("spike divergent", ["spike:step=900,sigma=10,shape=divergent"]))
    out.append(("nan", ["nan:rank=3,step=800"]))
    for factor in (1.1, 2.0) if quick else (1.02, 1.05, 1.1, 1.5, 2.0):
        out.append((f"straggler x{factor}", [f"straggler:rank=5,factor={factor},from=400"]))
    out.append(("straggler node x1.3", ["straggler:host=1,factor=1.3,from=400"]))
    out.append(("straggler node x1.5 recovers", ["straggler:host=1,factor=1.5,from=300,steps=1000"]))
    out.append(("straggler intermittent x2", ["straggler:rank=2,factor=2,from=400,every=5"]))
    for scale in (4, 20) if quick else (1, 2, 4, 8, 20):
        out.append((f"sdc grad 2^{scale}", [f"sdc_grad:rank=6,step=700,scale_log2={scale}"]))
    out.append(("sdc quiet", ["sdc_quiet:rank=4,step=650,rel=0.001"]))
    out.append(("param corrupt", ["param_corrupt:rank=1,step=655"]))
    out.append(("eval stall", ["eval_stall:from=900"]))
    out.append(("hang", ["hang:rank=3,step=1200"]))
    out.append(("bad shard", ["bad_shard:shard=7,from=500,excess=1.0"]))
    out.append(("throughput drop", ["throughput_drop:from=800,factor=0.8"]))
    return out


def detect(run: Path) -> tuple[pd.DataFrame, list[Label], int]:
    """Every finding of ``run`` in batch mode, its ground truth and its last step."""
    with Store.open(None, schemas=SCHEMAS) as store:
        Collector(run, store).ingest_available()
        findings = detect_store(store)
        labels = labels_of(store.fetch_named("score_labels"))
        last = int(store.fetch_named("score_steps")["last_step"].iloc[0])
        return findings_frame(findings), labels, last


def score(run: Path, scenario: str, noise: str) -> tuple[pd.DataFrame, pd.DataFrame, int]:
    """``run``'s labels matched (with the scenario and noise), its false alarms, and its steps."""
    findings, labels, last = detect(run)
    matches = match(findings, labels, MARGIN).assign(scenario=scenario, noise=noise)
    return matches, false_alarms(findings, labels, MARGIN), last


def streaming_cost(ranks: int = 1024, steps: int = 200) -> dict[int, float]:
    """Milliseconds per step for the runner to take ``ranks`` ranks' rows, by steps per update."""
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / "run"
        simulate_run(SimulationConfig(ranks=ranks, steps=steps, eval_every=50), run)
        with Store.open(None, schemas=SCHEMAS) as store:
            Collector(run, store).ingest_available()
            batch = StoreFeed(store).next_batch()
        costs = {}
        for per_update in (1, 10):
            runner = DetectorRunner()
            runner.run.world_size = ranks
            parts = batch.split_by_time(steps // per_update)  # as a live feed reads: every file up to a time
            started = time.perf_counter()
            for part in parts:
                runner.update(part)
            costs[per_update] = (time.perf_counter() - started) * 1e3 / steps
        return costs


def simulated_quality(args: argparse.Namespace) -> None:
    """The simulated scenarios and the recorded trainer runs, scored; then the streaming cost."""
    scored: list[tuple[pd.DataFrame, pd.DataFrame, int]] = []
    tmp = Path(tempfile.mkdtemp(prefix="detect-quality-"))
    try:
        for noise in args.noise.split(","):
            for seed in range(args.seeds):
                for name, specs in scenarios(args.quick):
                    run = tmp / f"{noise}-{seed}-{len(scored)}-{name.replace(' ', '_')}"
                    simulate_run(
                        SimulationConfig(ranks=args.ranks, steps=STEPS, seed=seed, noise=noise, inject=tuple(specs)),
                        run,
                    )
                    scored.append(score(run, name, noise))
                    shutil.rmtree(run)
        for sample in ("tiny-faults", "tiny-rewind"):
            copy = tmp / sample
            shutil.copytree(ROOT / "sample_runs" / sample, copy)
            scored.append(score(copy, f"trainer {sample}", "real"))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    matches, alarms = (pd.concat([part[i] for part in scored], ignore_index=True) for i in (0, 1))
    report(matches, alarms, sum(part[2] for part in scored))
    for per_update, cost in streaming_cost().items():
        print(
            f"streaming update cost, {per_update} step(s) per update: {cost:.2f} ms per step at 1,024 ranks "
            "(all detectors)"
        )


def foreign_quality(args: argparse.Namespace) -> None:
    """The foreign generator's scenarios under each of its noise models, checked for honesty and scored."""
    scored = [
        foreign.score(build(seed, model), model)
        for model in FOREIGN_NOISES
        for seed in range(args.foreign_seeds)
        for build in foreign.scenarios(args.quick).values()
    ]
    print(f"foreign runs: {honesty(scored)}")
    matches = pd.concat([s.matches for s in scored], ignore_index=True)
    alarms = pd.concat([s.alarms for s in scored], ignore_index=True)
    print(f"steps scored: {sum(s.steps for s in scored):,}; runs: {len(scored)}\n")
    print(precision_recall(matches, alarms, sum(s.steps for s in scored)).to_string(index=False))
    print("\nrecall by scenario and noise:")
    print(matches.pivot_table(index="scenario", columns="noise", values="found", aggfunc="mean").round(2).to_string())
    print("\nrecall by magnitude (spikes: ratio to the trend of their metric; stragglers: factor):")
    table = matches.pivot_table(index=["kind", "magnitude"], columns="noise", values="found", aggfunc="mean")
    print(table.round(2).to_string())
    print("\nnamed rows:")
    print(named_rows(scored).to_string(index=False))


def honesty(scored: list[foreign.Scored]) -> str:
    """Raise when a labelled fault does not stand out of its run's unlabelled excursions; else the smallest margin."""
    margins = ((standout(s.run), s.run.name) for s in scored)
    low = min((margin, name) for margin, name in margins if margin is not None)
    if low[0] <= 1.0:
        raise AssertionError(f"{low[1]}: a labelled fault is no larger than the run's unlabelled excursions")
    return (
        f"every labelled fault stands out (smallest ratio to the largest unlabelled excursion: {low[0]:.2f}, {low[1]})"
    )


def named_rows(scored: list[foreign.Scored]) -> pd.DataFrame:
    """Each named row: runs passed, and the figures measured."""
    rows = []
    for name, verdict in foreign.NAMED.items():
        verdicts = [verdict(s) for s in scored if s.run.name == name]
        figures = pd.Series([figure for _, figure in verdicts]).value_counts()
        rows.append(
            {
                "row": name,
                "passed": f"{sum(ok for ok, _ in verdicts)} of {len(verdicts)}",
                "measured": "; ".join(f"{n} x {figure}" for figure, n in figures.items()),
            }
        )
    rows += [clean_rate(scored), moe_rates(scored)]
    return pd.DataFrame(rows)


def per_10k(alarms: int, runs: list[foreign.Scored]) -> float:
    return alarms / sum(s.steps for s in runs) * 1e4


def clean_rate(scored: list[foreign.Scored]) -> dict[str, str]:
    runs = [s for s in scored if s.run.name == "clean long curve"]
    rate = per_10k(sum(len(s.alarms) for s in runs), runs)
    steps = sum(s.steps for s in runs)
    return {
        "row": "clean long curve",
        "passed": "met" if rate <= 0.1 else "NOT MET",
        "measured": f"{rate:.2f} alarms per 10k steps (target <= 0.1) over {steps:,} steps",
    }


def moe_rates(scored: list[foreign.Scored]) -> dict[str, str]:
    runs = [s for s in scored if s.run.name == "moe bursts"]
    matches = pd.concat([s.matches for s in runs])
    by_kind = pd.concat([s.alarms for s in runs])["kind"].value_counts()
    rate = per_10k(int(by_kind.sum()), runs)
    found = {kind: matches.loc[matches["kind"] == kind, "found"] for kind in ("loss_spike", "grad_spike")}
    return {
        "row": "moe bursts",
        "passed": "met" if rate <= 0.1 and all(f.all() for f in found.values()) else "NOT MET",
        "measured": ", ".join(f"{kind} found {int(f.sum())} of {len(f)}" for kind, f in found.items())
        + f"; {rate:.2f} alarms per 10k steps ("
        + ", ".join(f"{kind} {per_10k(n, runs):.2f}" for kind, n in by_kind.items())
        + ")",
    }


def first_contact_quality(args: argparse.Namespace) -> None:
    """The first minutes of runs (tests/first_contact_runs.py), every combination: per fault and size, recall
    within 3 steps of the step the fault has the loss at 2x, its delays, and the alarms before the fault."""
    outcomes = [first.score(case) for case in first.cases(seeds=args.seeds, quick=args.quick)]
    rows = pd.DataFrame(
        {
            "fault": f"{o.case.fault} x{o.case.ratio:g}",
            "onset": o.case.onset,
            "noise": f"{o.case.noise} {o.case.sigma:g}",
            "within_3": o.delay is not None and o.delay <= 3,
            "found": o.delay is not None,
            "delay": o.delay,
            "early_alarms": len(o.early),
            "steps_before": o.case.onset - 1,
        }
        for o in outcomes
    )
    print(f"runs: {len(rows):,}; steps before the faults: {rows['steps_before'].sum():,}\n")
    table = rows.groupby("fault").agg(
        runs=("found", "size"),
        recall_within_3=("within_3", "mean"),
        recall=("found", "mean"),
        median_delay=("delay", "median"),
        p90_delay=("delay", lambda d: d.quantile(0.9)),
    )
    print(table.round(3).to_string())
    print("\nrecall within 3 steps by onset:")
    print(rows.pivot_table(index="fault", columns="onset", values="within_3", aggfunc="mean").round(2).to_string())
    print("\nrecall within 3 steps by noise:")
    print(rows.pivot_table(index="fault", columns="noise", values="within_3", aggfunc="mean").round(2).to_string())
    print("\nalarms before the fault, per 10k steps, by noise:")
    by_noise = rows.groupby("noise")[["early_alarms", "steps_before"]].sum()
    print((by_noise["early_alarms"] / by_noise["steps_before"] * 1e4).round(2).to_string())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--noise", default="gaussian,student,lognormal")
    parser.add_argument("--ranks", type=int, default=16)
    parser.add_argument("--quick", action="store_true", help="fewer magnitudes, shorter long runs")
    parser.add_argument(
        "--suite", default="simulated,foreign,first_contact", help="any of simulated, foreign, first_contact"
    )
    parser.add_argument("--foreign-seeds", type=int, default=3, help="seeds per foreign scenario and noise model")
    args = parser.parse_args()
    suites = args.suite.split(",")
    if "simulated" in suites:
        simulated_quality(args)
    if "foreign" in suites:
        print("\n== foreign runs ==")
        foreign_quality(args)
    if "first_contact" in suites:
        print("\n== first contact ==")
        first_contact_quality(args)


def report(matches: pd.DataFrame, alarms: pd.DataFrame, steps: int) -> None:
    """Print the per-kind table and recall against magnitude."""
    print(f"steps scored: {steps:,}; runs: {matches['scenario'].nunique()} scenarios\n")
    print(precision_recall(matches, alarms, steps).to_string(index=False))
    print("\nrecall by scenario and noise:")
    table = matches.pivot_table(index="scenario", columns="noise", values="found", aggfunc="mean")
    print(table.round(2).to_string())


if __name__ == "__main__":
    main()
