"""The ``bedside`` command line: one parser built from every command module's ``add_parser``.

Building it loads argparse and the constants the options show, nothing more: each command imports what it
runs on (pandas, DuckDB, the service, the trainer...) inside its handler, so ``bedside --help``,
``bedside --version`` and ``bedside COMMAND --help`` start at once (docs/performance.md, "CLI start-up").
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from bedside.collectors.display_text import visible
from bedside.collectors.errors import BedsideError
from bedside.detectors.errors import DetectorError

from . import (
    action,
    alert,
    audit,
    collect,
    demo,
    detect,
    import_run,
    ledger,
    playbook,
    query,
    report,
    runs,
    serve,
    simulate,
    train,
    watch,
)

COMMANDS = (
    collect,
    import_run,
    query,
    report,
    runs,
    ledger,
    train,
    action,
    audit,
    playbook,
    demo,
    detect,
    simulate,
    watch,
    alert,
    serve,
)
"""The command modules, in the order ``bedside --help`` lists them."""


class _PrintVersion(argparse.Action):
    """``--version``: print ``bedside <version>`` and exit; the distribution's metadata is read only then."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        from .version import installed_version

        print(f"{parser.prog} {installed_version()}")
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    """The ``bedside`` parser: one sub-command each, its handler set as ``handler``."""
    parser = argparse.ArgumentParser(prog="bedside", description="Telemetry and triage desk for large training runs.")
    parser.add_argument("--version", action=_PrintVersion, help="print bedside's version and exit")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in COMMANDS:
        command.add_parser(commands)
    return parser


def _one_line(exc: BaseException) -> str:
    """An error in one line: DuckDB's message and hint, without its excerpt of the SQL and caret; control
    characters of the outside text it quotes (a run name, a file name) escaped."""
    kept = []
    for line in str(exc).strip().splitlines():
        if not line.strip() or line.startswith("LINE "):
            break
        kept.append(line.strip())
    return visible(" ".join(kept)) or type(exc).__name__


def _store_failed(exc: Exception) -> bool:
    """Whether ``exc`` is the store's own error (DuckDB's): it can be only if the command opened a store."""
    store = sys.modules.get("bedside.collectors.store")
    return store is not None and isinstance(exc, store.DatabaseError)


def main(argv: list[str] | None = None) -> int:
    """Run one ``bedside`` command; errors are one line on stderr with exit status 2."""
    args = build_parser().parse_args(argv)
    args.command_line = argv is None  # the process's own command line (a command may start itself again)
    try:
        return args.handler(args)
    except (BedsideError, DetectorError, OSError) as exc:
        print(f"bedside: error: {_one_line(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        if _store_failed(exc):  # damage found after the store opened, a full disk: the store said no
            print(f"bedside: error: the store failed: {_one_line(exc)}", file=sys.stderr)
            return 2
        raise


if __name__ == "__main__":
    sys.exit(main())
