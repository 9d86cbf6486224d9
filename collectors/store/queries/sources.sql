-- Every telemetry file the store knows, with its committed offset.
SELECT source_id, path, file_rank, device, inode, head, committed_offset, state FROM sources ORDER BY source_id;
