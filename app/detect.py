"""``bedside detect``: run every detector over a run in batch mode and print the findings."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from bedside.collectors.layout import require_run_dir

from .options import integer_in

if TYPE_CHECKING:
    import pandas as pd

    from bedside.detectors.finding import Finding


def add_parser(commands: argparse._SubParsersAction) -> None:
    """Register ``bedside detect``."""
    p = commands.add_parser(
        "detect",
        help="run the detectors over a run and print what they find",
        description="Ingest what RUN holds, run every detector over it in batch mode, keep the "
        "findings and incidents in its store, and print the findings.",
    )
    p.add_argument("run", type=Path, help="run directory")
    p.add_argument("--json", action="store_true", help="one JSON object per finding and line (keys: docs/detectors.md)")
    p.add_argument("--since", type=integer_in(0), metavar="STEP", help="only findings that reach STEP or later")
    p.set_defaults(handler=cmd_detect)


def cmd_detect(args: argparse.Namespace) -> int:
    """Detect, then print; exit 0 whether or not there are findings."""
    from .output import print_frame
    from .service.detection import detect_run

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


def _table(findings: list[Finding]) -> pd.DataFrame:
    import pandas as pd

    return pd.DataFrame(
        [
            {
                "kind": f.kind,
                "severity": f.severity.value,
                "timeline": f.timeline,
                "steps": f"{f.start_step}-{f.end_step}",
                "ranks": ",".join(map(str, f.ranks)),
                "score": round(f.score, 1),
                "action": f.suggested_action.action,
                "summary": f.summary,
            }
            for f in findings
        ]
    )
