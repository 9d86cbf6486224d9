"""Reading the records of a W&B run file (``run-ID.wandb``, what ``wandb`` writes offline and while syncing).

The file is a LevelDB log with a header: 7 bytes ``:W&B``, 0xBEE1, version 0; then 32 KiB blocks of chunks,
each ``crc32 (4) | length (2) | type (1) | data``, the CRC-32 over the type byte and the data. A record (a
``wandb_internal_pb2.Record``) is one FULL chunk or a FIRST, MIDDLE..., LAST run of chunks; fewer than 7 bytes
left in a block are padding. A chunk that fails its CRC is skipped with the record it belongs to, and counted;
a truncated end (a process killed mid-write) ends the reading, and what was lost is said in ``Framed.lost``.
A record's chunks are joined once, at its end, so reading is linear in the file's size.
"""

from __future__ import annotations

import struct
import zlib

from .tfrecord import Framed

HEADER = struct.Struct("<4sHB")
MAGIC = (b":W&B", 0xBEE1, 0)
BLOCK_BYTES = 32 * 1024
CHUNK = struct.Struct("<IHB")
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def read_wandb_records(data: bytes, where: str) -> Framed | str:
    """The intact records of a ``.wandb`` file's bytes, or what is wrong with its header."""
    if len(data) < HEADER.size or HEADER.unpack_from(data) != MAGIC:
        return "not a W&B run file (no ':W&B' header)"
    framed, pos = Framed(), HEADER.size
    pending: list[bytes] | None = None  # the chunks of the record being read, joined once at its end (linear)
    while pos < len(data):
        left = BLOCK_BYTES - pos % BLOCK_BYTES
        if left < CHUNK.size or data[pos : pos + CHUNK.size] == bytes(CHUNK.size):
            pos += left  # padding at the end of a block
            continue
        if pos + CHUNK.size > len(data) or pos + CHUNK.size + CHUNK.unpack_from(data, pos)[1] > len(data):
            framed.lost = f"the last record is truncated ({len(data) - pos} bytes at offset {pos} lost)"
            break
        crc, length, kind = CHUNK.unpack_from(data, pos)
        chunk = data[pos + CHUNK.size : pos + CHUNK.size + length]
        pos += CHUNK.size + length
        if zlib.crc32(chunk, zlib.crc32(bytes([kind]))) != crc or kind not in (FULL, FIRST, MIDDLE, LAST):
            framed.damaged, pending = framed.damaged + 1, None
        elif kind in (FULL, FIRST):
            framed.damaged += pending is not None  # a record whose end was never written
            pending = [chunk]
        elif pending is not None:
            pending.append(chunk)
        else:
            framed.damaged += 1  # the rest of a record whose start failed its check
        if kind in (FULL, LAST) and pending is not None:
            framed.records.append(b"".join(pending))
            pending = None
    if pending is not None and not framed.lost:
        framed.lost = "the last record is incomplete (the writer stopped inside it)"
    if framed.lost:
        framed.lost = f"{where}: {framed.lost}; {len(framed.records)} records before it were read"
    return framed
