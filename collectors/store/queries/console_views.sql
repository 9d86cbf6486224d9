-- The views a console query may read: every view of the store's schema (all documented in docs/schema.md).
SELECT view_name
FROM duckdb_views()
WHERE NOT internal AND database_name = current_database() AND schema_name = 'main'
ORDER BY view_name
