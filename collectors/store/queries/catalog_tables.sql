-- The tables of the store's main schema (catalog.read_catalog: none of ours may be a view instead).
SELECT table_name FROM duckdb_tables() WHERE database_name = current_database() AND schema_name = 'main'
