-- Parse a batch of raw telemetry lines (the registered Arrow table batch_lines:
-- source_id, file_rank, line_offset, line) into the temp table staged, with a
-- rejection reason for every line that breaks the format. Parameter
-- $world_size: the run's world size (NULL when unknown).
CREATE OR REPLACE TEMP TABLE staged AS
WITH lines AS (
    SELECT source_id, file_rank, line_offset, rtrim(line, chr(13) || chr(10)) AS line FROM batch_lines
), parsed AS (
    SELECT source_id, file_rank, line_offset, line,
           json_valid(line) AS valid,
           CASE WHEN json_valid(line) THEN json_transform(line, '{
               "kind": "VARCHAR", "time": "DOUBLE", "rank": "DOUBLE", "step": "DOUBLE",
               "timeline": "DOUBLE", "seq": "DOUBLE", "metrics": "JSON",
               "shards": "JSON", "param_checksum": "VARCHAR", "split": "VARCHAR",
               "cum_tokens": "DOUBLE", "cum_flops": "DOUBLE", "event": "VARCHAR", "path": "VARCHAR",
               "message": "VARCHAR", "action": "VARCHAR", "status": "VARCHAR", "request_id": "VARCHAR",
               "operator": "VARCHAR", "reason": "VARCHAR", "args": "JSON", "host": "VARCHAR",
               "fault": "VARCHAR", "target_ranks": "JSON"}') END AS r
    FROM lines
), typed AS (
    SELECT *,
           json_transform(r.metrics, '{
               "loss": "DOUBLE", "grad_norm": "DOUBLE", "lr": "DOUBLE", "tokens": "DOUBLE", "flops": "DOUBLE",
               "step_time": "DOUBLE", "data_time": "DOUBLE", "compute_time": "DOUBLE", "comm_time": "DOUBLE",
               "optimizer_time": "DOUBLE", "local_grad_norm": "DOUBLE", "duration_s": "DOUBLE", "bytes": "DOUBLE"}') AS m,
           coalesce(json_array_length(json_keys(r.metrics)), 0) AS n_keys,
           CASE r.kind
               WHEN 'step' THEN ['loss', 'grad_norm', 'lr', 'tokens', 'flops']
               WHEN 'rank_step' THEN ['step_time', 'data_time', 'compute_time', 'comm_time', 'optimizer_time', 'local_grad_norm']
               WHEN 'checkpoint' THEN ['duration_s', 'bytes']
               ELSE []
           END AS canonical
    FROM parsed
), counted AS (
    SELECT *,
           CASE r.kind
               WHEN 'step' THEN len(list_filter([m.loss, m.grad_norm, m.lr, m.tokens, m.flops], lambda x: x IS NOT NULL))
               WHEN 'rank_step' THEN len(list_filter([m.step_time, m.data_time, m.compute_time, m.comm_time,
                                                      m.optimizer_time, m.local_grad_norm], lambda x: x IS NOT NULL))
               WHEN 'checkpoint' THEN len(list_filter([m.duration_s, m.bytes], lambda x: x IS NOT NULL))
               ELSE 0
           END AS n_canonical
    FROM typed
), careful AS (
    -- Only lines with metrics beyond the canonical ones (or unreadable values) pay for a full map.
    SELECT *,
           CASE WHEN n_keys > n_canonical OR r.kind = 'eval' THEN
               map_entries(json_transform(r.metrics, '"MAP(VARCHAR, JSON)"')) END AS entries
    FROM counted
), checked AS (
    SELECT *,
           list_filter(entries, lambda e: e.value IS NOT NULL AND json_type(e.value) <> 'NULL'
                                          AND TRY_CAST(e.value ->> '$' AS DOUBLE) IS NULL) AS bad_entries
    FROM careful
)
SELECT source_id, line_offset, line, r, m,
       CASE WHEN entries IS NOT NULL THEN map_from_entries(
           list_transform(list_filter(entries, lambda e: NOT list_contains(canonical, e.key)),
                          lambda e: {'key': e.key, 'value': TRY_CAST(e.value ->> '$' AS DOUBLE)}))
       END AS user_metrics,
       n_keys,
       CASE
           WHEN NOT valid THEN 'not valid JSON'
           WHEN r IS NULL OR NOT starts_with(ltrim(line), '{') THEN 'not a JSON object'
           WHEN r.kind IS NULL OR r.kind = '' THEN 'missing field: kind'
           WHEN r.time IS NULL THEN 'field time is missing or not a number'
           WHEN r.rank IS NULL THEN 'field rank is missing or not an integer'
           WHEN r.step IS NULL THEN 'field step is missing or not an integer'
           WHEN r.timeline IS NULL THEN 'field timeline is missing or not an integer'
           WHEN r.seq IS NULL THEN 'field seq is missing or not an integer'
           WHEN r.rank <> floor(r.rank) OR r.step <> floor(r.step) OR r.timeline <> floor(r.timeline)
                OR r.seq <> floor(r.seq) THEN 'rank, step, timeline and seq must be integers'
           WHEN r.rank < 0 OR r.step < 0 OR r.timeline < 0 OR r.seq < 0
                THEN 'rank, step, timeline and seq must be >= 0'
           WHEN r.step > 9.2e18 OR r.seq > 9.2e18 OR r.rank > 2e9 OR r.timeline > 2e9
                THEN 'rank, step, timeline or seq out of range'
           WHEN NOT isfinite(r.time) THEN 'field time must be finite'
           WHEN $world_size IS NOT NULL AND r.rank >= $world_size
                THEN format('unknown rank {}: the run has world size {}', r.rank::BIGINT, $world_size)
           WHEN file_rank IS NOT NULL AND r.rank <> file_rank
                THEN format('rank {} written in the file of rank {}', r.rank::BIGINT, file_rank)
           WHEN r.metrics IS NOT NULL AND NOT starts_with(ltrim(r.metrics::VARCHAR), '{')
                THEN 'field metrics must be an object'
           WHEN len(bad_entries) > 0
                THEN format('metrics.{} must be a number, got {}', bad_entries[1].key, bad_entries[1].value)
           WHEN r.kind IN ('step', 'rank_step', 'eval') AND r.metrics IS NULL
                THEN format('a {} record needs metrics', r.kind)
           WHEN r.kind = 'eval' AND n_keys = 0 THEN 'an eval record needs at least one score in metrics'
           WHEN r.kind = 'checkpoint' AND r.event IS NULL THEN 'a checkpoint record needs event'
           WHEN r.kind = 'checkpoint' AND r.event NOT IN
                ('save_started', 'saved', 'save_failed', 'verified', 'corrupt', 'loaded', 'deleted')
                THEN format('unknown checkpoint event {}', r.event)
           WHEN r.kind = 'action' AND (r.action IS NULL OR r.status IS NULL OR r.request_id IS NULL)
                THEN 'an action record needs action, status and request_id'
           WHEN r.kind = 'action' AND r.status NOT IN ('requested', 'applied', 'rejected')
                THEN format('unknown action status {}', r.status)
           WHEN r.kind = 'log' AND r.message IS NULL THEN 'a log record needs message'
           WHEN r.kind = 'run_end' AND r.status NOT IN ('finished', 'failed', 'aborted')
                THEN 'a run_end record needs status finished, failed or aborted'
           WHEN r.kind = 'run_end' AND r.status IS NULL
                THEN 'a run_end record needs status finished, failed or aborted'
           WHEN r.kind = 'fault_injected' AND r.fault IS NULL THEN 'a fault_injected record needs fault'
           WHEN r.kind = 'rank_info' AND r.host IS NULL THEN 'a rank_info record needs host'
       END AS reason
FROM checked;
