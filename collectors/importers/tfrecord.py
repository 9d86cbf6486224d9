"""Reading the records of a TensorBoard event file (TFRecord framing) from a file opened safely.

Each record is a little-endian 8-byte length, the masked CRC-32C of those 8 bytes, the data, and the masked
CRC-32C of the data. The file is opened once with ``safefile`` (a symbolic link, a FIFO or a device is refused
unread, and so is a file over ``MAX_EVENT_FILE_BYTES``), so nothing can be swapped in between the check and the
read. A record whose data fails its checksum is skipped and counted; a truncated last record (a writer that
died mid-write), or a length that fails its checksum, ends the reading, and what was lost is said in
``Framed.lost``. TensorBoard's own loader drops a truncated tail silently.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from ..errors import ImportFormatError
from ..safefile import UnsafeFileError, open_regular_file

MAX_EVENT_FILE_BYTES = 16 << 30
"""The largest event file read (16 GiB)."""
MAX_RECORD_BYTES = 256 << 20
"""The largest single record read (256 MiB); a longer one is an error (the file is not an event file)."""
_LENGTH = struct.Struct("<QI")
_CRC = struct.Struct("<I")


@dataclass
class Framed:
    """The intact records of a file, how many failed their checksum, and what was lost at the end (or None)."""

    records: list[bytes] = field(default_factory=list)
    damaged: int = 0
    lost: str | None = None


def read_records(path: Path, masked_crc32c: Callable[[bytes], int]) -> Framed:
    """Every intact record of the event file ``path``."""
    try:
        descriptor = open_regular_file(path)
    except (UnsafeFileError, FileNotFoundError) as exc:
        raise ImportFormatError(f"{path}: {exc.strerror if isinstance(exc, FileNotFoundError) else exc}") from None
    with os.fdopen(descriptor, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        if size > MAX_EVENT_FILE_BYTES:
            raise ImportFormatError(f"{path}: {size} bytes, over the limit of {MAX_EVENT_FILE_BYTES}: refused unread")
        framed = Framed()
        while (header := fh.read(_LENGTH.size)) and not framed.lost:
            framed.lost = _read_one(fh, header, framed, masked_crc32c, (path, size))
    if framed.lost:
        framed.lost = f"{path}: {framed.lost}; {len(framed.records)} records before it were read"
    return framed


def _read_one(
    fh: BinaryIO, header: bytes, framed: Framed, masked_crc32c: Callable[[bytes], int], file: tuple[Path, int]
) -> str | None:
    """Read the record after ``header`` into ``framed``; what was lost when it cannot be read (else None)."""
    path, size = file
    start = fh.tell() - len(header)
    if len(header) < _LENGTH.size:
        return f"the last record is truncated in its header ({size - start} bytes at offset {start} lost)"
    length, length_crc = _LENGTH.unpack(header)
    if masked_crc32c(header[:8]) != length_crc:
        return f"the record at offset {start} has a damaged length; the remaining {size - start} bytes were not read"
    if length > MAX_RECORD_BYTES:
        raise ImportFormatError(f"{path}: a record of {length} bytes at offset {start}, over {MAX_RECORD_BYTES}")
    data, footer = fh.read(length), fh.read(_CRC.size)
    if len(data) < length or len(footer) < _CRC.size:
        return f"the last record is truncated ({size - start} bytes at offset {start} lost)"
    if masked_crc32c(data) != _CRC.unpack(footer)[0]:
        framed.damaged += 1
    else:
        framed.records.append(data)
    return None
