"""The SQL page's CSV downloads: each result written to a file on the server a batch at a time, then served from
that file by the dashboard's own route (``ROUTE``), so neither the server's memory nor the page holds a result of
millions of rows (Streamlit's download button keeps its data in memory while the session lasts).

A file is named by an unguessable token and kept ``KEEP_S`` seconds, or until its session prepares another; the
folder is this process's own (mode 0700, its pid in the name) and goes with it: at exit, or, when the process was
killed before it could clean up, by the next process that makes one (``sweep``).
"""

from __future__ import annotations

import atexit
import html
import os
import secrets
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO
from urllib.parse import quote

from starlette.requests import Request
from starlette.responses import FileResponse, PlainTextResponse, Response
from starlette.routing import Route

from bedside.collectors.store.console import ConsoleLimits, CsvExport

ROUTE = "/bedside/export"
KEEP_S = 30 * 60.0
PREFIX = "bedside-csv-"


@dataclass(frozen=True)
class Export:
    """One prepared download: its token, file, the name the browser saves it as, and what it holds."""

    token: str
    path: Path
    file_name: str
    written: CsvExport
    made: float

    @property
    def url(self) -> str:
        return f"{ROUTE}/{self.token}/{quote(self.file_name)}"

    def link(self, label: str) -> str:
        """An HTML link that downloads the file under its name (both escaped: a run's folder may be named anything)."""
        return f'<a href="{html.escape(self.url)}" download="{html.escape(self.file_name)}">{html.escape(label)}</a>'


class Exports:
    """The prepared downloads of this process, by token."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._folder: Path | None = None
        self._exports: dict[str, Export] = {}

    def folder(self) -> Path:
        """This process's folder of exports, made on first use and removed at exit."""
        with self._lock:
            if self._folder is None:
                sweep(Path(tempfile.gettempdir()))
                self._folder = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-"))
                atexit.register(shutil.rmtree, self._folder, True)
            return self._folder

    def add(self, file_name: str, write: Callable[[BinaryIO], CsvExport]) -> Export:
        """Write a new export with ``write`` (given the open file) and keep it; a failed write leaves no file."""
        self.expire()
        token = secrets.token_urlsafe(24)
        path = self.folder() / f"{token}.csv"
        try:
            with path.open("xb") as out:
                written = write(out)
        except BaseException:
            path.unlink(missing_ok=True)
            raise
        export = Export(token, path, file_name, written, time.time())
        with self._lock:
            self._exports[token] = export
        return export

    def get(self, token: str) -> Export | None:
        self.expire()
        with self._lock:
            return self._exports.get(token)

    def drop(self, token: str) -> None:
        with self._lock:
            export = self._exports.pop(token, None)
        if export:
            export.path.unlink(missing_ok=True)

    def expire(self, now: float | None = None) -> None:
        """Drop every export older than ``KEEP_S``."""
        now = time.time() if now is None else now
        with self._lock:
            old = [token for token, export in self._exports.items() if now - export.made > KEEP_S]
        for token in old:
            self.drop(token)


EXPORTS = Exports()


def sweep(temp: Path) -> None:
    """Remove the export folders in ``temp`` left by processes that are gone (killed before their exit hook ran):
    only real folders of this user named ``PREFIX<pid>-...`` whose pid no longer runs."""
    for folder in temp.glob(f"{PREFIX}*-*"):
        pid = folder.name[len(PREFIX) :].split("-", 1)[0]
        if not pid.isdigit() or _running(int(pid)):
            continue
        try:
            if folder.is_symlink() or not folder.is_dir() or folder.stat().st_uid != os.getuid():
                continue
            shutil.rmtree(folder)
        except OSError:
            continue  # another process swept it first, or it is not ours to remove


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process
    return True


def csv_note(written: CsvExport, limits: ConsoleLimits) -> str:
    """What a CSV holds, in words: every row, or the first N of M and why."""
    size = f"{written.bytes / 2**20:,.1f} MiB" if written.bytes >= 2**20 else f"{written.bytes / 2**10:,.0f} KiB"
    if not written.truncated:
        return f"all {written.rows:,} rows, {size}"
    total = f"{written.total:,}" if written.total is not None else f"more than {written.rows:,} (not all counted)"
    return (
        f"the first {written.rows:,} of {total} rows, {size}: a download holds at most {limits.max_rows:,} "
        f"rows or {limits.max_bytes >> 30:,} GiB; add a LIMIT or aggregate"
    )


async def download(request: Request) -> Response:
    """The CSV file of an export, streamed from disk; 404 with a reason for a token that is not (or no longer) kept."""
    export = EXPORTS.get(str(request.path_params["token"]))
    if export is None:
        return PlainTextResponse(
            f"no such download: a prepared CSV is kept {KEEP_S / 60:g} min; run the query again", status_code=404
        )
    return FileResponse(export.path, media_type="text/csv", filename=export.file_name)


def routes() -> list[Route]:
    """The routes the dashboard's server adds to Streamlit's."""
    return [Route(ROUTE + "/{token}/{name}", download)]
