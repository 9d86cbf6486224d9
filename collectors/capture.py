"""Capturing values in the training thread without waiting for a device.

Python numbers pass through; CPU tensors and numpy scalars are read at once (no
device is involved); an accelerator tensor is kept, detached, with one event
recorded on its stream (no sync), and is read by the writer thread after that
event completes, so the caller never waits for the device and the writer never
reads a value its producer has not finished.
"""

from __future__ import annotations

import json
import operator
import sys
from collections.abc import Callable, Mapping
from typing import Any

from .format import encode_number

_NOT_A_NUMBER = "metric values must be numbers or one-element tensors"
_DIGEST_MASK = 0xFFFFFFFFFFFFFFFF


class Later:
    """A value that only the writer thread computes, e.g. the time between two CUDA events.

    ``compute`` runs in the writer thread and may wait for the device there (it synchronizes
    on what it needs itself); it returns a number or a string.
    """

    __slots__ = ("compute",)

    def __init__(self, compute: Callable[[], Any]) -> None:
        self.compute = compute

    def item(self) -> Any:
        return self.compute()


class Pending:
    """Device tensors of one record and the event after which they can be read."""

    __slots__ = ("event",)

    def __init__(self, event: Any) -> None:
        self.event = event

    def wait(self) -> None:
        if self.event is not None:
            self.event.synchronize()


def capture_metrics(metrics: Mapping[str, Any]) -> tuple[dict[str, Any], Pending | None]:
    """Captured metrics, and the pending device work to wait for before reading them."""
    captured: dict[str, Any] = {}
    on_device = None
    for name, value in metrics.items():
        if type(value) is float or type(value) is int:
            captured[name] = value
        elif value is not None:
            captured[name] = value = capture(value)
            if on_device is None and _is_device_tensor(value):
                on_device = value
    return captured, (None if on_device is None else Pending(_record_event(on_device)))


def capture(value: Any) -> Any:
    """A number, or a detached device tensor to read later; TypeError for anything else."""
    if value is None or type(value) in (float, int) or type(value) is Later:
        return value
    if type(value) is bool:
        return int(value)
    if hasattr(value, "is_cpu") and hasattr(value, "numel"):
        return _capture_tensor(value)
    if hasattr(value, "item"):
        try:
            value = value.item()
        except (RuntimeError, ValueError) as exc:
            raise TypeError(f"{_NOT_A_NUMBER}, got {type(value).__name__} ({exc})") from exc
    if isinstance(value, (int, float)):
        return value
    raise TypeError(f"{_NOT_A_NUMBER}, got {type(value).__name__}")


def _capture_tensor(tensor: Any) -> Any:
    if type(tensor).__name__ == "DTensor":
        raise TypeError(
            "a DTensor holds this rank's shard or partial value: pass tensor.full_tensor() "
            "(a collective) or the local value you mean"
        )
    if tensor.is_cpu:
        try:
            return tensor.item()
        except RuntimeError as exc:
            raise TypeError(f"{_NOT_A_NUMBER}, got a tensor of shape {tuple(tensor.shape)}") from exc
    if tensor.numel() != 1:
        raise TypeError(f"{_NOT_A_NUMBER}, got a tensor of shape {tuple(tensor.shape)}")
    return tensor.detach()


def _is_device_tensor(value: Any) -> bool:
    return type(value) not in (float, int, Later) and value.device.type != "cpu"


def _record_event(tensor: Any) -> Any:
    """An event on the tensor's current stream (CUDA and alike); None where the backend has none."""
    torch = sys.modules["torch"]
    backend = getattr(torch, tensor.device.type, None)
    if backend is None or not hasattr(backend, "Event") or not hasattr(backend, "current_stream"):
        return None
    event = backend.Event()
    event.record(backend.current_stream(tensor.device))
    return event


def resolve(value: Any) -> Any:
    """The JSON form of a captured number (reads a deferred device tensor here)."""
    if value is None:
        return None
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, str):  # a Later's digest
        return value
    if isinstance(value, int):
        return int(value)
    return encode_number(float(value))


def capture_digest(digest: Any) -> str | Later:
    """A parameter digest: a string as given, or a one-element integer tensor formatted as 16 hex
    digits of its 64 bits (a CPU tensor now, a device tensor by the writer thread after one event)."""
    if isinstance(digest, str):
        return digest
    if not (hasattr(digest, "is_cpu") and hasattr(digest, "numel")):
        raise TypeError(f"param_checksum must be a string or an integer tensor, got {type(digest).__name__}")
    if digest.numel() != 1 or digest.is_floating_point() or digest.is_complex():
        raise TypeError(
            f"param_checksum must be a one-element integer tensor, got {digest.dtype} of shape {tuple(digest.shape)}"
        )
    if digest.is_cpu:
        return _hex_digest(digest.item())
    digest = digest.detach()
    event = _record_event(digest)

    def read() -> str:
        if event is not None:
            event.synchronize()
        return _hex_digest(digest.item())

    return Later(read)


def _hex_digest(value: int) -> str:
    return f"{int(value) & _DIGEST_MASK:016x}"


def capture_step(step: Any) -> int:
    """A step number as a Python int >= 0, checked in the caller (TypeError or ValueError)."""
    step = step if type(step) is int else operator.index(step)
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    return step


def capture_shards(shards: Any) -> list[int | str]:
    """Shard ids as ints or strings (numpy or tensor integers are converted)."""
    return [s if isinstance(s, str) else operator.index(s) for s in shards]


def capture_field(value: Any) -> Any:
    """A top-level field: a JSON value, copied now (later changes by the caller do not leak
    into the record) and checked now (TypeError here, not in the writer thread)."""
    if value is None or isinstance(value, (str, bool)):
        return value
    if isinstance(value, (list, tuple, dict)):
        try:
            return json.loads(json.dumps(value, allow_nan=True))
        except (TypeError, ValueError) as exc:
            raise TypeError(f"fields must be JSON values: {exc}") from exc
    return capture(value)
