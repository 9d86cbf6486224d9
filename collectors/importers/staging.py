"""Writing an import where nobody sees it until it is complete: a folder beside each destination, renamed into place.

An import writes each run into a new folder next to its destination (``.NAME.importing-XXXXXXXX``, in the same
file system, so the move is a rename), has the collector check it there (``collect_staged``: a line the collector
rejects fails the import, named; the store it fills moves with the run) and moves it into place only when every run
of the import is written and checked. On any error the staging folders are removed, and so are the parent folders the import made for them: a
failed import leaves nothing. A destination that exists already (empty, or holding files of no run:
``_check_free``) receives the staged entries one by one, ``run.json`` last, so it becomes a run only once it holds
all of it; an entry it holds already fails the import before any run is moved.
"""

from __future__ import annotations

import os
import secrets
import shutil
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from ..bounded import short
from ..errors import ImportFormatError
from ..ingest import Collector, PassResult
from ..layout import RUN_INFO_NAME, RunLayout
from ..store import Schema, Store

IMPORT_QUERIES = Schema("import", __package__)
"""The importers' own queries over a store they collected (``queries/``; no tables of their own)."""
SHOWN_REJECTIONS = 3


@contextmanager
def staged(targets: list[Path]) -> Iterator[dict[Path, Path]]:
    """A new empty folder beside each of ``targets`` to write it into; each moved into place when the block ends
    without an error, all removed (with the parents made for them) when it raises."""
    made = _make_parents(targets)
    folders: dict[Path, Path] = {}
    try:
        for target in targets:
            folders[target] = _new_folder(target)
        yield folders
        for target, folder in folders.items():
            _check_clash(folder, target)
        for target, folder in folders.items():
            _move_into_place(folder, target)
    except BaseException:
        for folder in folders.values():
            shutil.rmtree(folder, ignore_errors=True)
        for parent in made:
            with suppress(OSError):  # not empty: something else was put there meanwhile
                parent.rmdir()
        raise


def _make_parents(targets: list[Path]) -> list[Path]:
    """Create the parent folders of ``targets``; those that did not exist, deepest first."""
    missing = {p for target in targets for p in (target.parent, *target.parent.parents) if not p.exists()}
    for target in targets:
        target.parent.mkdir(parents=True, exist_ok=True)
    return sorted(missing, key=lambda p: len(p.parts), reverse=True)


def _new_folder(target: Path) -> Path:
    """A folder of a fresh name beside ``target`` (made by ``mkdir``, so with the user's usual mode)."""
    while True:
        folder = target.parent / f".{target.name}.importing-{secrets.token_hex(4)}"
        try:
            folder.mkdir()
            return folder
        except FileExistsError:
            continue


def collect_staged(folder: Path, target: Path) -> tuple[list[str], PassResult]:
    """Have the collector ingest the run staged in ``folder`` for ``target``, checking every line as it checks any
    telemetry, into the run's own store (it moves into place with the run, which needs no second ingest); the
    collector's warnings and what it ingested. A line it rejects is an ImportFormatError naming the first few, with
    their reasons (and ``staged`` removes the folder, store and all)."""
    warnings: list[str] = []
    with Store.open(RunLayout(folder).store, schemas=(IMPORT_QUERIES,)) as store:
        result = Collector(folder, store, warn=warnings.append).ingest_available()
        if result.rejected:
            raise ImportFormatError(_rejected(target, result.rejected, store))
    return warnings, result


def _rejected(target: Path, count: int, store: Store) -> str:
    """What the collector rejected of the run staged for ``target``: how many lines, the first few and why."""
    first = store.fetch_named("import_rejections", {"limit": SHOWN_REJECTIONS}).itertuples()
    lines = "line was" if count == 1 else "lines were"
    return f"{target}: {count} imported {lines} rejected by the collector, so nothing was imported: " + "; ".join(
        f"{r.path} at byte {r.line_offset}: {r.reason} (line {short(r.line, 200)})" for r in first
    )


def _check_clash(folder: Path, target: Path) -> None:
    """An ImportFormatError when ``target`` holds an entry of the same name as one staged in ``folder``."""
    if target.exists() and (clash := next((e.name for e in folder.iterdir() if (target / e.name).exists()), None)):
        raise ImportFormatError(f"{target}: already holds {clash}; import into a new directory")


def _move_into_place(folder: Path, target: Path) -> None:
    """Rename ``folder`` to ``target``; into an existing ``target``, entry by entry, ``run.json`` last."""
    if not target.exists():
        os.rename(folder, target)
        return
    for entry in sorted(folder.iterdir(), key=lambda entry: entry.name == RUN_INFO_NAME):
        os.rename(entry, target / entry.name)
    folder.rmdir()
