-- Rejected lines of a batch (the registered Arrow table rejected_batch).
INSERT INTO rejected_lines SELECT source_id, line_offset, length, reason, line, ingested_at FROM rejected_batch;
