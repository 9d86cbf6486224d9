-- Parse a batch of raw telemetry lines (the registered Arrow table batch_lines:
-- source_id, file_rank, line_offset, line with its newline) into the temp table
-- staged, with a rejection reason for every line that breaks the format.
-- Parameters: $world_size, the run's world size (NULL when unknown);
-- $check_json, validate JSON first (false on the first try: a malformed line
-- then makes the whole statement fail, and the collector retries with true).
--
-- The hot kinds (step, rank_step) are parsed once, canonical metrics included;
-- only the rare kinds pay for their own fields, and only lines that may carry
-- user metrics or unknown fields pay for an exact look at their keys. The
-- number of colons in a line is an upper bound of its key count, which makes
-- that test cheap.
CREATE OR REPLACE TEMP TABLE staged AS
WITH parsed AS (
    SELECT source_id, file_rank, line_offset, line,
           CASE WHEN (NOT $check_json) OR json_valid(line) THEN json_transform(line, '{
               "kind": "VARCHAR", "time": "DOUBLE", "rank": "DOUBLE", "step": "DOUBLE",
               "timeline": "DOUBLE", "seq": "DOUBLE", "param_checksum": "VARCHAR", "shards": "JSON",
               "metrics": {
                   "loss": "DOUBLE", "grad_norm": "DOUBLE", "lr": "DOUBLE", "tokens": "DOUBLE", "flops": "DOUBLE",
                   "step_time": "DOUBLE", "data_time": "DOUBLE", "compute_time": "DOUBLE", "comm_time": "DOUBLE",
                   "optimizer_time": "DOUBLE", "local_grad_norm": "DOUBLE", "duration_s": "DOUBLE", "bytes": "DOUBLE"}
               }') END AS r,
           length(line) - length(replace(line, ':', '')) AS colons
    FROM batch_lines
), typed AS (
    SELECT *, r.metrics AS m,
           CASE WHEN r.kind NOT IN ('step', 'rank_step') THEN json_transform(line, '{
               "split": "VARCHAR", "cum_tokens": "DOUBLE", "cum_flops": "DOUBLE", "event": "VARCHAR",
               "path": "VARCHAR", "message": "VARCHAR", "action": "VARCHAR", "status": "VARCHAR",
               "request_id": "VARCHAR", "operator": "VARCHAR", "reason": "VARCHAR", "args": "JSON",
               "host": "VARCHAR", "fault": "VARCHAR", "target_ranks": "JSON"}') END AS x,
           6 + (r.metrics IS NOT NULL)::INT + (r.param_checksum IS NOT NULL)::INT + (r.shards IS NOT NULL)::INT
               AS known_keys
    FROM parsed
), counted AS (
    SELECT *,
           CASE r.kind
               WHEN 'step' THEN (m.loss IS NOT NULL)::INT + (m.grad_norm IS NOT NULL)::INT + (m.lr IS NOT NULL)::INT
                                + (m.tokens IS NOT NULL)::INT + (m.flops IS NOT NULL)::INT
               WHEN 'rank_step' THEN (m.step_time IS NOT NULL)::INT + (m.data_time IS NOT NULL)::INT
                                + (m.compute_time IS NOT NULL)::INT + (m.comm_time IS NOT NULL)::INT
                                + (m.optimizer_time IS NOT NULL)::INT + (m.local_grad_norm IS NOT NULL)::INT
           END AS n_canonical
    FROM typed
), careful AS (
    SELECT *,
           r.kind NOT IN ('step', 'rank_step') OR colons > known_keys + n_canonical AS look_closer
    FROM counted
), examined AS (
    SELECT *,
           CASE WHEN look_closer THEN
               map_entries(json_transform(line, '{"metrics": "MAP(VARCHAR, JSON)"}').metrics) END AS entries,
           CASE WHEN look_closer AND r.kind IN ('step', 'rank_step')
                THEN json_array_length(json_keys(line)) > known_keys ELSE false END AS has_unknown_fields
    FROM careful
), checked AS (
    SELECT *,
           list_filter(entries, lambda e: e.value IS NOT NULL AND json_type(e.value) <> 'NULL'
                                          AND TRY_CAST(e.value ->> '$' AS DOUBLE) IS NULL) AS bad_entries,
           CASE
               WHEN r IS NULL THEN 'not valid JSON'
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
               -- A non-object metrics parses as an all-NULL struct: only then (no canonical value) look.
               WHEN r.metrics IS NOT NULL AND coalesce(n_canonical, 0) = 0
                    AND json_type(line, '$.metrics') <> 'OBJECT' THEN 'field metrics must be an object'
               WHEN r.kind IN ('step', 'rank_step', 'eval') AND r.metrics IS NULL
                    THEN format('a {} record needs metrics (an object of numbers)', r.kind)
               WHEN r.kind = 'eval' AND len(entries) = 0 THEN 'an eval record needs at least one score in metrics'
               WHEN r.kind = 'checkpoint' AND x.event IS NULL THEN 'a checkpoint record needs event'
               WHEN r.kind = 'checkpoint' AND x.event NOT IN
                    ('save_started', 'saved', 'save_failed', 'verified', 'corrupt', 'loaded', 'deleted')
                    THEN format('unknown checkpoint event {}', x.event)
               WHEN r.kind = 'action' AND (x.action IS NULL OR x.status IS NULL OR x.request_id IS NULL)
                    THEN 'an action record needs action, status and request_id'
               WHEN r.kind = 'action' AND x.status NOT IN ('requested', 'applied', 'rejected')
                    THEN format('unknown action status {}', x.status)
               WHEN r.kind = 'log' AND x.message IS NULL THEN 'a log record needs message'
               WHEN r.kind = 'run_end' AND (x.status IS NULL OR x.status NOT IN ('finished', 'failed', 'aborted'))
                    THEN 'a run_end record needs status finished, failed or aborted'
               WHEN r.kind = 'fault_injected' AND x.fault IS NULL THEN 'a fault_injected record needs fault'
               WHEN r.kind = 'rank_info' AND x.host IS NULL THEN 'a rank_info record needs host'
           END AS format_reason
    FROM examined
)
SELECT source_id, line_offset, r, x,
       CASE WHEN r.kind NOT IN ('step', 'rank_step') OR has_unknown_fields OR reason IS NOT NULL
            THEN rtrim(line, chr(13) || chr(10)) END AS line,
       CASE WHEN reason IS NOT NULL THEN strlen(line) END AS length,
       CASE WHEN entries IS NOT NULL THEN map_from_entries(
           list_transform(list_filter(entries, lambda e: NOT list_contains(
                              CASE r.kind
                                  WHEN 'step' THEN ['loss', 'grad_norm', 'lr', 'tokens', 'flops']
                                  WHEN 'rank_step' THEN ['step_time', 'data_time', 'compute_time', 'comm_time',
                                                         'optimizer_time', 'local_grad_norm']
                                  WHEN 'checkpoint' THEN ['duration_s', 'bytes']
                                  ELSE []
                              END, e.key)),
                          lambda e: {'key': e.key, 'value': TRY_CAST(e.value ->> '$' AS DOUBLE)}))
       END AS user_metrics,
       has_unknown_fields,
       reason
FROM (SELECT *,
             coalesce(format_reason, CASE WHEN len(bad_entries) > 0 THEN
                 format('metrics.{} must be a number, got {}', bad_entries[1].key, bad_entries[1].value) END) AS reason
      FROM checked);
