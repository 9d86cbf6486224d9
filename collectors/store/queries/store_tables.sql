-- Every table of the store, for a checksum scan (Store.verify).
SELECT schema_name || '.' || table_name AS name FROM duckdb_tables() WHERE NOT temporary ORDER BY name
