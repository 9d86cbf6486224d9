"""The one reading discipline (collectors/bounded.py): every hostile shape refused by name, in linear time."""

from __future__ import annotations

import json
import math
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bedside.collectors.bounded import (
    MAX_ABS_NUMBER,
    MAX_JSON_DEPTH,
    MAX_NAME_CHARS,
    MAX_NUMBER_CHARS,
    BoundedInputError,
    file_name_part,
    finite_number,
    json_depth,
    number_text,
    parse_json,
    short,
)

HOSTILE = {
    "nested far past the parser's recursion": ("[" * 100_000, "nested deeper than"),
    "nested past the limit": ("[" * (MAX_JSON_DEPTH + 1) + "]" * (MAX_JSON_DEPTH + 1), "nested 65 levels deep"),
    "an integer of 5,000 digits": ('{"a": ' + "7" * 5000 + "}", "a number of 5000 characters"),
    "a float past float64": ("1e400", "out of range"),
    "NaN": ('{"x": NaN}', "NaN is not a number JSON allows"),
    "-Infinity": ("[-Infinity]", "-Infinity is not a number"),
    "not UTF-8": (b'{"a": "\xff"}', r"not UTF-8 \(byte 7\)"),
    "truncated": ('{"a": [1, 2', "not valid JSON"),
}


@pytest.mark.parametrize("text, problem", HOSTILE.values(), ids=HOSTILE.keys())
def test_each_hostile_json_shape_is_refused_with_its_reason_and_where(text: str | bytes, problem: str) -> None:
    with pytest.raises(BoundedInputError, match=problem) as refused:
        parse_json(text, "requests/x.json")
    assert str(refused.value).startswith("requests/x.json: ")


def test_json_within_the_limits_reads_as_json() -> None:
    nested = "[" * MAX_JSON_DEPTH + "1" + "]" * MAX_JSON_DEPTH
    assert parse_json(nested, "x") is not None
    assert parse_json(b'{"loss": 1.5e-3, "step": -12, "ok": true, "s": "\\u00e9"}', "x") == {
        "loss": 1.5e-3,
        "step": -12,
        "ok": True,
        "s": "é",
    }


def test_a_huge_nesting_is_refused_in_time_linear_in_its_size() -> None:
    small, large = ("[" * n for n in (1_000_000, 8_000_000))
    took = []
    for text in (small, large):
        start = time.process_time()
        with pytest.raises(BoundedInputError):
            parse_json(text, "x")
        took.append(time.process_time() - start)
    assert took[1] < 8 * 4 * max(took[0], 1e-3)  # 8x the input: far from the 64x of a quadratic parse


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda children: st.lists(children) | st.dictionaries(st.text(), children),
)


@pytest.mark.slow(reason="200 hypothesis examples of nested JSON, each parsed by the bounded reader and by json")
@given(JSON_VALUES)
@settings(max_examples=200, deadline=None)
def test_any_json_value_is_read_back_or_refused_by_name(value: object) -> None:
    try:
        text = json.dumps(value)
    except ValueError:
        return
    try:
        assert parse_json(text, "x") == json.loads(text)
    except BoundedInputError:
        assert json_depth(value) > MAX_JSON_DEPTH or not all(map(within_limits, scalars(value)))


def scalars(value: object) -> list[object]:
    if isinstance(value, dict):
        return [leaf for child in value.values() for leaf in scalars(child)]
    return [leaf for child in value for leaf in scalars(child)] if isinstance(value, list) else [value]


def within_limits(value: object) -> bool:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return True
    return len(json.dumps(value)) <= MAX_NUMBER_CHARS and math.isfinite(value) and abs(value) <= MAX_ABS_NUMBER


@pytest.mark.parametrize(
    "value, problem",
    [(True, "must be a number"), ("1", "must be a number"), (10**400, "out of range"), (float("nan"), "finite")],
)
def test_a_number_from_outside_must_be_a_finite_number(value: object, problem: str) -> None:
    with pytest.raises(BoundedInputError, match=problem):
        finite_number(value, "requested_at")


def test_a_number_written_as_text_is_bounded_before_it_is_converted() -> None:
    assert number_text(" 2.5e-1 ", "loss") == 0.25
    for text, problem in (("9" * 401, "401 characters"), ("1e999", "finite"), ("abc", "not a number")):
        with pytest.raises(BoundedInputError, match=problem):
            number_text(text, "loss")


def test_a_name_from_outside_becomes_a_short_safe_file_name_part() -> None:
    assert file_name_part("x" * 250) == "x" * MAX_NAME_CHARS
    assert file_name_part("../../etc/passwd") == "_.._etc_passwd"
    assert file_name_part("...") == "_" and file_name_part("") == "_"
    assert file_name_part("ok-id_1.2") == "ok-id_1.2"


def test_an_error_message_never_prints_a_huge_value_whole() -> None:
    assert short(10**5000) == "an integer of about 5000 digits"
    assert len(short("x" * 10_000)) == 40
