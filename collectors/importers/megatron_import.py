"""Reading Megatron-LM / NeMo text logs: the ``training_log`` and validation lines, other output ignored.

An iteration line is `` [time] iteration N/ M | name: value | ... |`` (the time prefix is optional);
a validation line is ``validation loss at iteration N | lm loss value: V | lm loss PPL: P |`` (at the end of
training ``... at iteration N on validation set |`` and ``... on test set |``, whose scores are ``test_loss`` and
``test_ppl``; the first is skipped when the loop's own evaluation of that iteration came just before). Names are
mapped by the importers' shared ``DEFAULT_NAMES`` (``lm loss``, ``grad norm``, ``learning rate``) and the step
time in milliseconds by ``MEGATRON_STEP_TIME``; the rest are kept as user metrics named with underscores. A line that
starts like one of these but does not parse is an error naming its line number. Iterations that go back or
come again (a job requeued from a checkpoint, appending to the same log) start a new timeline
(``restarts.py``).
"""

from __future__ import annotations

import math
import re
from datetime import datetime
from pathlib import Path

from ..errors import ImportFormatError
from .jsonl_import import EVAL_PREFIX, Parsed, cell_text, make_row, number
from .names import DEFAULT_NAMES
from .restarts import split_restarts
from .source import read_source

MAX_LOG_BYTES = 1 << 30
"""The largest log read (1 GiB)."""

MEGATRON_STEP_TIME = "elapsed time per iteration (ms)"
"""Megatron's step time field, recorded as rank 0's ``step_time`` in seconds."""

# Every pattern runs in time linear in the line: each quantifier is possessive (``*+``, ``++``: it never gives back
# what it took) or bounded, so no digit run or long word can be retried at every length. The iteration's digits
# are read as a whole run (at most ``_DIGITS``); a longer run does not match and the line is named as unparsed.
_DIGITS = 18
_ITERATION = re.compile(
    rf"\s*+(?:\[(?P<time>[^\]]{{0,64}})\]\s*+)?iteration\s++(?P<step>\d{{1,{_DIGITS}}})(?!\d)\s*+/\s*+\d++\s*+"
    r"\|(?P<rest>.*)"
)
_VALIDATION = re.compile(
    rf"\s*+validation loss at iteration\s++(?P<step>\d{{1,{_DIGITS}}})(?!\d)"
    r"(?:\s++on\s++(?P<split>\w{1,32}+)\s++set)?[^|]*+\|(?P<rest>.*)"
)
_LOOKS_LIKE = re.compile(r"\s*+(?:\[[^\]]*+\]\s*+)?(?:iteration\s++\d|validation loss at iteration)")


def read_megatron(path: Path) -> Parsed:
    """Every iteration and validation line of the log ``path``; other lines counted as skipped."""
    parsed = Parsed("megatron")
    for number_, line in enumerate(_text(path).splitlines(), start=1):
        where = f"{path}, line {number_}"
        if match := _ITERATION.match(line):
            _add_iteration(parsed, match, where)
        elif match := _VALIDATION.match(line):
            if match["split"] == "validation" and _evaluated_at(parsed, int(match["step"])):
                parsed.skipped += 1  # the end of training evaluates again at an iteration the loop just did
                continue
            fields = _fields(match["rest"], where)
            split = "" if match["split"] in (None, "validation") else f"{match['split']}_"  # the end's test set
            scores = {f"eval/{split}loss": fields.get("lm loss value"), f"eval/{split}ppl": fields.get("lm loss PPL")}
            values = {n: v for n, v in scores.items() if v is not None}
            if not values:
                raise ImportFormatError(f"{where}: a validation line without an lm loss value")
            time = parsed.rows[-1].time if parsed.rows else None
            parsed.rows.append(make_row({"step": match["step"], "time": time}, values, where))
        elif _LOOKS_LIKE.match(line):
            raise ImportFormatError(f"{where}: looks like a Megatron log line but does not parse: {line[:120]!r}")
        else:
            parsed.skipped += 1
    if not parsed.rows:
        raise ImportFormatError(f"{path}: no Megatron iteration line (' iteration N/ M | ... |')")
    # a requeued job appends to the same log; an evaluation follows its iteration
    split_restarts(parsed, repeats_restart=True, led=lambda name: name.startswith(EVAL_PREFIX))
    return parsed


def _evaluated_at(parsed: Parsed, step: int) -> bool:
    """Whether the last validation scores read are of ``step``."""
    last = next((row for row in reversed(parsed.rows) if f"{EVAL_PREFIX}loss" in row.values), None)
    return last is not None and last.step == step


def _text(path: Path) -> str:
    return read_source(path, MAX_LOG_BYTES).decode("utf-8", "replace")  # a log may hold any bytes between its lines


def _add_iteration(parsed: Parsed, match: re.Match[str], where: str) -> None:
    fields = _fields(match["rest"], where)
    job = {DEFAULT_NAMES.get(n.lower(), _user_name(n)): v for n, v in fields.items() if n != MEGATRON_STEP_TIME}
    if "loss" not in job and fields.get("number of nan iterations", 0) > 0:
        job["loss"] = math.nan  # Megatron leaves a NaN loss out of the line and counts it
    time = _time(match["time"], where)
    place = {"step": match["step"], "time": time}
    parsed.rows.append(make_row(place, job, where))
    if MEGATRON_STEP_TIME in fields:
        seconds = {"step_time": fields[MEGATRON_STEP_TIME] / 1000.0}
        parsed.rows.append(make_row({**place, "rank": 0}, seconds, where))


def _fields(rest: str, where: str) -> dict[str, float]:
    fields: dict[str, float] = {}
    for part in (p.strip() for p in rest.split("|")):
        if not part:
            continue
        name, colon, value = part.rpartition(":")
        if not colon or not name.strip():
            raise ImportFormatError(f"{where}: field {part!r} is not 'name: value'")
        field = cell_text(name.strip(), where, "a field name")
        fields[field] = float(number(value, where, field))
    return fields


def _user_name(name: str) -> str:
    return re.sub(r"[^0-9A-Za-z]+", "_", name).strip("_").lower()


def _time(raw: str | None, where: str) -> float | None:
    """The unix seconds of a line's ``[YYYY-MM-DD HH:MM:SS]`` (local time); their range is checked with the row's."""
    if raw is None:
        return None
    try:
        moment = datetime.strptime(raw.strip(), "%Y-%m-%d %H:%M:%S")
    except ValueError as exc:
        raise ImportFormatError(f"{where}: time [{raw}] is not YYYY-MM-DD HH:MM:SS") from exc
    try:
        return moment.timestamp()
    except (ValueError, OverflowError, OSError):  # 0001-01-01 00:00 passes through the year 0 on its way to UTC
        raise ImportFormatError(f"{where}: time [{raw}] is before 1970, not unix seconds") from None
