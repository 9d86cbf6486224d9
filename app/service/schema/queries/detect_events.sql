SELECT e.timeline, e.step, e.time, e.rank, e.kind
FROM events e JOIN detect_window w USING (source_id)
WHERE e.line_offset >= w.from_offset AND e.line_offset < w.to_offset
ORDER BY e.time, e.source_id, e.line_offset;
