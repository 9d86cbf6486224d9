-- Record a file's identity and committed offset (called inside the ingest transaction).
INSERT INTO sources (source_id, path, file_rank, device, inode, head, committed_offset, lines, rejected, state, state_detail, updated_at)
VALUES ($source_id, $path, $file_rank, $device, $inode, $head, $committed_offset, $lines, $rejected, $state, $state_detail, $updated_at)
ON CONFLICT (source_id) DO UPDATE SET
    device = excluded.device, inode = excluded.inode, head = excluded.head,
    committed_offset = excluded.committed_offset,
    lines = sources.lines + excluded.lines, rejected = sources.rejected + excluded.rejected,
    state = excluded.state, state_detail = excluded.state_detail, updated_at = excluded.updated_at;
