-- One migration applied, in the transaction that applied it (Store.migrate).
INSERT INTO schema_migrations (namespace, version, name) VALUES ($namespace, $version, $name)
