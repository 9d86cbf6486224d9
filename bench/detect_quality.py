"""Detector quality on labeled runs: precision, recall, delay, false alarms, culprit accuracy.

Run:  python bench/detect_quality.py [--seeds 3] [--noise gaussian,student,lognormal] [--quick]

Each scenario is simulated (``bedside simulate``'s API: nuisances on, the noise model
varied) with faults of a range of magnitudes, ingested into a store and run through
every detector in batch mode; the recorded runs of our own trainer in sample_runs/ are
scored too. Findings are scored against the ground truth by detectors/scoring.py, with
a margin per kind (below). Reported per kind: precision, recall, median and p90 delay in
steps (finding onset - fault onset), false alarms per 10k steps, culprit-rank accuracy,
and recall against magnitude. Last, the streaming update cost per step at 1,024 ranks, fed one step and ten
steps per update.
"""

from __future__ import annotations

import argparse
import shutil
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
from bedside.detectors.registry import finding_kinds
from bedside.detectors.runner import DetectorRunner
from bedside.detectors.scoring import Margin, false_alarms, findings_frame, labels_of, match, precision_recall

ROOT = Path(__file__).resolve().parents[1]
MARGIN = Margin(by_kind={name: (kind.lead, kind.tolerance) for name, kind in finding_kinds().items()})
"""Per kind, the steps before a fault's onset (change-point detectors date the onset back) and after its window
within which a finding still counts as finding it, as each detector declares them (``FindingKind``)."""

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--noise", default="gaussian,student,lognormal")
    parser.add_argument("--ranks", type=int, default=16)
    parser.add_argument("--quick", action="store_true", help="fewer magnitudes")
    args = parser.parse_args()
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


def report(matches: pd.DataFrame, alarms: pd.DataFrame, steps: int) -> None:
    """Print the per-kind table and recall against magnitude."""
    print(f"steps scored: {steps:,}; runs: {matches['scenario'].nunique()} scenarios\n")
    print(precision_recall(matches, alarms, steps).to_string(index=False))
    print("\nrecall by scenario and noise:")
    table = matches.pivot_table(index="scenario", columns="noise", values="found", aggfunc="mean")
    print(table.round(2).to_string())


if __name__ == "__main__":
    main()
