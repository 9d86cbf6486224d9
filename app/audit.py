"""``bedside audit verify RUN``: check the audit trail's hash chain against a copy of its head: the heads the
store recorded, a head given from a copy kept elsewhere (an alert, ``bedside action``'s output), or, when asked
explicitly, none."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from bedside.collectors.display_text import visible
from bedside.collectors.errors import StoreError, StoreLockedError
from bedside.collectors.layout import RunLayout, require_run_dir

if TYPE_CHECKING:
    from bedside.collectors.audit import AuditHead

BROKEN_EXIT = 1
NO_HEAD_EXIT = 3
"""The chain holds, but nothing was there to check it against (and ``--no-head`` was not given)."""


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
        description="Check every entry's hash and link, then the heads the run's store recorded and any "
        "head given; print the first broken link and exit 1, else the head. With no head to check "
        f"against, exit {NO_HEAD_EXIT} unless --no-head accepts the chain alone.",
    )
    verify.add_argument("run", type=Path, help="run directory")
    copies = verify.add_mutually_exclusive_group()
    copies.add_argument(
        "--head",
        type=_head,
        action="append",
        metavar="SEQ:HASH",
        help="also check against this copy of the head (an alert's audit_head, bedside action's output); repeatable",
    )
    copies.add_argument(
        "--no-head", action="store_true", help="accept checking the chain alone when no head is there to check against"
    )
    verify.set_defaults(handler=cmd_verify)


def _head(text: str) -> AuditHead:
    from bedside.collectors.audit import AuditHead

    try:
        return AuditHead.parse(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def cmd_verify(args: argparse.Namespace) -> int:
    """Print whether the chain holds, and against which copies of its head."""
    from bedside.collectors import audit

    layout = RunLayout(require_run_dir(args.run))
    recorded, store_words = recorded_heads(layout)
    given: list[AuditHead] = args.head or []
    report = audit.verify(layout, recorded, given)
    against = checked_against(recorded, store_words, given)
    if report.broken:
        print(f"audit trail of {args.run} is broken: {visible(report.broken)} ({against})")
        return BROKEN_EXIT
    held = f"{len(report.entries)} entries, chain intact" if report.head else "no entries"
    if not recorded and not given:
        if not args.no_head:
            print(
                f"audit trail of {args.run}: {held}, but not checked: no head to check against ({store_words}); "
                f"a trail rewritten whole, or deleted with its store, looks the same. Check it against a copy kept "
                f"elsewhere with --head SEQ:HASH (each alert and each action filed carries one), or pass --no-head "
                f"to accept the chain alone"
            )
            return NO_HEAD_EXIT
        against += "; the chain alone was checked (--no-head): it cannot tell a trail cut short or rewritten whole"
    head = f", head entry {report.head.seq} {report.head.hash[:16]}" if report.head else ""
    print(f"audit trail of {args.run}: {held}{head} ({against})")
    return 0


def checked_against(recorded: list[AuditHead] | None, store_words: str, given: list[AuditHead]) -> str:
    """Which copies of the head the check was made against, in words."""
    copies = []
    if given:
        copies.append(f"the head given ({', '.join(f'entry {h.seq}' for h in given)})")
    if recorded:
        copies.append(f"{len(recorded)} head(s) the store recorded")
    if not copies:
        return f"checked against no head: {store_words}"
    return f"checked against {' and '.join(copies)}" + ("" if recorded else f"; the store's copy: none, {store_words}")


def recorded_heads(layout: RunLayout) -> tuple[list[AuditHead] | None, str]:
    """The heads the run's store recorded, read-only (None: it could not be read), and why there are none, in
    words."""
    from bedside.collectors.audit import read_heads
    from bedside.collectors.store import DatabaseError, Store

    if not layout.store.exists():
        return None, "no store"
    try:
        store = Store.open(layout.store, read_only=True)
    except StoreLockedError:
        return None, (
            "the store is held by another process (serve or watch), which checks the heads it recorded on every pass"
        )
    except StoreError as exc:
        return None, f"the store cannot be read ({exc})"
    try:
        heads = read_heads(store)
    except DatabaseError:
        return None, "the store predates recorded heads"
    finally:
        store.close()
    return heads, "the store recorded none (rebuilt, or no owner has read the trail since it was written)"
