-- Every macro of the store, in any schema (catalog.read_catalog: a macro can shadow a built-in function).
SELECT schema_name, function_name, function_type, parameters, macro_definition
FROM duckdb_functions()
WHERE NOT internal AND database_name = current_database() AND function_type IN ('macro', 'table_macro')
ORDER BY ALL
