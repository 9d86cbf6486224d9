"""``bedside query``: one read-only SELECT over a run's views, printed as a table, CSV or JSON."""

from __future__ import annotations

import argparse
from pathlib import Path

from bedside.collectors.defaults import DEFAULT_MAX_ROWS, DEFAULT_QUERY_TIMEOUT_S

from .options import FORMATS, integer_in, positive_seconds


def add_parser(commands: argparse._SubParsersAction) -> None:
    """Register ``bedside query``."""
    p = commands.add_parser(
        "query",
        help="run read-only SQL over a run's views",
        description="Run one read-only SELECT over the documented views of RUN "
        "(docs/schema.md). Works while another process holds the store.",
    )
    p.add_argument("run", type=Path, help="run directory")
    p.add_argument("sql", help='one SELECT statement, e.g. "SELECT * FROM run"')
    p.add_argument("--format", choices=FORMATS, default="table", help="output format (default table)")
    p.add_argument(
        "--timeout",
        type=positive_seconds,
        default=DEFAULT_QUERY_TIMEOUT_S,
        metavar="S",
        help=f"stop the query after S seconds, S > 0 (default {DEFAULT_QUERY_TIMEOUT_S:g})",
    )
    p.add_argument(
        "--max-rows",
        type=integer_in(1, 10**9),
        default=DEFAULT_MAX_ROWS,
        metavar="N",
        help=f"print at most N rows, and say so when the result is cut (default {DEFAULT_MAX_ROWS:,})",
    )
    p.set_defaults(handler=cmd_query)


def cmd_query(args: argparse.Namespace) -> int:
    """One read-only SELECT over the run's views, printed in the chosen format."""
    from bedside.collectors.query import run_query
    from bedside.collectors.store.console import ConsoleLimits

    from .output import print_frame, warn
    from .service.schema import SCHEMAS

    limits = ConsoleLimits(timeout_s=args.timeout, max_rows=args.max_rows)
    result, view = run_query(args.run, args.sql, limits, schemas=SCHEMAS)
    if view.note:
        warn(view.note)
    print_frame(result.frame, args.format)
    if result.truncated:
        warn(result.cut_note(limits))
    return 0
