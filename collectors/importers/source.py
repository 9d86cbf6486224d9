"""Opening an import source and reading its text: regular files only, never blocking, every line bounded.

Every file an importer reads is opened through ``safefile`` (a FIFO, a symbolic link, a directory or a device
is refused unread, with the reason), and text is read a line at a time: a line longer than ``MAX_LINE_BYTES``
(a ``BoundedInputError``) or bytes that are not UTF-8 (an ``ImportFormatError``) are an error naming the file
and the line, never a traceback, a hang or a whole file held in memory as one string.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from ..bounded import BoundedInputError
from ..errors import ImportFormatError
from ..format import MAX_LINE_BYTES
from ..safefile import UnsafeFileError, open_regular_file, read_small_file

BOM = "\ufeff"


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
