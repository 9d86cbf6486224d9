-- Lines of the staged batch that break the format: where, how long (bytes, newline included), why.
SELECT source_id, line_offset, length, line, reason FROM staged WHERE reason IS NOT NULL ORDER BY source_id, line_offset;
