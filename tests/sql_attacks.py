"""SQL a hostile viewer types into the console: each must be refused and change nothing.

Shared by the console's own tests, ``bedside query`` and the dashboard's SQL page (every attack under AppTest,
the first of each class in a browser).
``{secret}`` stands for a file whose contents must never come back; ``{store}`` for the store's path;
``{out}`` for a path that must never be created.
"""

from __future__ import annotations

ATTACK_CLASSES: dict[str, dict[str, str]] = {
    "data-changing statements hidden inside a SELECT": {
        "delete in a CTE": "WITH x AS (DELETE FROM steps WHERE step > 100 RETURNING *) SELECT * FROM x",
        "delete in a materialized CTE": "WITH x AS MATERIALIZED (DELETE FROM incident_rows RETURNING *) SELECT 1",
        "update in a CTE": "WITH x AS (UPDATE sources SET committed_offset = 0 RETURNING *) SELECT count(*) FROM x",
        "insert in a CTE": "WITH x AS (INSERT INTO outbox (message_id) VALUES ('curl | sh') RETURNING *) SELECT * FROM x",
        "delete from a view in a CTE": "WITH x AS (DELETE FROM step_metrics RETURNING *) SELECT * FROM x",
    },
    "EXPLAIN ANALYZE runs its statement": {
        "explain analyze delete": "EXPLAIN ANALYZE DELETE FROM steps",
        "explain analyze insert": "EXPLAIN ANALYZE INSERT INTO outbox SELECT * FROM outbox",
        "explain analyze drop": "EXPLAIN ANALYZE DROP TABLE rank_steps",
        "explain analyze create": "EXPLAIN ANALYZE CREATE TABLE evil AS SELECT 1",
        "explain analyze update": "EXPLAIN ANALYZE UPDATE sources SET committed_offset = 0",
    },
    "plain writes and schema changes": {
        "delete": "DELETE FROM steps",
        "drop": "DROP TABLE rank_steps",
        "drop a view": "DROP VIEW step_metrics",
        "create": "CREATE TABLE evil (a INTEGER)",
        "create or replace view": "CREATE OR REPLACE VIEW step_metrics AS SELECT 1 AS step",
        "alter": "ALTER TABLE steps RENAME TO gone",
        "truncate": "TRUNCATE outbox",
        "insert": "INSERT INTO outbox SELECT * FROM outbox",
        "update": "UPDATE sources SET committed_offset = 0",
    },
    "settings, attachments, files, extensions": {
        "copy out": "COPY (SELECT * FROM step_metrics) TO '{out}'",
        "pragma": "PRAGMA enable_external_access",
        "pragma table_info of a table": "PRAGMA table_info('outbox')",
        "set": "SET enable_external_access = true",
        "reset": "RESET lock_configuration",
        "attach the store": "ATTACH '{store}' AS store2",
        "attach a new file": "ATTACH '{out}' AS evil",
        "detach": "DETACH memory",
        "copy in": "COPY steps FROM '{secret}'",
        "export": "EXPORT DATABASE '{out}'",
        "install": "INSTALL httpfs",
        "load": "LOAD httpfs",
        "checkpoint": "CHECKPOINT",
        "vacuum": "VACUUM",
        "call": "CALL pragma_version()",
        "begin": "BEGIN TRANSACTION",
    },
    "several statements, comment tricks": {
        "two statements": "SELECT 1; DELETE FROM steps",
        "statement after a comment": "SELECT 1 -- harmless\n; DROP TABLE steps",
        "block comment hiding a statement": "SELECT 1 /* ; */ ; DELETE FROM steps",
        "comment before delete": "/* SELECT */ DELETE FROM steps",
        "select then semicolon drop": "SELECT * FROM step_metrics;DROP TABLE steps;",
    },
    "reading files or running SQL text": {
        "read_csv": "SELECT * FROM read_csv('{secret}')",
        "read_text": "SELECT content FROM read_text('{secret}')",
        "read_blob": "SELECT content FROM read_blob('{secret}')",
        "read_json": "SELECT * FROM read_json_auto('{secret}')",
        "read_parquet": "SELECT * FROM read_parquet('{secret}')",
        "glob": "SELECT * FROM glob('/etc/*')",
        "a file as a table": "SELECT * FROM '{secret}'",
        "sniff_csv": "SELECT * FROM sniff_csv('{secret}')",
        "query()": "SELECT * FROM query('SELECT * FROM outbox')",
        "query_table()": "SELECT * FROM query_table('sources')",
    },
    "tables that are not documented views": {
        "the outbox": "SELECT * FROM outbox",
        "sources": "SELECT * FROM sources",
        "a base table": "SELECT * FROM rank_steps",
        "migrations": "SELECT * FROM schema_migrations",
        "another catalog": "SELECT * FROM temp.main.sources",
        "qualified table": "SELECT * FROM bedside.main.outbox",
        "a table in a subquery": "SELECT * FROM step_metrics WHERE step IN (SELECT count(*) FROM sources)",
        "a table in a union": "SELECT message_id FROM alerts UNION ALL SELECT payload::VARCHAR FROM outbox",
    },
}
ATTACKS: dict[str, str] = {name: sql for attacks in ATTACK_CLASSES.values() for name, sql in attacks.items()}
SAMPLE: dict[str, str] = {name: ATTACKS[name] for name in (next(iter(a)) for a in ATTACK_CLASSES.values())}
"""One attack of each class: what the browser types (every attack goes through the page's own code under AppTest)."""
