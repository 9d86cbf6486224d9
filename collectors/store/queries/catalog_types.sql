-- The user types of the store (catalog.read_catalog: bedside defines none).
SELECT type_name FROM duckdb_types() WHERE NOT internal AND database_name = current_database()
