"""A real HTTP receiver on 127.0.0.1 for alert tests: records every request and answers as scripted.

``Receiver.script`` is a list of answers used one per request, then ``default``: an int
status, ``(status, headers)``, or ``HANG`` (hold the request past the sender's timeout,
then drop it). ``down()`` closes the listening socket (connections are refused) and
``up()`` opens it again on the same port.
"""

from __future__ import annotations

import http.server
import json
import socket
import threading
import time
import urllib.request
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

HANG = "hang"
POLL_S = 0.02
"""How often the server loop looks for a shutdown request (``down()`` waits for it)."""


@dataclass(frozen=True)
class Request:
    """One request as the receiver saw it, and what it answered."""

    path: str
    headers: dict[str, str]
    body: bytes
    status: int | str
    at: float

    def json(self) -> Any:
        return json.loads(self.body)

    @property
    def key(self) -> str | None:
        return self.headers.get("Idempotency-Key")


@dataclass
class Receiver:
    """Records requests; answers from ``script`` in order, then ``default``."""

    port: int = 0
    script: list[Any] = field(default_factory=list)
    default: Any = 200
    hang_s: float = 3.0
    requests: list[Request] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._server: http.server.ThreadingHTTPServer | None = None
        self.up()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def up(self) -> None:
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                answer = receiver._next_answer()
                receiver._record(self.path, dict(self.headers), body, answer)
                if answer == HANG:
                    time.sleep(receiver.hang_s)
                    self.close_connection = True
                    return
                status, headers = answer if isinstance(answer, tuple) else (answer, {})
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args: Any) -> None:
                pass

        http.server.ThreadingHTTPServer.allow_reuse_address = True
        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        threading.Thread(target=self._server.serve_forever, args=(POLL_S,), daemon=True).start()

    def down(self) -> None:
        """Stop listening: connections are refused until ``up()``."""
        if self._server:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def close(self) -> None:
        self.down()

    def delivered(self, path_prefix: str = "") -> list[Request]:
        """The requests answered with a 2xx."""
        with self._lock:
            return [
                r
                for r in self.requests
                if isinstance(r.status, int) and 200 <= r.status < 300 and r.path.startswith(path_prefix)
            ]

    def wait_for(self, count: int, timeout_s: float = 30.0, path_prefix: str = "") -> list[Request]:
        """Wait until ``count`` requests were answered with a 2xx; those requests (fails on timeout)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            done = self.delivered(path_prefix)
            if len(done) >= count:
                return done
            time.sleep(0.02)
        raise AssertionError(
            f"{len(self.delivered(path_prefix))} of {count} deliveries after {timeout_s} s; "
            f"requests: {[(r.path, r.status) for r in self.requests]}"
        )

    def wait_for_requests(self, count: int, timeout_s: float = 30.0) -> list[Request]:
        """Wait until ``count`` requests arrived, whatever they were answered; those requests (fails on timeout)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self._lock:
                if len(self.requests) >= count:
                    return list(self.requests)
            time.sleep(0.02)
        raise AssertionError(f"{len(self.requests)} of {count} requests after {timeout_s} s")

    def answered(self) -> list[int | str]:
        """What each request was answered, in order (an HTTP status, or ``HANG``)."""
        with self._lock:
            return [r.status for r in self.requests]

    def delivered_keys(self) -> Counter:
        """How many 2xx answers each idempotency key got."""
        return Counter(r.key for r in self.delivered())

    def _next_answer(self) -> Any:
        with self._lock:
            return self.script.pop(0) if self.script else self.default

    def _record(self, path: str, headers: dict[str, str], body: bytes, answer: Any) -> None:
        status = answer[0] if isinstance(answer, tuple) else answer
        with self._lock:
            self.requests.append(Request(path, headers, body, status, time.time()))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def answers(url: str) -> bool:
    """Whether ``url`` answers 200 now (a server's health check)."""
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
    except OSError:
        return False
