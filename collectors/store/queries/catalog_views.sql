-- The store's views as DuckDB prints them, by name (catalog.read_catalog: compared with our migrations').
SELECT view_name, sql
FROM duckdb_views()
WHERE NOT internal AND database_name = current_database() AND schema_name = 'main'
