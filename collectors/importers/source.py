"""Opening an import source and reading its text: regular files only, never blocking, every line bounded.

Every file an importer reads is opened through ``safefile`` (a FIFO, a symbolic link, a directory or a device
is refused unread, with the reason), and text is read a line at a time: a line longer than ``MAX_LINE_BYTES``
(a ``BoundedInputError``) or bytes that are not UTF-8 (an ``ImportFormatError``) are an error naming the file
and the line, never a traceback, a hang or a whole file held in memory as one string. A source folder (a
TensorBoard log dir, a W&B directory) is listed by ``FolderScan``: one folder at a time without recursion,
never through a symbolic link, within ``MAX_FOLDER_DEPTH`` levels and ``MAX_FOLDER_ENTRIES`` entries.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from ..bounded import BoundedInputError
from ..errors import ImportFormatError
from ..format import MAX_LINE_BYTES
from ..safefile import UnsafeFileError, open_regular_file, read_small_file

BOM = "\ufeff"
MAX_FOLDER_DEPTH = 32
"""The deepest folder looked into below an import's source folder (runs, sweeps and ranks nest a few levels)."""
MAX_FOLDER_ENTRIES = 1_000_000
"""The most entries (files and folders, every level together) listed under an import's source folder."""
SHOWN_PATH_CHARS = 200


def open_source(path: Path) -> BinaryIO:
    """The regular file ``path`` opened for reading in binary; an ImportFormatError saying why it is refused."""
    try:
        descriptor = open_regular_file(path)
    except FileNotFoundError:
        raise ImportFormatError(f"{path}: no such file") from None
    except UnsafeFileError as exc:
        raise ImportFormatError(f"{path}: {exc}") from None
    return os.fdopen(descriptor, "rb")


def read_source(path: Path, max_bytes: int) -> bytes:
    """The bytes of the regular file ``path``, at most ``max_bytes``; an ImportFormatError saying why not."""
    try:
        return read_small_file(path, max_bytes)
    except UnsafeFileError as exc:
        raise ImportFormatError(f"{path}: {exc}") from None


def text_lines(fh: BinaryIO, path: Path, *, bom: bool = False) -> Iterator[str]:
    """The lines of ``fh`` (newline kept) as UTF-8 text; a leading byte-order mark dropped when ``bom``."""
    number = 0
    while line := fh.readline(MAX_LINE_BYTES + 1):
        number += 1
        if len(line) > MAX_LINE_BYTES:
            raise BoundedInputError(f"{path}, line {number}: longer than {MAX_LINE_BYTES} bytes")
        yield decoded(line, f"{path}, line {number}").removeprefix(BOM if bom and number == 1 else "")


def decoded(data: bytes, where: str) -> str:
    """``data`` as UTF-8 text; an ImportFormatError naming ``where`` and the first bad byte otherwise."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ImportFormatError(f"{where}: not UTF-8 (byte {exc.start}: {data[exc.start : exc.start + 1]!r})") from None


@dataclass(frozen=True)
class Listing:
    """One folder's entries by name, each sorted: its folders, the symbolic links in it that lead to a folder
    (never followed), and everything else (files, FIFOs, links to no folder: opened later, or refused, as files)."""

    folder: Path
    depth: int  # levels below the scan's root
    folders: tuple[str, ...]
    links: tuple[str, ...]
    files: tuple[str, ...]


class FolderScan:
    """Lists the folders of one import source (``root``), one at a time and without recursion: a folder nested
    deeper than ``MAX_FOLDER_DEPTH`` levels or more than ``max_entries`` entries in all is a BoundedInputError
    naming the limit, a folder that cannot be listed an ImportFormatError."""

    def __init__(self, root: Path, max_entries: int = MAX_FOLDER_ENTRIES) -> None:
        self.root = root
        self.max_entries = max_entries
        self.entries = 0

    def walk(self) -> Iterator[Listing]:
        """``root`` and every folder below it (not through a link), each before the folders in it, in name order."""
        pending = [(self.root, 0)]
        while pending:
            folder, depth = pending.pop()
            listing = self.listing(folder, depth)
            yield listing
            pending.extend((folder / name, depth + 1) for name in reversed(listing.folders))

    def listing(self, folder: Path, depth: int = 0) -> Listing:
        """The entries of ``folder``, ``depth`` levels below ``root``."""
        if depth > MAX_FOLDER_DEPTH:
            below = folder.relative_to(self.root).as_posix()
            raise BoundedInputError(
                f"{self.root}: folders nest more than {MAX_FOLDER_DEPTH} levels deep (MAX_FOLDER_DEPTH), "
                f"at {_shown(below)}: refused; import the folder that holds the runs"
            )
        found: dict[str, list[str]] = {"folders": [], "links": [], "files": []}
        try:
            with os.scandir(folder) as entries:
                for entry in entries:
                    self._count()
                    found[_entry_type(entry)].append(entry.name)
        except OSError as exc:
            raise ImportFormatError(f"{_shown(str(folder))}: cannot be listed ({exc.strerror})") from None
        return Listing(folder, depth, *(tuple(sorted(names)) for names in found.values()))

    def _count(self) -> None:
        self.entries += 1
        if self.entries > self.max_entries:
            raise BoundedInputError(
                f"{self.root}: more than {self.max_entries:,} files and folders in it and below it "
                "(MAX_FOLDER_ENTRIES): refused; import the folder that holds the runs"
            )


def _entry_type(entry: os.DirEntry[str]) -> str:
    """Which list of a ``Listing`` an entry belongs to (a link that loops or leads nowhere is no folder)."""
    if entry.is_dir(follow_symlinks=False):
        return "folders"
    try:
        return "links" if entry.is_symlink() and entry.is_dir() else "files"
    except OSError:  # a link to itself, or through a loop of links
        return "files"


def _shown(path: str) -> str:
    """A path for an error message: at most ``SHOWN_PATH_CHARS`` characters of it."""
    return path if len(path) <= SHOWN_PATH_CHARS else f"{path[:SHOWN_PATH_CHARS]}..."
