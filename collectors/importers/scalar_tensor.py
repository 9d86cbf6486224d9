"""The number a TensorBoard scalar tensor (the ``scalars`` plugin's form, TF 2's ``tf.summary.scalar``) holds.

A ``TensorProto`` keeps its value either packed in ``tensor_content`` or in the field of its dtype
(``float_val``, ``int64_val``, ...). Only real numbers are read: floats (``bfloat16`` included, the high half of
a float32), integers of every width and booleans. Anything else (text, complex numbers, resources, variants, an
unknown dtype, packed content of the wrong length, no value or several) is a ``NotANumber`` saying what it is,
which the importer reports as the metric's error (``scalars.py``) unless ``--map`` leaves the metric out: a
complex loss is refused rather than imported without its imaginary part.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

_READ: dict[str, tuple[str, str]] = {
    "DT_FLOAT": ("float_val", "<f4"),
    "DT_DOUBLE": ("double_val", "<f8"),
    "DT_HALF": ("half_val", "<f2"),
    "DT_BFLOAT16": ("half_val", "<u2"),
    "DT_INT8": ("int_val", "<i1"),
    "DT_INT16": ("int_val", "<i2"),
    "DT_INT32": ("int_val", "<i4"),
    "DT_UINT8": ("int_val", "<u1"),
    "DT_UINT16": ("int_val", "<u2"),
    "DT_INT64": ("int64_val", "<i8"),
    "DT_UINT32": ("uint32_val", "<u4"),
    "DT_UINT64": ("uint64_val", "<u8"),
    "DT_BOOL": ("bool_val", "?"),
}
"""The dtypes read, each with the field holding its values and the layout of its packed content."""


@dataclass(frozen=True)
class NotANumber:
    """A scalar tensor that holds no real number; its ``repr`` says what it holds, for the error that names it."""

    what: str

    def __repr__(self) -> str:
        return self.what


def tensor_number(tensor: Any) -> float | NotANumber:
    """The real number the scalar ``tensor`` holds, or what it holds instead."""
    known = tensor.DESCRIPTOR.fields_by_name["dtype"].enum_type.values_by_number.get(tensor.dtype)
    dtype = known.name if known else f"unknown dtype {tensor.dtype}"
    if dtype not in _READ:
        return NotANumber(f"a scalar tensor of {dtype}, no real number")
    field, layout = _READ[dtype]
    if tensor.tensor_content:
        size = np.dtype(layout).itemsize
        if len(tensor.tensor_content) != size:
            return NotANumber(f"a {dtype} scalar tensor of {len(tensor.tensor_content)} packed bytes, not {size}")
        value = np.frombuffer(tensor.tensor_content, dtype=layout)[0]
    else:
        values = getattr(tensor, field)
        if len(values) != 1:
            return NotANumber(f"a {dtype} scalar tensor of {len(values)} values, not 1")
        value = _typed(values[0], dtype, layout)
    return shortest(_bfloat16(value) if dtype == "DT_BFLOAT16" else value)


def _typed(value: Any, dtype: str, layout: str) -> Any:
    """A value of its dtype's field as that dtype (half floats are stored as their bits in an int field)."""
    if dtype in ("DT_HALF", "DT_BFLOAT16"):
        return np.array(int(value) & 0xFFFF, dtype="<u2").view(layout)[()]
    if dtype in ("DT_FLOAT", "DT_DOUBLE"):
        return np.dtype(layout).type(value)
    return value  # an integer or a bool, exactly as stored


def _bfloat16(bits: Any) -> np.float32:
    """A bfloat16 from its 16 bits: the high half of a float32."""
    return np.float32(np.array(int(bits) << 16, dtype="<u4").view("<f4")[()])


def shortest(value: Any) -> float:
    """A number as a float; a float32 or float16 as the shortest decimal that gives it back (``0.001``, not
    ``0.0010000000474974513``: the decimal that was logged)."""
    if isinstance(value, np.floating) and value.dtype.itemsize <= 4:
        return float(str(value))
    return float(value)
