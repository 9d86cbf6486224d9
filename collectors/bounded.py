"""One reading discipline for bytes from outside: every limit in one place, every failure a named error.

Whoever can write into a run folder, ``control/``, an import source or a store can hand bedside
anything: a JSON document nested 100,000 deep, a number of 5,000 digits or ``1e400``, text that
is not UTF-8, a name of 250 characters. Each reader of such bytes parses them here, so no input
ends in a traceback (``RecursionError``, ``OverflowError``, ``MemoryError``), a silent infinity or
a hang; ``BoundedInputError`` says what was refused and where. Files are opened by
``safefile.py`` (regular files only, never blocking). Each limit is documented in
docs/security.md, "Limits".
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from .errors import BedsideError

MAX_JSON_DEPTH = 64
"""Nesting of JSON objects and arrays; our own records nest at most 4 deep."""
MAX_NUMBER_CHARS = 64
"""Characters of one JSON number (a float64 needs at most 25; an int64 20)."""
MAX_ABS_NUMBER = 1e300
"""Largest magnitude of a number read from outside: far past any metric, safely below float overflow."""
MAX_NAME_CHARS = 128
"""Characters of an id or a name taken from outside into a file name (the file system allows 255 bytes)."""
MAX_CELL_CHARS = 4096
"""Characters of one text cell of an imported table (a metric name, a tag, a host)."""

_NAME_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


class BoundedInputError(BedsideError, ValueError):
    """Bytes from outside refused by a limit or a format check; the message names what and where."""


class NotJsonError(BoundedInputError):
    """Bytes from outside that are no JSON at all (a syntax error), rather than JSON past a limit."""


def parse_json(
    text: str | bytes,
    where: str,
    *,
    max_depth: int = MAX_JSON_DEPTH,
    allow_nan: bool = False,
    overflow_to_inf: bool = False,
) -> Any:
    """The JSON value in ``text`` (UTF-8 when bytes), read in linear time; BoundedInputError naming
    ``where`` and the problem for bad UTF-8, bad JSON, nesting past ``max_depth``, a number that has
    more than ``MAX_NUMBER_CHARS`` characters or a magnitude past ``MAX_ABS_NUMBER``, NaN/Infinity
    (unless ``allow_nan``: Python's own writer spells them so, and a loss may be NaN), or an object that
    gives a key twice (which of the two counts is anyone's guess). ``overflow_to_inf`` reads a number past
    float's range as infinite instead, for a reader that checks and names each field (``run.json``)."""
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as error:
            raise BoundedInputError(f"{where}: not UTF-8 (byte {error.start})") from None
    try:
        value = json.loads(
            text,
            parse_int=_integer,
            parse_float=_short_float if overflow_to_inf else _float,
            parse_constant=float if allow_nan else _constant,
            object_pairs_hook=_unique_keys,
        )
    except RecursionError:
        raise BoundedInputError(f"{where}: JSON nested deeper than {max_depth} levels") from None
    except BoundedInputError as error:
        raise BoundedInputError(f"{where}: {error}") from None
    except ValueError as error:  # JSONDecodeError included
        raise NotJsonError(f"{where}: not valid JSON: {str(error).split(';')[0]}") from None
    if (depth := json_depth(value)) > max_depth:
        raise BoundedInputError(f"{where}: JSON nested {depth} levels deep, more than {max_depth}")
    return value


def json_depth(value: Any) -> int:
    """How deep objects and arrays nest in a parsed JSON value (a scalar is 0), without recursion."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict):
            node = list(node.values())
        elif not isinstance(node, list):
            continue
        deepest = max(deepest, depth + 1)
        stack.extend((child, depth + 1) for child in node if isinstance(child, (dict, list)))
    return deepest


def finite_number(value: Any, what: str) -> float:
    """``value`` as a finite float within ``MAX_ABS_NUMBER`` (bools refused); BoundedInputError otherwise."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise BoundedInputError(f"{what} must be a number, got {short(value)}")
    if isinstance(value, int) and abs(value) > MAX_ABS_NUMBER:
        raise BoundedInputError(f"{what} is out of range: {short(value)}")
    number = float(value)
    if not math.isfinite(number) or abs(number) > MAX_ABS_NUMBER:
        raise BoundedInputError(f"{what} must be finite and within {MAX_ABS_NUMBER:g}, got {short(value)}")
    return number


def number_text(text: str, what: str) -> float:
    """A decimal number written as text (a log's or a cell's), as ``finite_number``; at most ``MAX_NUMBER_CHARS``
    characters, so no conversion is ever super-linear."""
    stripped = text.strip()
    if len(stripped) > MAX_NUMBER_CHARS:
        raise BoundedInputError(f"{what}: a number of {len(stripped)} characters, more than {MAX_NUMBER_CHARS}")
    try:
        number = float(stripped)
    except ValueError:
        raise BoundedInputError(f"{what}: not a number: {short(stripped)}") from None
    return finite_number(number, what)


def file_name_part(text: str) -> str:
    """``text`` made safe to be part of a file name: characters outside ``[A-Za-z0-9._-]`` replaced,
    cut to ``MAX_NAME_CHARS``, never empty and never starting with a dot."""
    safe = _NAME_UNSAFE.sub("_", text)[:MAX_NAME_CHARS].lstrip(".")
    return safe or "_"


def short(value: Any, limit: int = 40) -> str:
    """A bounded ``repr`` of ``value`` for an error message (a 5,000-digit integer is never converted whole)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 128:
        return f"an integer of about {int(value.bit_length() * 0.30103)} digits"
    text = repr(value) if not isinstance(value, (dict, list)) else f"a JSON {type(value).__name__}"
    return text if len(text) <= limit else f"{text[: limit - 3]}..."


def _integer(text: str) -> int | float:
    if len(text) > MAX_NUMBER_CHARS:
        raise BoundedInputError(f"a number of {len(text)} characters, more than {MAX_NUMBER_CHARS}")
    value = int(text)
    if abs(value) > MAX_ABS_NUMBER:
        raise BoundedInputError(f"the number {text} is out of range")
    return value


def _short_float(text: str) -> float:
    if len(text) > MAX_NUMBER_CHARS:
        raise BoundedInputError(f"a number of {len(text)} characters, more than {MAX_NUMBER_CHARS}")
    return float(text)


def _float(text: str) -> float:
    value = _short_float(text)
    if not math.isfinite(value) or abs(value) > MAX_ABS_NUMBER:
        raise BoundedInputError(f"the number {text} is out of range")
    return value


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``json.loads``'s ``object_pairs_hook`` for outside JSON: an object, or BoundedInputError when it gives a
    key twice (which of the two counts is anyone's guess)."""
    value: dict[str, Any] = {}
    for name, item in pairs:
        if name in value:
            raise BoundedInputError(f"key {short(name)} is given twice")
        value[name] = item
    return value


def _constant(text: str) -> float:
    raise BoundedInputError(f"{text} is not a number JSON allows")
