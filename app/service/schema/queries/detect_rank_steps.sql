SELECT s.timeline, s.step, s.time, s.rank, s.seq, s.step_time, s.data_time, s.compute_time, s.comm_time,
       s.optimizer_time, s.local_grad_norm, s.cpu_wait_time, s.param_checksum
FROM rank_steps s JOIN detect_window w USING (source_id)
WHERE s.line_offset >= w.from_offset AND s.line_offset < w.to_offset
ORDER BY s.time, s.source_id, s.line_offset;
