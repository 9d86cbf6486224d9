-- Move every accepted line of the temp table staged into its table (run inside
-- the ingest transaction, together with the source offsets).
INSERT INTO steps
SELECT source_id, line_offset, rec.time, rec.rank, rec.step, rec.timeline, rec.seq,
       rec.metrics.loss, rec.metrics.grad_norm, rec.metrics.lr, rec.metrics.tokens, rec.metrics.flops, rec.shards,
       CASE WHEN cardinality(user_metrics) > 0 THEN user_metrics END,
       CASE WHEN has_unknown_fields THEN line::JSON END
FROM staged WHERE reason IS NULL AND rec.kind = 'step';

INSERT INTO rank_steps
SELECT source_id, line_offset, rec.time, rec.rank, rec.step, rec.timeline, rec.seq,
       rec.metrics.step_time, rec.metrics.data_time, rec.metrics.compute_time, rec.metrics.comm_time,
       rec.metrics.optimizer_time, rec.metrics.local_grad_norm,
       rec.param_checksum,
       CASE WHEN cardinality(user_metrics) > 0 THEN user_metrics END,
       CASE WHEN has_unknown_fields THEN line::JSON END,
       rec.metrics.cpu_wait_time
FROM staged WHERE reason IS NULL AND rec.kind = 'rank_step';

INSERT INTO evals
SELECT source_id, line_offset, rec.time, rec.rank, rec.step, rec.timeline, rec.seq,
       coalesce(kind_fields.split, 'heldout'), kind_fields.cum_tokens, kind_fields.cum_flops, user_metrics, line::JSON
FROM staged WHERE reason IS NULL AND rec.kind = 'eval';

INSERT INTO checkpoints
SELECT source_id, line_offset, rec.time, rec.rank, rec.step, rec.timeline, rec.seq,
       kind_fields.event, kind_fields.path, rec.metrics.duration_s, rec.metrics.bytes, kind_fields.message, line::JSON
FROM staged WHERE reason IS NULL AND rec.kind = 'checkpoint';

INSERT INTO actions
SELECT source_id, line_offset, rec.time, rec.rank, rec.step, rec.timeline, rec.seq,
       kind_fields.action, kind_fields.status, kind_fields.request_id, kind_fields.operator, kind_fields.reason, kind_fields.message, kind_fields.args, line::JSON
FROM staged WHERE reason IS NULL AND rec.kind = 'action';

INSERT INTO faults
SELECT source_id, line_offset, rec.time, rec.rank, rec.step, rec.timeline, rec.seq,
       kind_fields.fault, kind_fields.target_ranks, kind_fields.args, line::JSON
FROM staged WHERE reason IS NULL AND rec.kind = 'fault_injected';

INSERT INTO events
SELECT source_id, line_offset, rec.time, rec.rank, rec.step, rec.timeline, rec.seq, rec.kind, line::JSON
FROM staged
WHERE reason IS NULL
  AND rec.kind NOT IN ('step', 'rank_step', 'eval', 'checkpoint', 'action', 'fault_injected');
