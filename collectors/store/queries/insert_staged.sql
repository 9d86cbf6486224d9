-- Move every accepted line of the temp table staged into its table (run inside
-- the ingest transaction, together with the source offsets).
INSERT INTO steps
SELECT source_id, line_offset, r.time, r.rank, r.step, r.timeline, r.seq,
       r.metrics.loss, r.metrics.grad_norm, r.metrics.lr, r.metrics.tokens, r.metrics.flops, r.shards,
       CASE WHEN cardinality(user_metrics) > 0 THEN user_metrics END,
       CASE WHEN has_unknown_fields THEN line::JSON END
FROM staged WHERE reason IS NULL AND r.kind = 'step';

INSERT INTO rank_steps
SELECT source_id, line_offset, r.time, r.rank, r.step, r.timeline, r.seq,
       r.metrics.step_time, r.metrics.data_time, r.metrics.compute_time, r.metrics.comm_time,
       r.metrics.optimizer_time, r.metrics.local_grad_norm,
       r.param_checksum,
       CASE WHEN cardinality(user_metrics) > 0 THEN user_metrics END,
       CASE WHEN has_unknown_fields THEN line::JSON END
FROM staged WHERE reason IS NULL AND r.kind = 'rank_step';

INSERT INTO evals
SELECT source_id, line_offset, r.time, r.rank, r.step, r.timeline, r.seq,
       coalesce(x.split, 'heldout'), x.cum_tokens, x.cum_flops, user_metrics, line::JSON
FROM staged WHERE reason IS NULL AND r.kind = 'eval';

INSERT INTO checkpoints
SELECT source_id, line_offset, r.time, r.rank, r.step, r.timeline, r.seq,
       x.event, x.path, r.metrics.duration_s, r.metrics.bytes, x.message, line::JSON
FROM staged WHERE reason IS NULL AND r.kind = 'checkpoint';

INSERT INTO actions
SELECT source_id, line_offset, r.time, r.rank, r.step, r.timeline, r.seq,
       x.action, x.status, x.request_id, x.operator, x.reason, x.message, x.args, line::JSON
FROM staged WHERE reason IS NULL AND r.kind = 'action';

INSERT INTO faults
SELECT source_id, line_offset, r.time, r.rank, r.step, r.timeline, r.seq,
       x.fault, x.target_ranks, x.args, line::JSON
FROM staged WHERE reason IS NULL AND r.kind = 'fault_injected';

INSERT INTO events
SELECT source_id, line_offset, r.time, r.rank, r.step, r.timeline, r.seq, r.kind, line::JSON
FROM staged
WHERE reason IS NULL
  AND r.kind NOT IN ('step', 'rank_step', 'eval', 'checkpoint', 'action', 'fault_injected');
