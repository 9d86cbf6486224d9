"""``bedside action``: file a control request (rewind, skip, ...) for a live run."""

from __future__ import annotations

import argparse
import getpass
import os
import sys
from pathlib import Path

from bedside.collectors.control import ACTIONS
from bedside.collectors.errors import BedsideError
from bedside.collectors.layout import RunLayout, require_run_dir

from .options import integer_in

_OPTIONS = {"to_step": "--to-step", "first_batch": "--first-batch", "last_batch": "--last-batch", "shard": "--shard"}


def add_parser(commands: argparse._SubParsersAction) -> None:
    """Register ``bedside action``."""
    p = commands.add_parser(
        "action",
        help="ask a live run to rewind, skip batches, pause, stop...",
        description="File a control request in RUN/control/requests/; the trainer applies it "
        "at its next step boundary and acknowledges it in telemetry.",
    )
    p.add_argument("run", type=Path, help="run directory")
    p.add_argument("action", choices=ACTIONS, help="what the run should do")
    p.add_argument("--to-step", type=integer_in(0), metavar="N", help="rewind: the step to go back to (or before)")
    p.add_argument("--first-batch", type=integer_in(0), metavar="B", help="skip: first global batch index")
    p.add_argument("--last-batch", type=integer_in(0), metavar="B", help="skip: last global batch index (inclusive)")
    p.add_argument("--shard", type=integer_in(0), metavar="S", help="quarantine: the data shard to stop reading")
    p.add_argument("--reason", required=True, help="why (kept with the request and its acknowledgement)")
    p.add_argument("--operator", default=_default_operator(), help="who asks (default: $USER)")
    p.set_defaults(handler=cmd_action)


def _default_operator() -> str:
    try:
        return os.environ.get("USER") or getpass.getuser()
    except (KeyError, OSError):
        return "unknown"


def cmd_action(args: argparse.Namespace) -> int:
    """Write the request, record it in the run's audit trail, and print its id and the trail's new head (a copy
    to keep off the machine: ``bedside audit verify --head``); warn on stderr when the run has ended or no control
    reader polls it (filed all the same)."""
    from bedside.collectors import audit
    from bedside.collectors.control_reader import run_reader_warning

    layout = RunLayout(require_run_dir(args.run))
    given = {name: getattr(args, name) for name in _OPTIONS if getattr(args, name) is not None}
    try:
        operator = audit.check_operator(args.operator)
    except ValueError as error:
        raise BedsideError(f"--operator: {error}") from None
    try:
        request_id, head = audit.file_request(layout, args.action, given, operator=operator, reason=args.reason)
    except ValueError as error:
        message = str(error)
        for name, option in _OPTIONS.items():
            message = message.replace(name, option)
        raise BedsideError(message) from None
    print(request_id)
    print(f"audit head {head}")
    if warning := run_reader_warning(layout):
        print(f"bedside: warning: {warning}", file=sys.stderr)
    return 0
