-- Which migrations of which schema the store has applied: versions count per namespace (Store.migrate).
CREATE TABLE IF NOT EXISTS schema_migrations (
    namespace  VARCHAR NOT NULL,  -- telemetry | service
    version    INTEGER NOT NULL,
    name       VARCHAR NOT NULL,  -- the migration's file name when it was applied
    applied_at TIMESTAMP DEFAULT current_timestamp,
    PRIMARY KEY (namespace, version)
)
