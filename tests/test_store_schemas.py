"""A store holds the parts of its owners: the telemetry's schema always, the service's when the service opens it.

Versions count per namespace; a store from before namespaces (one sequence of versions) is converted in place.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from bedside.app.service.schema import SCHEMAS, SERVICE
from bedside.collectors.store import TELEMETRY, Schema, Store, StoreError


class ServiceBeforeNamespaces(Schema):
    """The service's schema as it stood when namespaces came: its first three migrations."""

    def migrations(self) -> list[tuple[int, str, str]]:
        return super().migrations()[:3]


def versions(store: Store) -> dict[str, list[int]]:
    rows = store.cursor().execute("SELECT namespace, version FROM schema_migrations ORDER BY ALL").fetchall()
    found: dict[str, list[int]] = {}
    for namespace, version in rows:
        found.setdefault(namespace, []).append(version)
    return found


def tables(store: Store) -> set[str]:
    return {name for (name,) in store.cursor().execute("SELECT table_name FROM duckdb_tables()").fetchall()}


def test_each_namespace_records_its_own_versions(tmp_path: Path) -> None:
    with Store.open(tmp_path / "s.duckdb", schemas=SCHEMAS) as store:
        assert versions(store) == {
            "telemetry": [v for v, _, _ in TELEMETRY.migrations()],
            "service": [v for v, _, _ in SERVICE.migrations()],
        }
        assert store.schema_version(SERVICE) == max(v for v, _, _ in SERVICE.migrations())


def test_the_service_adds_its_tables_to_a_store_the_collector_made(tmp_path: Path) -> None:
    path = tmp_path / "s.duckdb"
    with Store.open(path) as store:
        assert "finding_rows" not in tables(store) and "service" not in versions(store)
        store.cursor().execute("INSERT INTO run_info (run_id, name) VALUES ('r1', 'kept')")
    with Store.open(path, schemas=SCHEMAS) as store:
        assert {"finding_rows", "incident_rows", "outbox"} <= tables(store)
        assert store.cursor().execute("SELECT name FROM run_info").fetchall() == [("kept",)]


def legacy(path: Path) -> None:
    """A store as bedside wrote it before namespaces: the service's three migrations of then, numbered 3 to 5
    between the telemetry's in one sequence."""
    with Store.open(path, schemas=(ServiceBeforeNamespaces(SERVICE.namespace, SERVICE.package),)) as store:
        con = store.cursor()
        con.execute(
            "CREATE TABLE old AS SELECT CASE WHEN namespace = 'service' THEN version + 2 ELSE version END "
            "AS version, name, applied_at FROM schema_migrations"
        )
        con.execute("DROP TABLE schema_migrations")
        con.execute(
            "CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY, name VARCHAR NOT NULL, "
            "applied_at TIMESTAMP DEFAULT current_timestamp)"
        )
        con.execute("INSERT INTO schema_migrations SELECT * FROM old")
        con.execute("DROP TABLE old")
        con.execute(
            "INSERT INTO incident_rows (incident_id, title, severity, resolved, timeline, start_step, "
            "end_step, kinds, ranks, findings, summary, suggested_action, opened_at, updated_at) VALUES "
            "('nonfinite@0:1', 't', 'critical', false, 0, 1, 1, ['nonfinite'], [0], 1, 's', '{}', 0, 0)"
        )


def test_a_store_from_before_namespaces_is_adopted_without_applying_anything_twice(tmp_path: Path) -> None:
    path = tmp_path / "s.duckdb"
    legacy(path)
    with Store.open(path, schemas=SCHEMAS) as store:  # a second CREATE TABLE finding_rows would fail here
        assert versions(store) == {
            "telemetry": [v for v, _, _ in TELEMETRY.migrations()],
            "service": [v for v, _, _ in SERVICE.migrations()],
        }
        assert store.fetch_named("incident_acks")["incident_id"].tolist() == ["nonfinite@0:1"]


def test_a_legacy_store_opened_by_the_collector_alone_keeps_the_service_s_part(tmp_path: Path) -> None:
    path = tmp_path / "s.duckdb"
    legacy(path)
    Store.open(path).close()
    with Store.open(path, schemas=SCHEMAS) as store:
        assert versions(store)["service"] == [v for v, _, _ in SERVICE.migrations()]


def test_a_query_is_looked_up_in_the_store_s_schemas_only(tmp_path: Path) -> None:
    with Store.open(None) as store, pytest.raises(StoreError) as raised:
        store.fetch_named("incident_acks")
    assert str(raised.value) == "no query named 'incident_acks' in the schemas telemetry"
    with Store.open(None, schemas=SCHEMAS) as store:
        assert store.fetch_named("incident_acks").empty


def test_no_query_name_is_in_two_schemas() -> None:
    def names(package_dir: Path) -> set[str]:
        return {p.stem for p in (package_dir / "queries").glob("*.sql")}

    root = Path(__file__).resolve().parents[1]
    telemetry, service = names(root / "collectors" / "store"), names(root / "app" / "service" / "schema")
    assert service and telemetry and not telemetry & service


SERVICE_OBJECTS = ("finding_rows", "incident_rows", "outbox", "findings", "incidents", "alerts")


def _without_comments(text: str) -> str:
    return "\n".join(line.split("--", 1)[0] for line in text.splitlines())


def test_no_telemetry_query_or_migration_reads_the_service_s_tables() -> None:
    """The telemetry's SQL knows nothing downstream: a query over findings, incidents or alerts belongs to the
    service's schema, whose stores have those tables."""
    root = Path(__file__).resolve().parents[1] / "collectors" / "store"
    crossing = [
        f"{path.name} names {name}"
        for path in sorted(root.glob("*/*.sql"))
        for name in SERVICE_OBJECTS
        if re.search(rf"\b{name}\b", _without_comments(path.read_text()), re.IGNORECASE)
    ]
    assert crossing == []


@pytest.mark.parametrize("schema", [TELEMETRY, SERVICE], ids=lambda s: s.namespace)
def test_migration_versions_are_unique_and_a_new_one_comes_after_the_last(schema) -> None:
    """Versions only grow: a store applies the files above the version it has, so a file numbered below the
    newest would never reach existing stores. The telemetry skips 3 to 5 (moved to the service's namespace)."""
    numbers = [v for v, _, _ in schema.migrations()]
    assert len(numbers) == len(set(numbers))
    expected = [1, 2, *range(6, max(numbers) + 1)] if schema is TELEMETRY else list(range(1, max(numbers) + 1))
    assert numbers == expected
