-- Move every accepted line of the temp table staged into its table (run inside
-- the ingest transaction, together with the source offsets).
INSERT INTO steps
SELECT source_id, line_offset, r.time, r.rank, r.step, r.timeline, r.seq,
       m.loss, m.grad_norm, m.lr, m.tokens, m.flops, r.shards,
       CASE WHEN cardinality(user_metrics) > 0 THEN user_metrics END,
       CASE WHEN json_array_length(json_keys(line)) > 7 + (r.shards IS NOT NULL)::INT THEN line::JSON END
FROM staged WHERE reason IS NULL AND r.kind = 'step';

INSERT INTO rank_steps
SELECT source_id, line_offset, r.time, r.rank, r.step, r.timeline, r.seq,
       m.step_time, m.data_time, m.compute_time, m.comm_time, m.optimizer_time, m.local_grad_norm,
       r.param_checksum,
       CASE WHEN cardinality(user_metrics) > 0 THEN user_metrics END,
       CASE WHEN json_array_length(json_keys(line)) > 7 + (r.param_checksum IS NOT NULL)::INT THEN line::JSON END
FROM staged WHERE reason IS NULL AND r.kind = 'rank_step';

INSERT INTO evals
SELECT source_id, line_offset, r.time, r.rank, r.step, r.timeline, r.seq,
       coalesce(r.split, 'heldout'), r.cum_tokens, r.cum_flops, user_metrics, line::JSON
FROM staged WHERE reason IS NULL AND r.kind = 'eval';

INSERT INTO checkpoints
SELECT source_id, line_offset, r.time, r.rank, r.step, r.timeline, r.seq,
       r.event, r.path, m.duration_s, m.bytes, r.message, line::JSON
FROM staged WHERE reason IS NULL AND r.kind = 'checkpoint';

INSERT INTO actions
SELECT source_id, line_offset, r.time, r.rank, r.step, r.timeline, r.seq,
       r.action, r.status, r.request_id, r.operator, r.reason, r.message, r.args, line::JSON
FROM staged WHERE reason IS NULL AND r.kind = 'action';

INSERT INTO faults
SELECT source_id, line_offset, r.time, r.rank, r.step, r.timeline, r.seq,
       r.fault, r.target_ranks, r.args, line::JSON
FROM staged WHERE reason IS NULL AND r.kind = 'fault_injected';

INSERT INTO events
SELECT source_id, line_offset, r.time, r.rank, r.step, r.timeline, r.seq, r.kind, line::JSON
FROM staged
WHERE reason IS NULL
  AND r.kind NOT IN ('step', 'rank_step', 'eval', 'checkpoint', 'action', 'fault_injected');
