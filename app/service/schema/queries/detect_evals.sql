SELECT e.timeline, e.step, e.time, e.split, u.entry.key AS name, u.entry.value AS value, e.cum_tokens, e.cum_flops
FROM evals e JOIN detect_window w USING (source_id), unnest(map_entries(e.scores)) AS u(entry)
WHERE e.line_offset >= w.from_offset AND e.line_offset < w.to_offset
ORDER BY e.time, e.source_id, e.line_offset, name;
