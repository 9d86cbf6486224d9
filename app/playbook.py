"""``bedside playbook {on,off,status} RUN``: the kill switch of automatic playbooks, kept in the audit trail."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from bedside.collectors.display_text import visible
from bedside.collectors.errors import BedsideError
from bedside.collectors.layout import RunLayout, require_run_dir

from .action import default_operator


def add_parser(commands: argparse._SubParsersAction) -> None:
    """Register ``bedside playbook``."""
    p = commands.add_parser(
        "playbook",
        help="switch automatic playbooks off or on for a run, or show their state",
        description="The kill switch of auto mode (docs/playbooks.md): kept as an entry of the run's audit "
        "trail, which the live service reads before each automatic action.",
    )
    p.add_argument("verb", choices=("on", "off", "status"), metavar="VERB", help="on, off or status")
    p.add_argument("run", type=Path, help="run directory")
    p.add_argument("--reason", help="on, off: why (kept in the audit trail; default: says who switched)")
    p.add_argument("--operator", default=default_operator(), help="on, off: who switches (default: $USER)")
    p.add_argument(
        "--config",
        type=Path,
        metavar="FILE",
        help="status: the configuration to show the mode of (default: bedside.toml in RUN, else beside RUN)",
    )
    p.set_defaults(handler=cmd_playbook)


def cmd_playbook(args: argparse.Namespace) -> int:
    """Record the switch in the trail, or print it with the mode and the automatic actions so far."""
    from bedside.collectors import audit

    from .service.playbooks.trail import set_switch

    layout = RunLayout(require_run_dir(args.run))
    if args.verb == "status":
        return _status(layout, args.config)
    try:
        operator = audit.check_operator(args.operator)
        reason = args.reason or f"playbooks switched {args.verb} by {operator}"
        set_switch(layout, args.verb == "on", operator=operator, reason=reason)
    except ValueError as error:
        raise BedsideError(str(error)) from None
    print(f"playbooks {args.verb} for {layout.root} (recorded in the audit trail)")
    return 0


def _status(layout: RunLayout, config: Path | None) -> int:
    from .service.alerts.config import settings_for
    from .service.playbooks.trail import read_history, read_switch

    settings = settings_for(config, layout.root).playbooks
    switch = read_switch(layout)
    mode = settings.mode if settings.configured else "none configured (detectors' own suggestions)"
    print(f"mode: {mode}")
    if switch.broken:
        print(f"switch: off (the audit trail's chain is broken: {visible(switch.broken)})")
    elif switch.entry is None:
        print("switch: on (never switched)")
    else:
        entry = switch.entry
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(entry["time"])))
        state = "on" if switch.enabled else "off"
        print(visible(f"switch: {state}, by {entry.get('operator')} at {when}: {entry.get('reason')}"))
    history = read_history(layout)
    print(
        f"automatic requests so far: {len(history.actions)} for {len({a.incident_id for a in history.actions})} incidents"
    )
    return 0
