-- The newest migration applied to the store, per namespace (catalog: which of our definitions it should hold).
SELECT namespace, max(version) FROM schema_migrations GROUP BY namespace
