"""New rows from a run's store, as detector batches: what was committed since the last read."""

from __future__ import annotations

import duckdb
import pandas as pd
import pyarrow as pa

from bedside.collectors.store import Store
from bedside.detectors.telemetry import FILED_COLUMNS, TelemetryBatch, empty_frame

_WINDOW_SCHEMA = pa.schema([("source_id", pa.int32()), ("from_offset", pa.int64()), ("to_offset", pa.int64())])
DETECT_SLICE_BYTES = 256 << 20
"""Most telemetry bytes one batch covers (a replay of a large store goes to the detectors in slices)."""
MIN_SOURCE_BYTES = 4 << 10


class StoreFeed:
    """Reads a store's rows by byte range of each source file, so each row is read exactly once."""

    def __init__(self, store: Store, *, batch_bytes: int = DETECT_SLICE_BYTES) -> None:
        self.store = store
        self.batch_bytes = batch_bytes
        self._read_to: dict[int, int] = {}
        self._filed_to = 0  # filed requests are copied from the audit trail, not ingested: read by copy order
        self.behind = False

    def next_batch(self) -> TelemetryBatch:
        """The rows committed since the previous call, up to about ``batch_bytes`` of telemetry.

        Each file advances by the same share of the budget, so ranks stay level; ``behind``
        then says whether more is committed than this batch took (call again).
        """
        sources = self.store.fetch_named("detect_sources")
        pending = [
            (int(s), self._read_to.get(int(s), 0), int(o))
            for s, o in zip(sources["source_id"], sources["committed_offset"])
            if o > self._read_to.get(int(s), 0)
        ]
        share = max(MIN_SOURCE_BYTES, self.batch_bytes // max(len(pending), 1))
        window = [(s, start, min(end, start + share)) for s, start, end in pending]
        self.behind = any(cut < end for (_, _, cut), (_, _, end) in zip(window, pending))
        filed = self._filed()
        if not window:
            return TelemetryBatch(filed=filed)
        table = pa.Table.from_pylist(
            [dict(zip(("source_id", "from_offset", "to_offset"), w)) for w in window], schema=_WINDOW_SCHEMA
        )
        frames = {
            name: _plain(self.store.fetch_named(f"detect_{name}", tables={"detect_window": table}))
            for name in ("steps", "rank_steps", "evals", "checkpoints", "events", "actions")
        }
        self._read_to.update({source_id: to for source_id, _, to in window})
        return TelemetryBatch(**frames, filed=filed)

    def _filed(self) -> pd.DataFrame:
        """The control requests recorded as filed since the last call (a store from before they were kept has
        none)."""
        try:
            filed = _plain(self.store.fetch_named("detect_filed", {"after": self._filed_to}))
        except duckdb.CatalogException:  # a store read as it is, made before migration 011
            return empty_frame(FILED_COLUMNS)
        if len(filed):
            self._filed_to = int(filed["recorded"].max())
        return filed.drop(columns="recorded")

    def world_size(self) -> int | None:
        value = self.store.fetch_named("detect_run")["world_size"].iloc[0]
        return None if pd.isna(value) else int(value)

    def topology(self) -> pd.DataFrame:
        return self.store.fetch_named("detect_topology")


def _plain(frame: pd.DataFrame) -> pd.DataFrame:
    """Text columns as Python objects: Arrow-backed strings make every row selection a copy."""
    text = [name for name, dtype in frame.dtypes.items() if isinstance(dtype, pd.StringDtype)]
    return frame.astype({name: object for name in text}) if text else frame
