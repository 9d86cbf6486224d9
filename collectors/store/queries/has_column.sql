-- Whether a table of the store has a column.
SELECT count(*) FROM duckdb_columns() WHERE table_name = $table AND column_name = $column
