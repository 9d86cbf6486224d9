"""Who may act from the dashboard: the operator token, kept only as a salted scrypt hash, and a lockout that
slows down guessing (per browser session and for the whole process).

``BEDSIDE_OPERATOR_TOKEN`` holds the token itself or its hash, ``scrypt$N$r$p$<salt hex>$<hash hex>``
(``TokenHash.of(token).encoded()`` makes one: docs/dashboard.md), so the plain token need not sit in the server's environment.
Threat model: docs/security.md.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import secrets
import threading
import time
from dataclasses import dataclass

from bedside.collectors.errors import BedsideError

TOKEN_ENV = "BEDSIDE_OPERATOR_TOKEN"
"""The environment variable ``bedside serve`` reads the token (or its hash) from, once, at start."""
SCHEME = "scrypt"
_COST = {"n": 2**14, "r": 8, "p": 1}
_HASH_BYTES = 32
FREE_TRIES = 3
"""Wrong tokens allowed before each further try waits."""
FIRST_WAIT_S = 30.0
MAX_WAIT_S = 300.0
_MAX_DOUBLINGS = math.ceil(math.log2(MAX_WAIT_S / FIRST_WAIT_S))
"""Doublings past which the wait is ``MAX_WAIT_S`` anyway: the exponent stops there, so no failure count overflows."""


class TokenFormatError(BedsideError):
    """A configured hash that does not parse."""


@dataclass(frozen=True)
class TokenHash:
    """A salted scrypt hash of the operator token; the plain token is never kept."""

    n: int
    r: int
    p: int
    salt: bytes
    digest: bytes

    @classmethod
    def of(cls, token: str) -> TokenHash:
        salt = secrets.token_bytes(16)
        return cls(_COST["n"], _COST["r"], _COST["p"], salt, _scrypt(token, salt, **_COST))

    @classmethod
    def configured(cls, value: str) -> TokenHash:
        """From ``BEDSIDE_OPERATOR_TOKEN``: a hash as ``encoded`` writes it, else the token itself (hashed here)."""
        if not value.startswith(f"{SCHEME}$"):
            return cls.of(value)
        parts = value.split("$")
        try:
            _, n, r, p, salt, digest = parts
            return cls(int(n), int(r), int(p), bytes.fromhex(salt), bytes.fromhex(digest))
        except ValueError:
            raise TokenFormatError(
                f"the operator token hash must read {SCHEME}$N$r$p$<salt hex>$<hash hex> ({len(parts)} fields given)"
            ) from None

    def encoded(self) -> str:
        return f"{SCHEME}${self.n}${self.r}${self.p}${self.salt.hex()}${self.digest.hex()}"

    def matches(self, token: str) -> bool:
        return hmac.compare_digest(_scrypt(token, self.salt, n=self.n, r=self.r, p=self.p), self.digest)


class Lockout:
    """Wrong tokens, and how long the next try must wait: nothing for the first ``FREE_TRIES``, then
    ``FIRST_WAIT_S`` doubling with each further wrong token up to ``MAX_WAIT_S``. A right token clears it."""

    def __init__(self) -> None:
        self.failures = 0
        self.until = 0.0
        self._lock = threading.Lock()

    def wait_s(self) -> float:
        """Seconds before another try is taken (0: now)."""
        return max(0.0, self.until - time.monotonic())

    def failed(self) -> None:
        with self._lock:
            self.failures += 1
            if self.failures >= FREE_TRIES:
                doublings = min(self.failures - FREE_TRIES, _MAX_DOUBLINGS)
                wait = min(MAX_WAIT_S, FIRST_WAIT_S * 2**doublings)
                self.until = time.monotonic() + wait

    def succeeded(self) -> None:
        with self._lock:
            self.failures, self.until = 0, 0.0


def _scrypt(token: str, salt: bytes, *, n: int, r: int, p: int) -> bytes:
    return hashlib.scrypt(token.encode(), salt=salt, n=n, r=r, p=p, maxmem=256 << 20, dklen=_HASH_BYTES)
