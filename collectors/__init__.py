"""Telemetry format, writer, run layout, store and exactly-once ingestion."""

from .format import SCHEMA_VERSION, Kind
from .runinfo import RankPlacement, RunInfo
from .writer import RunLogger

__all__ = ["SCHEMA_VERSION", "Kind", "RankPlacement", "RunInfo", "RunLogger"]
