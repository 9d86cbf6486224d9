"""``bedside alert test``: prove that each configured notifier can be reached; and where settings come from."""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from bedside.collectors.display_text import visible
from bedside.collectors.errors import BedsideError
from bedside.collectors.layout import RunLayout
from bedside.collectors.runinfo import read_run_info

from .service.alerts.config import CONFIG_NAME, find_config, load_settings

if TYPE_CHECKING:
    from .service.alerts.payload import RunRef


def add_parser(commands: argparse._SubParsersAction) -> None:
    """Register ``bedside alert`` and its ``test`` sub-command."""
    p = commands.add_parser(
        "alert",
        help="check the alert configuration: send a test message",
        description="Commands about the notifiers of bedside.toml (docs/alerts.md).",
    )
    actions = p.add_subparsers(dest="alert_command", required=True, metavar="ACTION")
    t = actions.add_parser(
        "test",
        help="send a test message to one or every notifier",
        description="Send a test message to each notifier (or the one named) now, and report "
        "what each receiver answered. Exit 2 when any delivery failed.",
    )
    t.add_argument(
        "run",
        type=Path,
        nargs="?",
        help="a run directory: its bedside.toml (or its parent's) is used, and its name is in the message",
    )
    t.add_argument(
        "--config",
        type=Path,
        metavar="FILE",
        help=f"alert configuration (default: {CONFIG_NAME} of RUN, else ./{CONFIG_NAME})",
    )
    t.add_argument("--notifier", metavar="NAME", help="only this notifier")
    t.set_defaults(handler=cmd_alert_test)


def cmd_alert_test(args: argparse.Namespace) -> int:
    """Deliver one test message per notifier, synchronously; print each outcome."""
    from .service.alerts.delivery import deliver
    from .service.alerts.payload import probe_payload

    path = args.config or find_config(args.run) or (Path(CONFIG_NAME) if Path(CONFIG_NAME).is_file() else None)
    if path is None:
        raise BedsideError(f"no {CONFIG_NAME} found: pass --config FILE (see docs/alerts.md)")
    settings = load_settings(path, os.environ)
    notifiers = [settings.notifier(args.notifier)] if args.notifier else list(settings.notifiers)
    if not notifiers:
        raise BedsideError(f"{path} configures no notifiers")
    run = _run_ref(args.run)
    failed = 0
    for notifier in notifiers:
        now = time.time()
        payload = probe_payload(
            f"{run.name}/{notifier.name}/test/{int(now * 1000)}", run, notifier=notifier.name, now=now
        )
        outcome = deliver(notifier, payload)
        took = time.time() - now
        state = "delivered" if outcome.delivered else "FAILED"
        said = visible(outcome.detail)  # the receiver's words
        print(f"{notifier.name} ({notifier.type}, {notifier.destination}): {state} in {took:.2f} s: {said}")
        failed += not outcome.delivered
    if failed:
        print(f"bedside: error: {failed} of {len(notifiers)} notifiers could not be reached", file=sys.stderr)
        return 2
    return 0


def _run_ref(run_dir: Path | None) -> RunRef:
    from .service.alerts.payload import RunRef

    if run_dir is None:
        return RunRef("", "bedside")
    try:
        info = read_run_info(RunLayout(run_dir))
    except BedsideError:
        info = None
    return RunRef(info.run_id, info.name) if info else RunRef("", run_dir.resolve().name)
