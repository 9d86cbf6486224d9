-- Lines of the staged batch that break the format, with the reason.
SELECT source_id, line_offset, line, reason FROM staged WHERE reason IS NOT NULL ORDER BY source_id, line_offset;
