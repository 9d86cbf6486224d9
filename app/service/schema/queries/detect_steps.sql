SELECT s.timeline, s.step, s.time, s.rank, s.seq, s.loss, s.grad_norm, s.lr, s.tokens, s.flops,
       CAST(s.shards AS VARCHAR) AS shards
FROM steps s JOIN detect_window w USING (source_id)
WHERE s.line_offset >= w.from_offset AND s.line_offset < w.to_offset
ORDER BY s.time, s.source_id, s.line_offset;
