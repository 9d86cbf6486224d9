-- The newest migration of one schema's namespace applied to the store (Store.schema_version).
SELECT coalesce(max(version), 0) FROM schema_migrations WHERE namespace = $namespace
