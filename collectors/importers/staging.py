"""Writing an import where nobody sees it until it is complete: a folder beside each destination, renamed into place.

An import writes each run into a new folder next to its destination (``.NAME.importing-XXXXXXXX``, in the same
file system, so the move is a rename) and moves it into place only when every run of the import is written. On
any error the staging folders are removed, and so are the parent folders the import made for them: a failed
import leaves nothing. A destination that exists already (empty, or holding files of no run: ``_check_free``)
receives the staged entries one by one, ``run.json`` last, so it becomes a run only once it holds all of it.
"""

from __future__ import annotations

import os
import secrets
import shutil
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from ..errors import ImportFormatError
from ..layout import RUN_INFO_NAME


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


def _move_into_place(folder: Path, target: Path) -> None:
    """Rename ``folder`` to ``target``; into an existing ``target``, entry by entry, ``run.json`` last."""
    if not target.exists():
        os.rename(folder, target)
        return
    entries = sorted(folder.iterdir(), key=lambda entry: entry.name == RUN_INFO_NAME)
    if clash := next((entry.name for entry in entries if (target / entry.name).exists()), None):
        raise ImportFormatError(f"{target}: already holds {clash}; import into a new directory")
    for entry in entries:
        os.rename(entry, target / entry.name)
    folder.rmdir()
