"""The labeled benchmark's foreign half: scenarios drawn by tests/foreign_runs.py, scored, and the named rows.

Used by ``bench/detect_quality.py`` (every scenario, several seeds and noise models) and
``tests/test_foreign_runs.py`` (a few small ones). Each scenario builds one run from a seed and a noise model;
``score`` runs every detector over it as a library (``bedside.detectors.detect``) and matches the findings
against its labels with ``bedside.detectors.scoring``. The named rows judge one scenario's findings each:
a pass or a fail and the figure measured.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd
from foreign_runs import ForeignRun, Spike, curve_run, pipeline_run

from bedside.detectors import detect
from bedside.detectors.finding import Finding
from bedside.detectors.registry import finding_kinds
from bedside.detectors.scoring import Margin, false_alarms, findings_frame, match

MARGIN = Margin(by_kind={name: (kind.lead, kind.tolerance) for name, kind in finding_kinds().items()})
"""Per kind, the steps before a fault's onset and after its window within which a finding still counts as
finding it, as each detector declares them (``FindingKind``)."""

Build = Callable[[int, str], ForeignRun]


def spikes_run(ratio: float, steps: int = 3000) -> Build:
    return lambda seed, model: curve_run(
        f"spike x{ratio:g}", seed, steps, model=model, spikes=(Spike(1200, ratio), Spike(2200, ratio))
    )


def moe_run(steps: int) -> Build:
    """MoE bursts (a burst about every 300 steps) and four catastrophic spikes of 2-5x at drawn steps."""

    def build(seed: int, model: str) -> ForeignRun:
        rng = np.random.default_rng(10_000 + seed)
        at = np.sort(rng.choice(np.arange(steps // 10, steps - 100, 200), 4, replace=False))
        spikes = tuple(Spike(int(s), float(r)) for s, r in zip(at, rng.choice([2.0, 3.0, 5.0], 4)))
        return curve_run("moe bursts", seed, steps, model=model, spikes=spikes, moe_every=300)

    return build


def short_run(seed: int, model: str) -> ForeignRun:
    """30 to 100 steps, a 3x spike three quarters in."""
    steps = int(np.random.default_rng(seed).integers(30, 101))
    return curve_run("short run x3", seed, steps, model=model, spikes=(Spike(3 * steps // 4, 3.0),))


def straggler_run(factor: float) -> Build:
    return lambda seed, model: pipeline_run(
        f"pipeline straggler x{factor:g}", seed, 400, model=model, sick=(5 + seed % 8, factor, 150)
    )


def scenarios(quick: bool) -> dict[str, Build]:
    """Every scenario of the per-kind table, by name."""
    long = 10_000 if quick else 30_000
    out: dict[str, Build] = {
        "clean long curve": lambda seed, model: curve_run("clean long curve", seed, long, model=model),
        "moe bursts": moe_run(long),
        "short run x3": short_run,
        "spike after spike": lambda seed, model: curve_run(
            "spike after spike", seed, 400, model=model, spikes=(Spike(200, 3.0), Spike(240, 3.0))
        ),
        "plateau": lambda seed, model: curve_run(
            "plateau", seed, 400, model=model, spikes=(Spike(220, 3.0, last=222),)
        ),
        "sick worker from the start": lambda seed, model: pipeline_run(
            "sick worker from the start", seed, 44, model=model, sick=(9, 2.2, 0)
        ),
        "structural stage": lambda seed, model: pipeline_run(
            "structural stage", seed, 44 if seed % 2 else 300, model=model, last_stage=1.4
        ),
    }
    out |= {f"spike x{r:g}": spikes_run(r) for r in ((2.0, 5.0) if quick else (1.5, 2.0, 3.0, 5.0))}
    out |= {f"pipeline straggler x{f:g}": straggler_run(f) for f in ((1.3,) if quick else (1.1, 1.3, 2.0))}
    return out


@dataclass(frozen=True)
class Scored:
    """One run's findings, its labels matched, its false alarms and its steps."""

    run: ForeignRun
    findings: list[Finding]
    matches: pd.DataFrame
    alarms: pd.DataFrame

    @property
    def steps(self) -> int:
        return self.run.steps


def score(run: ForeignRun, noise: str) -> Scored:
    """Every detector over ``run``, scored against its labels."""
    findings = detect(**run.frames).findings
    frame = findings_frame(findings)
    matches = match(frame, run.labels, MARGIN).assign(scenario=run.name, noise=noise)
    return Scored(run, findings, matches, false_alarms(frame, run.labels, MARGIN))


def alarms_of(scored: Scored, kind: str) -> list[Finding]:
    return [f for f in scored.findings if f.kind == kind and f.severity.value != "info"]


def both_spikes(scored: Scored) -> tuple[bool, str]:
    found = int(scored.matches.loc[scored.matches["kind"] == "loss_spike", "found"].sum())
    return found == 2, f"{found} of 2 loss spikes found"


def one_plateau(scored: Scored) -> tuple[bool, str]:
    """One loss-spike alarm starting at 220 and reaching 222 at least, and no other from 200 to 260."""
    near = [f for f in alarms_of(scored, "loss_spike") if f.end_step >= 200 and f.start_step <= 260]
    spans = ", ".join(f"{f.start_step}-{f.end_step}" for f in near) or "none"
    return len(near) == 1 and near[0].start_step == 220 and near[0].end_step >= 222, f"loss spike {spans}"


def sick_named(scored: Scored) -> tuple[bool, str]:
    """The sick rank found as a straggler alarm naming it alone (alarms on other ranks are counted in the figure
    and as false alarms of the per-kind table)."""
    [label] = scored.run.labels
    alarms = alarms_of(scored, "straggler")
    named = [f for f in alarms if f.ranks == label.ranks]
    ratio = named[0].evidence.get("peer_ratio") if named else None
    figure = f"named, x{ratio:.1f} its peers" if ratio else "not named"
    others = len(alarms) - len(named)
    return bool(named), figure + (f"; {others} other alarm(s)" if others else "")


def structural_only(scored: Scored) -> tuple[bool, str]:
    """No straggler warning or critical; the slower stage reported as structural (info)."""
    alarms = alarms_of(scored, "straggler")
    structural = [f for f in scored.findings if f.kind == "straggler" and f.evidence.get("scope") == "structural"]
    figure = f"{len(alarms)} straggler alarm(s), {'a' if structural else 'no'} structural info finding"
    return not alarms and bool(structural), figure


NAMED: dict[str, Callable[[Scored], tuple[bool, str]]] = {
    "spike after spike": both_spikes,
    "plateau": one_plateau,
    "sick worker from the start": sick_named,
    "structural stage": structural_only,
}
"""The named rows judged run by run: scenario name to its verdict (passed, figure)."""
