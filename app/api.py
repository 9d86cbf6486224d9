"""``bedside.open(RUN)``: a run's documented views as pandas DataFrames, read-only, for a notebook or a script.

The handle reads a snapshot of the run's store (``collectors.query.snapshot_store``): a copy,
in a temporary folder, of what the store's owner (``bedside serve``, ``watch`` or ``collect``)
had committed when the handle was opened or last refreshed, findings and incidents included.
It never holds the store itself, so it never keeps an owner from starting, and an owner never
keeps it from reading. When no consistent copy can be taken (the store is damaged, or
checkpointed without pause), the views are rebuilt from the raw telemetry instead, without the
findings and incidents, and a ``RuntimeWarning`` says so. ``sql()`` runs in the SQL console's
sandbox (``collectors/store/console.py``): one SELECT over the documented views, nothing that
writes or reads a file.
"""

from __future__ import annotations

import tempfile
import time
import warnings
import weakref
from pathlib import Path

import pandas as pd

from bedside.collectors.defaults import DEFAULT_QUERY_TIMEOUT_S
from bedside.collectors.errors import StoreError
from bedside.collectors.layout import RunLayout, require_run_dir
from bedside.collectors.query import rebuild_from_telemetry, snapshot_store
from bedside.collectors.store import Store
from bedside.collectors.store.console import ConsoleLimits, console_views, run_console_query

from .service.schema import SCHEMAS

VIEWS = {
    "api_run": "run",
    "api_steps": "step_metrics",
    "api_rank_steps": "rank_step_metrics",
    "api_evals": "eval_scores",
    "api_findings": "findings",
    "api_incidents": "incidents",
}
"""The named query of each method and the view it reads."""
SQL_MAX_ROWS = 10_000_000
"""What ``Run.sql`` keeps of a result by default: a notebook's memory, not a browser's, is the limit."""


class NoStoreError(StoreError):
    """The run directory has telemetry but no store: nothing has ingested it yet."""


class Run:
    """One run's views, read-only, as of ``taken_at`` (``refresh()`` takes a newer snapshot).

    ``source`` is ``"snapshot"`` (the store as its owner had committed it) or ``"raw telemetry"``
    (rebuilt from the rank files: no findings or incidents), and ``note`` says why.
    """

    def __init__(self, run_dir: str | Path) -> None:
        self.run_dir = require_run_dir(Path(run_dir))
        self.layout = RunLayout(self.run_dir)
        self._folder = tempfile.TemporaryDirectory(prefix="bedside-open-")
        self._store: Store | None = None
        self._views: set[str] = set()
        self._finalizer = weakref.finalize(self, _release, None, self._folder)
        self.source = self.note = ""
        self.taken_at = 0.0
        self.refresh()

    def refresh(self) -> Run:
        """Take a new snapshot of the store (what its owner has committed by now); the handle itself."""
        if not self.layout.store.is_file():
            raise NoStoreError(
                f"{self.run_dir} has no store yet ({self.layout.store.name}): nothing has ingested its telemetry. "
                f"Run bedside collect {self.run_dir} (or serve or watch it), then open it again"
            )
        self._close_store()
        try:
            store = snapshot_store(self.layout.store, Path(self._folder.name), schemas=SCHEMAS)
            self.source, self.note = "snapshot", f"a copy of {self.layout.store} as its owner had committed it"
        except StoreError as exc:
            view = rebuild_from_telemetry(self.layout, f"no snapshot of the store ({exc})", schemas=SCHEMAS)
            store, self.source, self.note = view.store, view.source, view.note
            warnings.warn(f"{self.run_dir}: {view.note}; findings and incidents are empty", RuntimeWarning, 2)
        self._store, self.taken_at = store, time.time()
        self._views = set(console_views(store))
        self._finalizer.detach()
        self._finalizer = weakref.finalize(self, _release, store, self._folder)
        return self

    def run(self) -> pd.DataFrame:
        """The ``run`` view: name, world size, last step, newest timeline, status, config (one row)."""
        return self._frame("api_run")

    def steps(self) -> pd.DataFrame:
        """``step_metrics``: the job-level step records (loss, grad_norm, lr, tokens, ...), by timeline and step."""
        return self._frame("api_steps")

    def rank_steps(self) -> pd.DataFrame:
        """``rank_step_metrics``: each rank's step records (step time and phases, local grad norm, checksum)."""
        return self._frame("api_rank_steps")

    def evals(self) -> pd.DataFrame:
        """``eval_scores``: every eval score with the tokens and FLOPs spent by then."""
        return self._frame("api_evals")

    def findings(self) -> pd.DataFrame:
        """``findings``: every detector finding's latest version (docs/detectors.md)."""
        return self._frame("api_findings")

    def incidents(self) -> pd.DataFrame:
        """``incidents``: findings grouped by cause, with their status and acknowledgements."""
        return self._frame("api_incidents")

    def sql(
        self, query: str, *, timeout_s: float = DEFAULT_QUERY_TIMEOUT_S, max_rows: int = SQL_MAX_ROWS
    ) -> pd.DataFrame:
        """One read-only SELECT over the documented views (docs/schema.md), run in the console's sandbox; a
        ``RuntimeWarning`` when the result was cut at ``max_rows``. QueryError names what is wrong."""
        limits = ConsoleLimits(timeout_s=timeout_s, max_rows=max_rows, max_bytes=1 << 40)
        result = run_console_query(self._open_store(), query, limits)
        if result.truncated:
            warnings.warn(result.cut_note(limits), RuntimeWarning, 2)
        return result.frame

    def close(self) -> None:
        """Drop the snapshot (also done when the handle is garbage-collected)."""
        self._finalizer()
        self._store = None

    def __enter__(self) -> Run:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        taken = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.taken_at))
        return f"<bedside.Run {str(self.run_dir)!r}: {self.source} taken {taken}>"

    def _frame(self, query: str) -> pd.DataFrame:
        store = self._open_store()
        if VIEWS[query] in self._views:
            return store.fetch_named(query)
        with Store.open(None, schemas=SCHEMAS) as empty:  # a store the service has not opened yet: no rows
            return empty.fetch_named(query)

    def _open_store(self) -> Store:
        if self._store is None:
            raise StoreError(f"{self!r} is closed")
        return self._store

    def _close_store(self) -> None:
        if self._store is not None:
            self._store.close()
            self._store = None


def _release(store: Store | None, folder: tempfile.TemporaryDirectory) -> None:
    if store is not None:
        store.close()
    folder.cleanup()


def open_run(run_dir: str | Path) -> Run:
    """``bedside.open``: the run at ``run_dir``, read-only (RunDirError when it is not a run directory)."""
    return Run(run_dir)
