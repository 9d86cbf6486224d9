"""Detector quality on labeled runs: precision, recall, delay, false alarms, culprit accuracy.

Run:  python bench/detect_quality.py [--seeds 3] [--noise gaussian,student,lognormal] [--quick]

Each scenario is simulated (``bedside simulate``'s API: nuisances on, the noise model
varied) with faults of a range of magnitudes, ingested into a store and run through
every detector in batch mode; the recorded runs of our own trainer in sample_runs/ are
scored too. A finding matches a fault when its kind is the fault's expected kind and it
starts within the fault's window plus the kind's tolerance (below). Reported per kind:
precision, recall, median and p90 delay in steps (finding onset - fault onset),
false alarms per 10k clean steps (on runs without faults), culprit-rank accuracy, and
recall against magnitude. Last, the streaming update cost per step at 1,024 ranks, fed one step and ten
steps per update.
"""
from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from bedside.app.simulation.config import SimulationConfig
from bedside.app.simulation.run import simulate_run
from bedside.collectors.ingest import Collector
from bedside.collectors.store import Store
from bedside.detectors.feed import StoreFeed
from bedside.detectors.finding import Finding
from bedside.detectors.registry import finding_kinds
from bedside.detectors.runner import DetectorRunner
from bedside.detectors.session import StoreDetection

ROOT = Path(__file__).resolve().parents[1]
TOLERANCE = {name: kind.tolerance for name, kind in finding_kinds().items()}
"""Steps after a fault's window within which a finding still counts as finding it, as each detector declares."""
LEAD = {name: kind.lead for name, kind in finding_kinds().items()}
"""Steps before a fault's onset where a finding may start: change-point detectors date the onset back."""

STEPS = 1500


def scenarios(quick: bool) -> list[tuple[str, list[str]]]:
    """(name, fault specs) of every faulty scenario; magnitude sweeps in the names."""
    out: list[tuple[str, list[str]]] = [("clean", [])]
    for sigma in ((5, 8, 20) if quick else (3, 5, 8, 20, 50)):
        out.append((f"spike {sigma} sigma", [f"spike:step=600,sigma={sigma}", f"spike:step=1100,sigma={sigma}"]))
    out.append(("spike grad-leading", ["spike:step=700,sigma=10,shape=grad_leading"]))
    out.append(("spike divergent", ["spike:step=900,sigma=10,shape=divergent"]))
    out.append(("nan", ["nan:rank=3,step=800"]))
    for factor in ((1.1, 2.0) if quick else (1.02, 1.05, 1.1, 1.5, 2.0)):
        out.append((f"straggler x{factor}", [f"straggler:rank=5,factor={factor},from=400"]))
    out.append(("straggler node x1.3", ["straggler:host=1,factor=1.3,from=400"]))
    out.append(("straggler intermittent x2", ["straggler:rank=2,factor=2,from=400,every=5"]))
    for scale in ((4, 20) if quick else (1, 2, 4, 8, 20)):
        out.append((f"sdc grad 2^{scale}", [f"sdc_grad:rank=6,step=700,scale_log2={scale}"]))
    out.append(("sdc quiet", ["sdc_quiet:rank=4,step=650,rel=0.001"]))
    out.append(("param corrupt", ["param_corrupt:rank=1,step=655"]))
    out.append(("eval stall", ["eval_stall:from=900"]))
    out.append(("hang", ["hang:rank=3,step=1200"]))
    out.append(("bad shard", ["bad_shard:shard=7,from=500,excess=1.0"]))
    out.append(("throughput drop", ["throughput_drop:from=800,factor=0.8"]))
    return out


@dataclass(frozen=True)
class Label:
    kind: str
    first: int
    last: int
    ranks: tuple[int, ...]
    magnitude: object


def detect(run: Path) -> tuple[list[Finding], list[Label], int]:
    """Every finding of ``run`` in batch mode, its ground truth and its last step."""
    with Store.open(None) as store:
        Collector(run, store).ingest_available()
        detection = StoreDetection(store)
        detection.update()
        detection.finish()
        labels = store.cursor().execute(
            "SELECT step, target_ranks, args FROM fault_labels ORDER BY step").fetchall()
        last = store.cursor().execute("SELECT coalesce(max(step), 0) FROM steps").fetchall()[0][0]
        return detection.runner.ordered(), [_label(*row) for row in labels], int(last)


def _label(step: int, target_ranks: str, args: str) -> Label:
    a = json.loads(args)
    kind = a["expected_kind"]
    last = a.get("last") if a.get("last") is not None else a.get("first", step)
    return Label(kind, int(a.get("first", step)), int(last), tuple(json.loads(target_ranks or "[]")),
                 a.get("magnitude"))


def match(findings: list[Finding], labels: list[Label]) -> tuple[list[dict], list[Finding]]:
    """Per label: found or not, delay, culprit; and the findings that match no label (false alarms)."""
    used: set[str] = set()
    rows = []
    for label in labels:
        hits = [f for f in findings if f.kind == label.kind
                and label.first - LEAD.get(label.kind, 2) <= f.start_step <= label.last + TOLERANCE[label.kind]]
        used.update(f.finding_id for f in hits)
        first = min(hits, key=lambda f: f.start_step) if hits else None
        culprit = None
        if first is not None and label.ranks and len(label.ranks) < 64 and first.ranks:
            culprit = set(first.ranks) <= set(label.ranks)
        rows.append({"kind": label.kind, "found": first is not None, "magnitude": label.magnitude,
                     "delay": first.start_step - label.first if first else None, "culprit": culprit})
    related = {label.kind for label in labels}
    # findings of a kind the scenario injected, or that the injected fault causes, are not false alarms
    spurious = [f for f in findings if f.finding_id not in used and not _caused(f, labels, related)]
    return rows, spurious


def _caused(finding: Finding, labels: list[Label], related: set[str]) -> bool:
    """Consequences, not false alarms: e.g. a NaN or a spike also moves the grad norm; a hang stops throughput."""
    consequences = {"loss_spike": {"grad_spike", "nonfinite", "bad_shard"}, "nonfinite": {"loss_spike", "grad_spike"},
                    "bad_shard": {"loss_spike", "grad_spike"}, "hang": {"throughput_drop", "straggler"},
                    "sdc": {"grad_spike", "loss_spike", "nonfinite"}, "straggler": {"throughput_drop"},
                    "throughput_drop": {"straggler"}, "eval_stall": set()}
    return any(finding.kind in consequences.get(label.kind, set())
               and label.first - 5 <= finding.start_step <= label.last + 200 for label in labels)


def streaming_cost(ranks: int = 1024, steps: int = 200) -> dict[int, float]:
    """Milliseconds per step for the runner to take ``ranks`` ranks' rows, by steps per update."""
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / "run"
        simulate_run(SimulationConfig(ranks=ranks, steps=steps, eval_every=50), run)
        with Store.open(None) as store:
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
    results, false_alarms, clean_steps = [], defaultdict(int), 0
    tmp = Path(tempfile.mkdtemp(prefix="detect-quality-"))
    try:
        for noise in args.noise.split(","):
            for seed in range(args.seeds):
                for name, specs in scenarios(args.quick):
                    run = tmp / f"{noise}-{seed}-{len(results)}-{name.replace(' ', '_')}"
                    simulate_run(SimulationConfig(ranks=args.ranks, steps=STEPS, seed=seed, noise=noise,
                                                  inject=tuple(specs)), run)
                    findings, labels, last = detect(run)
                    rows, spurious = match(findings, labels)
                    results += [{**r, "scenario": name, "noise": noise} for r in rows]
                    for f in spurious:
                        false_alarms[f.kind] += 1
                    clean_steps += last
                    shutil.rmtree(run)
        for sample in ("tiny-faults", "tiny-rewind"):
            copy = tmp / sample
            shutil.copytree(ROOT / "sample_runs" / sample, copy)
            findings, labels, last = detect(copy)
            rows, spurious = match(findings, labels)
            results += [{**r, "scenario": f"trainer {sample}", "noise": "real"} for r in rows]
            for f in spurious:
                false_alarms[f.kind] += 1
            clean_steps += last
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    report(pd.DataFrame(results), false_alarms, clean_steps)
    for per_update, cost in streaming_cost().items():
        print(f"streaming update cost, {per_update} step(s) per update: {cost:.2f} ms per step at 1,024 ranks "
              "(all detectors)")


def report(results: pd.DataFrame, false_alarms: dict[str, int], steps: int) -> None:
    """Print the per-kind table and recall against magnitude."""
    rows = []
    for kind, group in results.groupby("kind"):
        delays = group["delay"].dropna()
        culprits = group["culprit"].dropna()
        found = int(group["found"].sum())
        fa = false_alarms.get(kind, 0)
        rows.append({"kind": kind, "faults": len(group), "recall": round(group["found"].mean(), 3),
                     "precision": round(found / (found + fa), 3) if found + fa else float("nan"),
                     "median_delay": delays.median() if len(delays) else None,
                     "p90_delay": delays.quantile(0.9) if len(delays) else None,
                     "false_alarms_per_10k": round(fa / steps * 1e4, 2),
                     "culprit_accuracy": round(culprits.astype(float).mean(), 3) if len(culprits) else None})
    for kind in sorted(set(false_alarms) - set(results["kind"])):
        rows.append({"kind": kind, "faults": 0, "false_alarms_per_10k": round(false_alarms[kind] / steps * 1e4, 2)})
    print(f"steps scored: {steps:,}; runs: {results['scenario'].nunique()} scenarios\n")
    print(pd.DataFrame(rows).to_string(index=False))
    print("\nrecall by scenario and noise:")
    table = results.pivot_table(index="scenario", columns="noise", values="found", aggfunc="mean")
    print(table.round(2).to_string())


if __name__ == "__main__":
    main()
