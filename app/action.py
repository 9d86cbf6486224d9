"""``bedside action``: file a control request (rewind, skip, ...) for a live run."""

from __future__ import annotations

import argparse
import getpass
import os
import sys
from pathlib import Path

from bedside.collectors.control import ACTIONS
from bedside.collectors.display_text import visible
from bedside.collectors.errors import BedsideError
from bedside.collectors.layout import RunLayout, require_run_dir

from .options import integer_in, positive_seconds

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
    p.add_argument("--operator", default=default_operator(), help="who asks (default: $USER)")
    p.add_argument(
        "--wait",
        type=positive_seconds,
        metavar="S",
        help="wait up to S seconds for the run's answer and print it; exit 1 if rejected, 4 if not answered",
    )
    p.set_defaults(handler=cmd_action)


def default_operator() -> str:
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
    return _answer(layout, request_id, args.wait) if args.wait else 0


NOT_ANSWERED = 4
"""``bedside action --wait``'s exit status when no answer came in time (1: rejected)."""


def _answer(layout: RunLayout, request_id: str, wait_s: float) -> int:
    """Wait for the run's answer to ``request_id``, print it, and the exit status it calls for."""
    from bedside.collectors.control_reader import await_answer

    answer = await_answer(layout, request_id, wait_s)
    if answer is None:
        print(
            f"not applied: no answer within {wait_s:g} s: the loop has not taken it (it may yet), its file was "
            "removed or hidden from control/requests/, or the loop reads no requests"
        )
        return NOT_ANSWERED
    where = f"at step {answer.get('step')} on timeline {answer.get('timeline')}"
    if answer["status"] == "requested":
        print(f"taken {where}, not yet applied after {wait_s:g} s")
        return NOT_ANSWERED
    message = answer.get("message") or answer["status"]
    print(visible(f"{answer['status']} {where}: {message}"))  # the loop's words: outside text
    return 0 if answer["status"] == "applied" else 1
