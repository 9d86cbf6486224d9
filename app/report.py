"""``bedside report``: a run's post-mortem as one self-contained HTML page, or as a Markdown ticket."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bedside.collectors.errors import BedsideError

REPORT_FORMATS = ("html", "md")


def add_parser(commands: argparse._SubParsersAction) -> None:
    """Register ``bedside report``."""
    p = commands.add_parser(
        "report",
        help="write a run's post-mortem: one HTML file that works offline, or a Markdown ticket",
        description="Tell what happened to RUN: its summary, the incidents with every decision, operator, reason "
        "and outcome, eval against compute, the training curves of every timeline, the ranks around each "
        "straggler, the checkpoints and the goodput ledger. Reads the store read-only (the raw telemetry when "
        "another process holds it) and never writes into the run.",
    )
    p.add_argument("run", type=Path, help="run directory")
    p.add_argument("-o", "--out", type=Path, metavar="FILE", help="write the report to FILE (default: standard output)")
    p.add_argument("--format", choices=REPORT_FORMATS, default="html", help="html (default) or md, a Markdown ticket")
    p.set_defaults(handler=cmd_report)


def cmd_report(args: argparse.Namespace) -> int:
    """Read the run, tell it, write it where asked."""
    from bedside.collectors.display_text import visible

    from .output import warn
    from .postmortem.page import render_page
    from .postmortem.reading import read_run
    from .postmortem.story import build_report
    from .postmortem.ticket import render_ticket

    check_destination(args.run, args.out, args.format)
    record = read_run(args.run)
    if record.note:
        warn(record.note)
    report = build_report(record)
    written = render_page(report) if args.format == "html" else render_ticket(report)
    if args.out is None:
        sys.stdout.write(written)
        return 0
    args.out.write_text(written, encoding="utf-8")
    print(f"bedside: report written to {visible(str(args.out))}", file=sys.stderr)
    return 0


def check_destination(run: Path, out: Path | None, fmt: str) -> None:
    """BedsideError for a report that would be written into the run (a viewer never writes there), or an HTML
    page that would flood a terminal."""
    if out is not None and out.resolve().is_relative_to(run.resolve()):
        raise BedsideError(f"{out} is inside the run {run}: a report is written outside the run it reads")
    if out is None and fmt == "html" and sys.stdout.isatty():
        raise BedsideError("an HTML report holds plotly.js (megabytes): write it with -o FILE or redirect it")
