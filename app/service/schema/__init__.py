"""The service's part of a run's store: findings, incidents and the alert outbox, with the queries that read
and write them (migrations and queries as ``.sql`` files beside this module; docs/schema.md)."""

from __future__ import annotations

from bedside.collectors.store import Schema

SERVICE = Schema("service", __package__)
SCHEMAS = (SERVICE,)
"""What a store the service opens holds beyond the telemetry's own tables and views."""
