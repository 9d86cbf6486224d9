"""Runs every detector over batches of new telemetry and keeps the latest version of each finding."""

from __future__ import annotations

from collections.abc import Iterable

from .crossrank import CrossRankDetector, SharedSteps
from .detector import Detector
from .finding import Finding
from .registry import build_detectors
from .telemetry import RunState, TelemetryBatch


class DetectorRunner:
    """Feeds each batch to every detector (sharing one ``RunState``, and the steps assembled across ranks);
    findings by ``finding_id``."""

    def __init__(self, detectors: Iterable[Detector] | None = None, run: RunState | None = None) -> None:
        self.run = run or RunState()
        self.detectors = list(build_detectors() if detectors is None else detectors)
        for detector in self.detectors:
            detector.bind(self.run)
        self._steps = SharedSteps(d for d in self.detectors if isinstance(d, CrossRankDetector))
        self.findings: dict[str, Finding] = {}

    def update(self, batch: TelemetryBatch) -> list[Finding]:
        """Feed new rows; the findings opened or changed by them (latest version of each)."""
        self.run.observe(batch)
        shared = self._steps.take(batch, self.run)
        return self._keep(f for d in self.detectors for f in (shared[d] if d in shared else d.update(batch)))

    def finish(self) -> list[Finding]:
        """The data ended (a finished run, or batch mode): what that settles."""
        shared = self._steps.settle(self.run)
        return self._keep(f for d in self.detectors for f in (shared[d] if d in shared else d.finish()))

    def tick(self, now: float) -> list[Finding]:
        """Time passed without new rows (live runs)."""
        return self._keep(f for d in self.detectors for f in d.tick(now))

    def _keep(self, found: Iterable[Finding]) -> list[Finding]:
        changed: dict[str, Finding] = {}
        for finding in found:
            if self.findings.get(finding.finding_id) != finding:
                changed[finding.finding_id] = finding
                self.findings[finding.finding_id] = finding
        return list(changed.values())

    def ordered(self) -> list[Finding]:
        """Every finding, latest version, by timeline and onset."""
        return sorted(self.findings.values(), key=lambda f: (f.timeline, f.start_step, f.kind, f.ranks))
