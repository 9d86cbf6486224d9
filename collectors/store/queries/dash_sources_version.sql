-- Dashboard: how far ingestion has got (changes whenever rows are added).
SELECT coalesce(sum(committed_offset), 0) AS committed FROM sources;
