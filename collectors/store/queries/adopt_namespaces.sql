-- A store from before schema namespaces numbered every migration in one sequence: its migrations 3 to 5
-- (findings, the outbox, incidents resolved by hand) are the service's 1 to 3 now, the rest the telemetry's.
CREATE TABLE schema_migrations_namespaced (
    namespace  VARCHAR NOT NULL,
    version    INTEGER NOT NULL,
    name       VARCHAR NOT NULL,
    applied_at TIMESTAMP DEFAULT current_timestamp,
    PRIMARY KEY (namespace, version)
);
INSERT INTO schema_migrations_namespaced
SELECT CASE WHEN version BETWEEN 3 AND 5 THEN 'service' ELSE 'telemetry' END,
       CASE WHEN version BETWEEN 3 AND 5 THEN version - 2 ELSE version END,
       name, applied_at
FROM schema_migrations;
DROP TABLE schema_migrations;
ALTER TABLE schema_migrations_namespaced RENAME TO schema_migrations;
