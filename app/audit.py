"""``bedside audit verify RUN``: check the audit trail's hash chain, and the heads the store recorded."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from bedside.collectors.errors import StoreError, StoreLockedError
from bedside.collectors.layout import RunLayout, require_run_dir

if TYPE_CHECKING:
    from bedside.collectors.audit import AuditHead

BROKEN_EXIT = 1


def add_parser(commands: argparse._SubParsersAction) -> None:
    """Register ``bedside audit``."""
    p = commands.add_parser(
        "audit",
        help="check a run's audit trail",
        description="The audit trail (RUN/control/audit.jsonl) is hash-chained: each entry "
        "carries the hash of the one before it (docs/security.md).",
    )
    verbs = p.add_subparsers(dest="verb", required=True, metavar="VERB")
    verify = verbs.add_parser(
        "verify",
        help="report the first broken link of the chain (exit status 1)",
        description="Check every entry's hash and link, then the heads the run's store "
        "recorded; print the first broken link and exit 1, else the head.",
    )
    verify.add_argument("run", type=Path, help="run directory")
    verify.set_defaults(handler=cmd_verify)


def cmd_verify(args: argparse.Namespace) -> int:
    """Print whether the chain holds, and against what."""
    from bedside.collectors import audit

    layout = RunLayout(require_run_dir(args.run))
    recorded, against = recorded_heads(layout)
    report = audit.verify(layout, recorded)
    if report.broken:
        print(f"audit trail of {args.run} is broken: {report.broken}")
        return BROKEN_EXIT
    if report.head is None:
        print(f"audit trail of {args.run}: no entries ({against})")
        return 0
    print(
        f"audit trail of {args.run}: {len(report.entries)} entries, chain intact, head entry {report.head.seq} "
        f"{report.head.hash[:16]} ({against})"
    )
    return 0


def recorded_heads(layout: RunLayout) -> tuple[list[AuditHead] | None, str]:
    """The heads the run's store recorded, read-only, and what the check was made against, in words."""
    from bedside.collectors.audit import read_heads
    from bedside.collectors.store import DatabaseError, Store

    if not layout.store.exists():
        return None, "no store: the chain alone was checked, which cannot tell a trail cut short"
    try:
        store = Store.open(layout.store, read_only=True)
    except StoreLockedError:
        return None, (
            "the store is held by another process, which checks the heads it recorded on every pass: "
            "the chain alone was checked here"
        )
    except StoreError as exc:
        return None, f"the store cannot be read ({exc}): the chain alone was checked"
    try:
        heads = read_heads(store)
    except DatabaseError:
        return None, "the store predates recorded heads: the chain alone was checked"
    finally:
        store.close()
    return heads, f"checked against {len(heads)} head(s) the store recorded"
