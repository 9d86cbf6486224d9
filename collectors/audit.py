"""The audit trail: every action and acknowledgement, who did it and why, append-only and hash-chained.

One JSON object per line in ``RUN/control/audit.jsonl``. Each entry carries ``seq`` (its 0-based line
number), ``prev`` (the hash of the entry before it, ``GENESIS`` for the first) and ``hash``: SHA-256, in hex,
of the entry's canonical JSON without ``hash`` (keys sorted, no spaces, ASCII, no NaN). Rewriting an entry,
inserting one or deleting one breaks a link that ``verify`` names. The owner of the run's store also records
each head it has checked (``keep_head``), so a trail cut short, or rewritten consistently from some entry on,
no longer matches the store; copies of the head leave the machine with each alert and each action filed, and
``verify`` checks a copy it is given too. The trail is read as bytes from outside: a regular file only, opened
without blocking (``safefile``), at most ``MAX_TRAIL_BYTES``, each line parsed by ``bounded.parse_json``. What
this does and does not prove: docs/security.md.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import re
import stat
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa

from .bounded import MAX_NAME_CHARS, BoundedInputError, parse_json
from .control import request_action
from .display_text import hidden_characters
from .layout import RunLayout
from .safefile import UnsafeFileError, file_type, read_small_file
from .store import Store

AUDIT_NAME = "audit.jsonl"
GENESIS = "0" * 64
"""What the first entry's ``prev`` holds."""
FIELDS = ("seq", "time", "operator", "what", "incident_id", "request_id", "args", "reason", "prev", "hash")
_TAIL_BYTES = 1 << 16
MAX_OPERATOR_CHARS = 64
MAX_ENTRY_BYTES = 256 << 10
"""One entry's line: four times the largest control request (``control.MAX_REQUEST_BYTES``) it may record."""
MAX_FILED_TIME = 1e11
"""The latest filing time a filing copied to the store may carry (the year 5138): past it, no clock wrote it."""
MAX_TRAIL_BYTES = 64 << 20
"""The whole trail: about 200,000 entries of a few hundred bytes; a larger file is refused unread."""
TRAIL_WHERE = f"control/{AUDIT_NAME}"
_JSON_PLACE = re.compile(r"line 1 column \d+ \(char (\d+)\)")
"""Where the JSON parser places an error within a line, said without its "line 1" (the trail's lines count)."""


@dataclass(frozen=True)
class AuditHead:
    """The newest entry of a trail: its ``seq`` and ``hash``."""

    seq: int
    hash: str

    def __str__(self) -> str:
        """``SEQ:HASH``, as alerts and ``bedside action`` show it and ``bedside audit verify --head`` takes it."""
        return f"{self.seq}:{self.hash}"

    @classmethod
    def parse(cls, text: str) -> AuditHead:
        """A head written ``SEQ:HASH`` (the full 64 hex digits); ValueError saying what is wrong."""
        seq, _, digest = text.strip().partition(":")
        digest = digest.strip().lower()
        if not seq.strip().isdigit() or len(seq.strip()) > 18:
            raise ValueError(f"a head reads SEQ:HASH with SEQ an entry number, got {text.strip()[:80]!r}")
        if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
            raise ValueError(
                f"a head's HASH is 64 hex digits (the whole of it, as alerts carry it), got {digest[:80]!r}"
            )
        return cls(int(seq), digest)


@dataclass(frozen=True)
class ChainReport:
    """What ``verify`` found: the entries it could read, and the first broken link (None: the chain holds)."""

    entries: list[dict[str, Any]]
    broken: str | None
    head: AuditHead | None

    @property
    def intact(self) -> bool:
        return self.broken is None


def check_operator(name: str) -> str:
    """The operator's name as recorded: stripped, 1 to ``MAX_OPERATOR_CHARS`` characters, no control or
    format characters (which could fake line breaks or hide text); ValueError saying what is wrong."""
    name = name.strip()
    if not name:
        raise ValueError("enter your name: it is recorded with every action")
    if len(name) > MAX_OPERATOR_CHARS:
        raise ValueError(f"the name is {len(name)} characters long: at most {MAX_OPERATOR_CHARS}")
    if hidden := hidden_characters(name):
        raise ValueError(
            f"the name holds control characters ({', '.join(hidden)}): use letters, digits, spaces and punctuation"
        )
    return name


def check_reason(reason: str) -> str:
    """A request's reason as recorded: no control or format characters (an escape sequence would act on the
    terminal of whoever reads it back, a newline fake a line); ValueError naming them."""
    if hidden := hidden_characters(reason):
        raise ValueError(
            f"the reason holds control characters ({', '.join(hidden)}): write it on one line, without escape sequences"
        )
    return reason


def audit_path(layout: RunLayout) -> Path:
    return layout.control / AUDIT_NAME


def canonical(entry: Mapping[str, Any]) -> bytes:
    """The bytes an entry's hash covers: every field but ``hash``, as compact sorted ASCII JSON."""
    body = {name: value for name, value in entry.items() if name != "hash"}
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode()


def entry_hash(entry: Mapping[str, Any]) -> str:
    return hashlib.sha256(canonical(entry)).hexdigest()


def record(
    layout: RunLayout,
    *,
    operator: str,
    what: str,
    reason: str,
    incident_id: str | None = None,
    request_id: str | None = None,
    args: Mapping[str, Any] | None = None,
) -> AuditHead:
    """Append one entry chained to the last (under an exclusive lock, so concurrent writers chain in turn); its
    head. UnsafeFileError when the trail is no regular file, ValueError for an entry over ``MAX_ENTRY_BYTES``."""
    descriptor = _open_trail(layout)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX)
        seq, prev = _next_link(descriptor)
        entry: dict[str, Any] = {
            "seq": seq,
            "time": time.time(),
            "operator": operator,
            "what": what,
            "incident_id": incident_id,
            "request_id": request_id,
            "args": dict(args or {}),
            "reason": reason,
            "prev": prev,
        }
        entry["hash"] = entry_hash(entry)
        line = canonical_line(entry)
        if len(line) > MAX_ENTRY_BYTES:
            raise ValueError(f"the entry is {len(line)} bytes, more than {MAX_ENTRY_BYTES}: shorten the reason")
        os.write(descriptor, line)
        os.fsync(descriptor)
        return AuditHead(seq, entry["hash"])
    finally:
        os.close(descriptor)  # releases the lock


def _open_trail(layout: RunLayout) -> int:
    """The trail opened for appending: created if absent, never through a link, never blocking on a FIFO, and
    refused (UnsafeFileError) unless it is a regular file."""
    path = audit_path(layout)
    path.parent.mkdir(parents=True, exist_ok=True)
    flags = os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        descriptor = os.open(path, flags, 0o644)
    except OSError as error:
        kind = {errno.ELOOP: "a symbolic link", errno.EISDIR: "a directory", errno.ENXIO: "a socket"}.get(
            error.errno or 0
        )
        why = f"{kind}, not a regular file" if kind else error.strerror
        raise UnsafeFileError(f"{TRAIL_WHERE}: {why}: nothing recorded") from None
    mode = os.fstat(descriptor).st_mode
    if not stat.S_ISREG(mode):
        os.close(descriptor)
        raise UnsafeFileError(f"{TRAIL_WHERE}: {file_type(mode)}, not a regular file: nothing recorded")
    return descriptor


def _check_trail(layout: RunLayout) -> None:
    """UnsafeFileError when the trail exists and is no regular file (it could take no entry)."""
    try:
        mode = audit_path(layout).lstat().st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISREG(mode):
        raise UnsafeFileError(f"{TRAIL_WHERE}: {file_type(mode)}, not a regular file: nothing filed or recorded")


def file_request(
    layout: RunLayout,
    action: str,
    args: Mapping[str, Any],
    *,
    operator: str,
    reason: str,
    incident_id: str | None = None,
) -> tuple[str, AuditHead]:
    """File a signed control request for the run (``control.request_action``) and record it in the audit trail,
    the one way ``bedside action`` and the dashboard's actions ask a run to act; its request id. ValueError on a
    bad request (a reason with control characters too), ControlKeyError without the run's key or run.json,
    UnsafeFileError when the trail is no regular file: then nothing is filed or recorded. The request id and the
    trail's new head."""
    check_reason(reason)
    _check_trail(layout)  # a trail that cannot take the entry refuses the request before it is filed
    request_id = request_action(layout, action, args, operator=operator, reason=reason)
    head = record(
        layout, operator=operator, what=action, reason=reason, incident_id=incident_id, request_id=request_id, args=args
    )
    return request_id, head


def canonical_line(entry: Mapping[str, Any]) -> bytes:
    return (
        json.dumps(dict(entry), sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode()
        + b"\n"
    )


def verify(
    layout: RunLayout, recorded: list[AuditHead] | None = None, given: list[AuditHead] | None = None
) -> ChainReport:
    """Check every link of the trail, then the heads the store recorded and the heads ``given`` (copies kept
    elsewhere); the first break in words. A trail that is no regular file or too large is refused unread."""
    try:
        lines = _trail_lines(layout)
    except UnsafeFileError as error:
        return ChainReport([], f"{TRAIL_WHERE}: {error}", None)
    entries: list[dict[str, Any]] = []
    broken: str | None = None
    for number, line in enumerate(lines, start=1):
        entry, unread = _parsed_line(number, line)
        problem = (unread or _link_problem(number, entry, entries)) if broken is None else None
        broken = broken or problem
        if entry is not None:
            entries.append(entry)
    head = AuditHead(entries[-1]["seq"], entries[-1]["hash"]) if broken is None and entries else None
    if broken is None:
        broken = _head_problem(entries, recorded or [], _RECORDED) or _head_problem(entries, given or [], _GIVEN)
    return ChainReport(entries, broken, head if broken is None else None)


def _trail_lines(layout: RunLayout) -> list[bytes]:
    """The trail's lines (none when it does not exist); UnsafeFileError when it is refused unread."""
    path = audit_path(layout)
    if not os.path.lexists(path):
        return []
    lines = read_small_file(path, MAX_TRAIL_BYTES).split(b"\n")
    if lines[-1] == b"":
        lines.pop()
    return lines


def read_heads(store: Store) -> list[AuditHead]:
    """The heads the store recorded, oldest first."""
    frame = store.fetch_named("audit_heads")
    return [AuditHead(int(seq), str(digest)) for seq, digest in zip(frame["seq"], frame["hash"], strict=True)]


class AuditKeeper:
    """The owner's side: records the trail's head in the store whenever the trail grew and its chain holds."""

    def __init__(self, layout: RunLayout) -> None:
        self.layout = layout
        self._seen: tuple[int, int] | None = None
        self.broken: str | None = None

    def keep_head(self, store: Store) -> bool:
        """Verify the trail against the recorded heads if it changed since last time; record its new head
        (True when it did). ``broken`` keeps the first broken link found."""
        try:
            info = audit_path(self.layout).lstat()
            seen = (info.st_size, info.st_mtime_ns)
        except FileNotFoundError:
            seen = (0, 0)  # gone: still checked against the recorded heads
        if self._seen == seen:
            return False
        recorded = read_heads(store)
        try:
            report = verify(self.layout, recorded)
        except OSError as exc:
            self.broken = f"the trail cannot be read: {exc}"
            return False
        self._seen, self.broken = seen, report.broken
        writes = [("insert_filed_requests", {"filed": filed_table(report.entries)})] if report.intact else []
        grew = report.head is not None and (not recorded or report.head.seq > recorded[-1].seq)
        if grew and report.head is not None:
            table = pa.table({"seq": [report.head.seq], "hash": [report.head.hash], "recorded_at": [time.time()]})
            writes.append(("insert_audit_head", {"head": table}))
        if writes:
            store.write_named(writes)
        return grew


def filed_table(entries: list[dict[str, Any]]) -> pa.Table:
    """The entries of an intact trail that filed a control request, as the store's ``insert_filed_requests``
    reads them (the ``unanswered_request`` detector holds them against the loop's answers)."""
    filed = [
        e
        for e in entries
        if isinstance(e.get("request_id"), str)
        and 0 < len(e["request_id"]) <= MAX_NAME_CHARS
        and isinstance(e.get("time"), (int, float))
        and not isinstance(e.get("time"), bool)
        and 0 <= e["time"] <= MAX_FILED_TIME
    ]
    return pa.table(
        {
            "request_id": pa.array([e["request_id"] for e in filed], pa.string()),
            "filed_at": pa.array([float(e["time"]) for e in filed], pa.float64()),
            "action": pa.array([_text(e.get("what")) or "" for e in filed], pa.string()),
            "operator": pa.array([_text(e.get("operator")) for e in filed], pa.string()),
            "reason": pa.array([_text(e.get("reason")) for e in filed], pa.string()),
            "args": pa.array([json.dumps(e.get("args") or {}) for e in filed], pa.string()),
            "audit_seq": pa.array([e["seq"] for e in filed], pa.int64()),
        }
    )


def _text(value: Any) -> str | None:
    """A text field of an entry as text; anything else (a rewrite may put any JSON there) as missing."""
    return value if isinstance(value, str) else None


def entries_frame(entries: list[dict[str, Any]]) -> pd.DataFrame:
    """Entries as a table, newest first (``args`` as JSON text, ``time`` as UTC timestamps)."""
    frame = pd.DataFrame([{name: entry.get(name) for name in FIELDS} for entry in entries], columns=list(FIELDS))
    if not frame.empty:
        frame["time"] = pd.to_datetime(pd.to_numeric(frame["time"], errors="coerce"), unit="s", utc=True)
        frame["args"] = frame["args"].map(lambda a: json.dumps(a) if a else "")
    return frame.iloc[::-1].reset_index(drop=True)


def _next_link(descriptor: int) -> tuple[int, str]:
    """(seq, prev) for the entry after the file's last line; a torn last line is ended first."""
    size = os.fstat(descriptor).st_size
    if size == 0:
        return 0, GENESIS
    tail = os.pread(descriptor, min(size, _TAIL_BYTES), size - min(size, _TAIL_BYTES))
    if not tail.endswith(b"\n"):
        os.write(descriptor, b"\n")
        tail += b"\n"
    last = tail[:-1].rsplit(b"\n", 1)[-1]
    entry, _ = _parsed_line(0, last)
    if entry is not None and isinstance(entry.get("seq"), int) and isinstance(entry.get("hash"), str):
        return entry["seq"] + 1, entry["hash"]
    return _count_lines(descriptor), hashlib.sha256(last).hexdigest()  # chained to what is there: verify names it


def _count_lines(descriptor: int) -> int:
    count, offset = 0, 0
    while chunk := os.pread(descriptor, 1 << 20, offset):
        count, offset = count + chunk.count(b"\n"), offset + len(chunk)
    return count


def _parsed_line(number: int, line: bytes) -> tuple[dict[str, Any] | None, str | None]:
    """Line ``number`` as an entry, or None and why it cannot be one."""
    if len(line) > MAX_ENTRY_BYTES:
        return None, f"line {number} is {len(line)} bytes, more than an entry may hold ({MAX_ENTRY_BYTES}): refused"
    where = f"line {number}"
    try:
        entry = parse_json(line, where)
    except BoundedInputError as error:
        why = _JSON_PLACE.sub(r"character \1", str(error).removeprefix(f"{where}: "))
        return None, f"line {number} is not a JSON entry ({why}): a torn write, or altered by hand"
    if not isinstance(entry, dict):
        return None, f"line {number} is not a JSON entry (a JSON {type(entry).__name__}): altered by hand"
    return entry, None


def _link_problem(number: int, entry: dict[str, Any] | None, before: list[dict[str, Any]]) -> str | None:
    """What is wrong with line ``number``, read as ``entry``, given the entries before it (None: it chains)."""
    assert entry is not None
    seq, prev, digest = entry.get("seq"), entry.get("prev"), entry.get("hash")
    if not isinstance(seq, int) or isinstance(seq, bool) or not isinstance(prev, str) or not isinstance(digest, str):
        return f"line {number} carries no chain (seq, prev, hash): written by hand, or before the trail was chained"
    if digest != entry_hash(entry):
        return f"line {number} (entry {seq}) was rewritten: its content no longer matches its hash"
    expected = before[-1]["hash"] if before else GENESIS
    if prev == expected and seq == number - 1:
        return None
    if seq > number - 1:
        missing = f"entry {number - 1}" if seq == number else f"entries {number - 1}-{seq - 1}"
        return f"line {number} is entry {seq}: {missing} before it deleted"
    earlier = [line for line, e in enumerate(before[:-1], start=1) if e.get("hash") == prev]
    if earlier and seq == earlier[0]:  # a genuine entry, its place taken by what came in between
        between = f"line {number - 1} was" if earlier[0] == number - 2 else f"lines {earlier[0] + 1}-{number - 1} were"
        return f"line {number} (entry {seq}) chains to line {earlier[0]}: {between} inserted before it"
    return f"line {number} (entry {seq}) does not chain to line {number - 1}: inserted, or forged"


_RECORDED = ("the store recorded entry {seq} as a head", "what the store recorded")
_GIVEN = ("the head given is entry {seq}", "the head given")
"""How a problem names the copy of a head it found wrong: (when the trail is shorter, when the entry differs)."""


def _head_problem(entries: list[dict[str, Any]], heads: list[AuditHead], words: tuple[str, str]) -> str | None:
    """Whether the trail still holds every one of ``heads`` (a copy ``words`` names)."""
    for head in heads:
        if head.seq >= len(entries):
            ends = f"ends at entry {len(entries) - 1}" if entries else "is empty"
            claim = words[0].format(seq=head.seq)
            return f"{claim}, but the trail {ends}: entries were deleted from its end"
        if entries[head.seq]["hash"] != head.hash:
            return f"line {head.seq + 1} (entry {head.seq}) differs from {words[1]}: the trail was rewritten from there"
    return None
