SELECT a.timeline, a.step, a.time, a.rank, a.request_id, a.action, a.status
FROM actions a JOIN detect_window w USING (source_id)
WHERE a.line_offset >= w.from_offset AND a.line_offset < w.to_offset
ORDER BY a.time, a.source_id, a.line_offset;
