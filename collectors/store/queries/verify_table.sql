-- Read every block of one table (every column of every row): DuckDB checks each block's checksum as it reads it.
-- Counts and minimums would be answered from statistics without reading the data.
SELECT bit_xor(hash(t)) FROM query_table($name) AS t
