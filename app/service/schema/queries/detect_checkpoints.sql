SELECT c.timeline, c.step, c.time, c.rank, c.event, c.duration_s, c.path, c.message
FROM checkpoints c JOIN detect_window w USING (source_id)
WHERE c.line_offset >= w.from_offset AND c.line_offset < w.to_offset
ORDER BY c.time, c.source_id, c.line_offset;
