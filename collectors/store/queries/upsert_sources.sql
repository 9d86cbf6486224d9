-- Record each file's identity and committed offset (the registered Arrow table
-- source_updates; run inside the ingest transaction, with the rows).
INSERT INTO sources (source_id, path, file_rank, device, inode, head, committed_offset, lines, rejected, state, state_detail, updated_at)
SELECT source_id, path, file_rank, device, inode, head, committed_offset, lines, rejected, state, state_detail, updated_at
FROM source_updates
ON CONFLICT (source_id) DO UPDATE SET
    device = excluded.device, inode = excluded.inode, head = excluded.head,
    committed_offset = excluded.committed_offset,
    lines = sources.lines + excluded.lines, rejected = sources.rejected + excluded.rejected,
    state = excluded.state, state_detail = excluded.state_detail, updated_at = excluded.updated_at;
