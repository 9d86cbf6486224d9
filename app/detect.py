"""``bedside detect``: run every detector over a run in batch mode and print the findings."""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import pandas as pd

from bedside.collectors.errors import StoreLockedError
from bedside.collectors.ingest import Collector, PassResult
from bedside.collectors.layout import RunLayout, require_run_dir
from bedside.collectors.query import open_for_reading
from bedside.collectors.store import Store
from bedside.detectors.alerts.router import AlertRouter
from bedside.detectors.finding import Finding
from bedside.detectors.session import StoreDetection

from .output import integer_in, print_frame, warn


def add_parser(commands: argparse._SubParsersAction) -> None:
    """Register ``bedside detect``."""
    p = commands.add_parser("detect", help="run the detectors over a run and print what they find",
                            description="Ingest what RUN holds, run every detector over it in batch mode, keep the "
                                        "findings and incidents in its store, and print the findings.")
    p.add_argument("run", type=Path, help="run directory")
    p.add_argument("--json", action="store_true",
                   help="one JSON object per finding and line (keys: docs/detectors.md)")
    p.add_argument("--since", type=integer_in(0), metavar="STEP", help="only findings that reach STEP or later")
    p.set_defaults(handler=cmd_detect)


def cmd_detect(args: argparse.Namespace) -> int:
    """Detect, then print; exit 0 whether or not there are findings."""
    findings = detect_run(require_run_dir(args.run))
    if args.since is not None:
        findings = [f for f in findings if f.end_step >= args.since]
    if args.json:
        for finding in findings:
            print(json.dumps(finding.to_json(), separators=(",", ":")))
    elif findings:
        print_frame(_table(findings), "table")
    print(f"{len(findings)} finding{'' if len(findings) == 1 else 's'}", file=sys.stderr)
    return 0


def detect_run(run_dir: Path) -> list[Finding]:
    """Every finding over the run, saved in its store unless another process holds the store."""
    layout = RunLayout(run_dir)
    try:
        store = Store.open(layout.store)
    except StoreLockedError:
        warn("the store is held by another process: detecting over the raw telemetry, findings not saved")
        with open_for_reading(run_dir).store as memory:
            return _detect(memory, persist=False)
    with store:
        Collector(layout.root, store, warn=warn).ingest_available()
        return _detect(store, persist=True)


def _detect(store: Store, *, persist: bool) -> list[Finding]:
    detection = StoreDetection(store, persist=persist)
    detection.update()
    detection.finish()
    return detection.runner.ordered()


def _table(findings: list[Finding]) -> pd.DataFrame:
    return pd.DataFrame([{
        "kind": f.kind, "severity": f.severity.value, "timeline": f.timeline, "steps": f"{f.start_step}-{f.end_step}",
        "ranks": ",".join(map(str, f.ranks)), "score": round(f.score, 1),
        "action": f.suggested_action.action, "summary": f.summary,
    } for f in findings])


class LiveDetection:
    """Detection inside a following collector: after each batch, and on quiet wake-ups; prints what changes.

    The first quiet wake-up replays what the store already holds, whoever ingested it (``bedside collect``
    before ``serve``), so a store with nothing new to ingest is still covered. With an alert router, each
    change's messages go to the outbox with it. ``ran_at`` is when detection last went over the store.
    """

    def __init__(self, store: Store, *, quiet: bool = False, alerts: AlertRouter | None = None) -> None:
        self.detection = StoreDetection(store, alerts=alerts)
        self.quiet = quiet
        self.ran_at: float | None = None
        self._said: dict[str, tuple[bool, str]] = {}

    def update(self, result: PassResult) -> list[Finding]:
        """After an ingest pass (whose backlog says whether ranks' files are level yet); the findings changed."""
        return self._say(self.detection.update(caught_up=not result.backlog))

    def tick(self) -> list[Finding]:
        """A quiet wake-up: the store's rows not fed yet (the first time, all of them), then time passing."""
        replayed = self.detection.update() if self.ran_at is None else []
        return self._say(replayed + self.detection.tick())

    def finish(self) -> list[Finding]:
        return self._say(self.detection.finish())

    def _say(self, changed: list[Finding]) -> list[Finding]:
        """One line when a finding opens, clears or changes severity (not each time it grows)."""
        self.ran_at = time.time()
        for finding in [] if self.quiet else changed:
            now = (finding.active, finding.severity.value)
            if self._said.get(finding.finding_id) != now:
                self._said[finding.finding_id] = now
                state = "open" if finding.active else "cleared"
                print(f"[{finding.severity.value}] {finding.kind} ({state}): {finding.summary}", file=sys.stderr)
        return changed
