-- Whether the store has a table.
SELECT count(*) FROM duckdb_tables() WHERE table_name = $name
