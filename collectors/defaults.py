"""Defaults of the collector, the follower and the SQL console that the CLI shows in its help.

They live here, in a module that imports nothing, so that ``bedside --help`` can print them without
loading DuckDB, pyarrow or watchdog; ``ingest``, ``follow`` and ``store.console`` take them from here.
"""

from __future__ import annotations

DEFAULT_BATCH_BYTES = 64 << 20
"""Most bytes of telemetry ingested per transaction."""
DEFAULT_RESCAN_EVERY_S = 2.0
"""Seconds between the follower's safety-net rescans."""
DEFAULT_QUERY_TIMEOUT_S = 30.0
"""How long a console query may run."""
DEFAULT_MAX_ROWS = 1_000_000
"""How many rows of a console query's result are kept."""
