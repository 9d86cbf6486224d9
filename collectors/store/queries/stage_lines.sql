-- Parse a batch of raw telemetry lines (the registered Arrow table batch_lines:
-- source_id, file_rank, line_offset, line with its newline) into the temp table
-- staged, with a rejection reason for every line that breaks the format.
-- Parameters: $world_size, the run's world size (NULL when unknown);
-- $check_json, validate JSON first (false on the first try: a malformed line
-- then makes the whole statement fail, and the collector retries with true);
-- $checkpoint_events, $action_statuses, $run_end_statuses, $step_metrics,
-- $rank_step_metrics and $checkpoint_metrics, the format's enums and canonical
-- metric names (lists, from collectors/format.py); $max_rank (largest rank and
-- timeline), $max_exact_integer (2^53: step and seq stay below it) and
-- $max_kind_chars and $max_time (time is below it), the format's limits.
--
-- The hot kinds (step, rank_step) are parsed once, canonical metrics included;
-- only the rare kinds pay for their own fields, and only lines that may carry
-- user metrics or unknown fields pay for an exact look at their keys. The
-- number of colons in a line is an upper bound of its key count, which makes
-- that test cheap. Every metric value, canonical or not, is read by the same
-- rule: JSON's conversion to DOUBLE (numbers, numeric strings, "NaN",
-- "Infinity", "-Infinity", booleans as 1 and 0; null stays NULL).
-- A name given twice at the top level is rejected (DuckDB would keep the first
-- value, most JSON readers the last): such a line has more colons than known
-- keys, so it is among those looked at closer, whose keys are listed anyway.
CREATE OR REPLACE TEMP TABLE staged AS
WITH parsed AS (
    SELECT source_id, file_rank, line_offset, line,
           CASE WHEN (NOT $check_json) OR json_valid(line) THEN json_transform(line, '{
               "kind": "VARCHAR", "time": "DOUBLE", "rank": "DOUBLE", "step": "DOUBLE",
               "timeline": "DOUBLE", "seq": "DOUBLE", "param_checksum": "VARCHAR", "shards": "JSON",
               "metrics": {
                   "loss": "DOUBLE", "grad_norm": "DOUBLE", "lr": "DOUBLE", "tokens": "DOUBLE", "flops": "DOUBLE",
                   "step_time": "DOUBLE", "data_time": "DOUBLE", "compute_time": "DOUBLE", "comm_time": "DOUBLE",
                   "optimizer_time": "DOUBLE", "local_grad_norm": "DOUBLE", "cpu_wait_time": "DOUBLE",
                   "duration_s": "DOUBLE", "bytes": "DOUBLE"}
               }') END AS rec,
           length(line) - length(replace(line, ':', '')) AS colons
    FROM batch_lines
), typed AS (
    SELECT *, rec.metrics AS m,
           CASE WHEN rec.kind NOT IN ('step', 'rank_step') THEN json_transform(line, '{
               "split": "VARCHAR", "cum_tokens": "DOUBLE", "cum_flops": "DOUBLE", "event": "VARCHAR",
               "path": "VARCHAR", "message": "VARCHAR", "action": "VARCHAR", "status": "VARCHAR",
               "request_id": "VARCHAR", "operator": "VARCHAR", "reason": "VARCHAR", "args": "JSON",
               "host": "VARCHAR", "fault": "VARCHAR", "target_ranks": "JSON", "kind": "JSON",
               "local_rank": "DOUBLE", "world_size": "DOUBLE",
               "mesh": {"dp": "DOUBLE", "tp": "DOUBLE", "pp": "DOUBLE"}}') END AS kind_fields,
           -- the envelope, metrics, and the fields of its own kind: what a step or rank_step keeps in columns
           6 + (rec.metrics IS NOT NULL)::INT
             + (rec.kind = 'rank_step' AND rec.param_checksum IS NOT NULL)::INT
             + (rec.kind = 'step' AND rec.shards IS NOT NULL)::INT AS known_keys
    FROM parsed
), counted AS (
    SELECT *,
           CASE rec.kind
               WHEN 'step' THEN (m.loss IS NOT NULL)::INT + (m.grad_norm IS NOT NULL)::INT + (m.lr IS NOT NULL)::INT
                                + (m.tokens IS NOT NULL)::INT + (m.flops IS NOT NULL)::INT
               WHEN 'rank_step' THEN (m.step_time IS NOT NULL)::INT + (m.data_time IS NOT NULL)::INT
                                + (m.compute_time IS NOT NULL)::INT + (m.comm_time IS NOT NULL)::INT
                                + (m.optimizer_time IS NOT NULL)::INT + (m.local_grad_norm IS NOT NULL)::INT
                                + (m.cpu_wait_time IS NOT NULL)::INT
           END AS n_canonical
    FROM typed
), careful AS (
    SELECT *,
           rec.kind NOT IN ('step', 'rank_step') OR colons > known_keys + n_canonical AS look_closer
    FROM counted
), listed AS (
    SELECT *, CASE WHEN look_closer THEN json_keys(line) END AS keys FROM careful
), examined AS (
    SELECT *,
           CASE WHEN look_closer THEN list_filter(keys, lambda k, i: list_position(keys, k) < i)[1] END AS repeated_key,
           -- a rank_info's placement must fit the ranks view's integers
           CASE WHEN rec.kind = 'rank_info' THEN list_filter([
               {'name': 'local_rank', 'low': 0, 'raw': line -> '$.local_rank', 'value': kind_fields.local_rank},
               {'name': 'world_size', 'low': 1, 'raw': line -> '$.world_size', 'value': kind_fields.world_size},
               {'name': 'mesh.dp', 'low': 0, 'raw': line -> '$.mesh.dp', 'value': kind_fields.mesh.dp},
               {'name': 'mesh.tp', 'low': 0, 'raw': line -> '$.mesh.tp', 'value': kind_fields.mesh.tp},
               {'name': 'mesh.pp', 'low': 0, 'raw': line -> '$.mesh.pp', 'value': kind_fields.mesh.pp}],
               lambda f: f.raw IS NOT NULL AND json_type(f.raw) <> 'NULL'
                         AND NOT coalesce(f.value BETWEEN f.low AND $max_rank AND f.value = floor(f.value), false))
           END AS bad_placement,
           CASE WHEN look_closer THEN list_transform(
               map_entries(json_transform(line, '{"metrics": "MAP(VARCHAR, JSON)"}').metrics),
               lambda e: {'key': e.key, 'raw': e.value, 'value': json_transform(e.value, '"DOUBLE"')}) END AS entries,
           CASE WHEN look_closer AND rec.kind IN ('step', 'rank_step')
                THEN len(keys) > known_keys ELSE false END AS has_unknown_fields
    FROM listed
), checked AS (
    SELECT *,
           list_filter(entries, lambda e: e.value IS NULL AND e.raw IS NOT NULL AND json_type(e.raw) <> 'NULL')
               AS bad_entries,
           CASE
               WHEN rec IS NULL THEN 'not valid JSON'
               WHEN repeated_key IS NOT NULL THEN format('field {} appears more than once', repeated_key)
               WHEN rec.kind IS NULL OR rec.kind = '' THEN 'missing field: kind'
               WHEN rec.kind NOT IN ('step', 'rank_step') AND NOT starts_with(kind_fields.kind::VARCHAR, '"')
                    THEN format('field kind must be a string, got {}', left(kind_fields.kind::VARCHAR, 200))
               WHEN length(rec.kind) > $max_kind_chars
                    THEN format('field kind is {} characters long, over the limit of {}', length(rec.kind), $max_kind_chars)
               WHEN rec.time IS NULL THEN 'field time is missing or not a number'
               WHEN rec.rank IS NULL THEN 'field rank is missing or not an integer'
               WHEN rec.step IS NULL THEN 'field step is missing or not an integer'
               WHEN rec.timeline IS NULL THEN 'field timeline is missing or not an integer'
               WHEN rec.seq IS NULL THEN 'field seq is missing or not an integer'
               WHEN rec.rank <> floor(rec.rank) OR rec.step <> floor(rec.step) OR rec.timeline <> floor(rec.timeline)
                    OR rec.seq <> floor(rec.seq) THEN 'rank, step, timeline and seq must be integers'
               WHEN rec.rank < 0 OR rec.step < 0 OR rec.timeline < 0 OR rec.seq < 0
                    THEN 'rank, step, timeline and seq must be >= 0'
               WHEN rec.step >= $max_exact_integer THEN 'step must be below 2^53 (9007199254740992)'
               WHEN rec.seq >= $max_exact_integer THEN 'seq must be below 2^53 (9007199254740992)'
               WHEN rec.rank > $max_rank OR rec.timeline > $max_rank
                    THEN format('rank and timeline must be at most {}', $max_rank)
               WHEN NOT isfinite(rec.time) THEN 'field time must be finite'
               -- 0 stays valid (imports use a clock from 0); milli- or nanosecond epochs do not fit
               WHEN rec.time < 0 OR rec.time >= $max_time
                    THEN format('time must be unix seconds, got {}', line -> '$.time')
               WHEN $world_size IS NOT NULL AND rec.rank >= $world_size
                    THEN format('unknown rank {}: the run has world size {}', rec.rank::BIGINT, $world_size)
               WHEN file_rank IS NOT NULL AND rec.rank <> file_rank
                    THEN format('rank {} written in the file of rank {}', rec.rank::BIGINT, file_rank)
               -- a number, boolean, object or array reads as its JSON text: only a text that reads like
               -- one of those needs a look at the line
               WHEN rec.kind = 'rank_step'
                    AND (left(rec.param_checksum, 1) IN ('{', '[')
                         OR regexp_full_match(rec.param_checksum, '-?[0-9][0-9.eE+-]*|true|false'))
                    AND json_type(line, '$.param_checksum') <> 'VARCHAR'
                    THEN format('field param_checksum must be a string, got {}', left(rec.param_checksum, 200))
               WHEN rec.kind = 'step' AND rec.shards IS NOT NULL AND NOT starts_with(rec.shards::VARCHAR, '[')
                    THEN format('field shards must be an array, got {}', left(rec.shards::VARCHAR, 200))
               -- A non-object metrics parses as an all-NULL struct: only then (no canonical value) look.
               WHEN rec.metrics IS NOT NULL AND coalesce(n_canonical, 0) = 0
                    AND json_type(line, '$.metrics') <> 'OBJECT' THEN 'field metrics must be an object'
               -- DuckDB reads an object that repeats a name as no map at all
               WHEN look_closer AND rec.metrics IS NOT NULL AND entries IS NULL
                    THEN 'field metrics names a metric more than once'
               WHEN rec.kind IN ('step', 'rank_step', 'eval') AND rec.metrics IS NULL
                    THEN format('a {} record needs metrics (an object of numbers)', rec.kind)
               WHEN rec.kind = 'eval' AND len(entries) = 0 THEN 'an eval record needs at least one score in metrics'
               WHEN rec.kind = 'eval' AND kind_fields.cum_tokens IS NULL AND json_type(line, '$.cum_tokens') <> 'NULL'
                    THEN format('field cum_tokens must be a number, got {}', line -> '$.cum_tokens')
               WHEN rec.kind = 'eval' AND kind_fields.cum_flops IS NULL AND json_type(line, '$.cum_flops') <> 'NULL'
                    THEN format('field cum_flops must be a number, got {}', line -> '$.cum_flops')
               WHEN rec.kind = 'checkpoint' AND kind_fields.event IS NULL THEN 'a checkpoint record needs event'
               WHEN rec.kind = 'checkpoint' AND NOT list_contains($checkpoint_events, kind_fields.event)
                    THEN format('unknown checkpoint event {}', kind_fields.event)
               WHEN rec.kind = 'action'
                    AND (kind_fields.action IS NULL OR kind_fields.status IS NULL OR kind_fields.request_id IS NULL)
                    THEN 'an action record needs action, status and request_id'
               WHEN rec.kind = 'action' AND NOT list_contains($action_statuses, kind_fields.status)
                    THEN format('unknown action status {}', kind_fields.status)
               WHEN rec.kind = 'log' AND kind_fields.message IS NULL THEN 'a log record needs message'
               WHEN rec.kind = 'run_end' AND NOT coalesce(list_contains($run_end_statuses, kind_fields.status), false)
                    THEN format('a run_end record needs status, one of {}', array_to_string($run_end_statuses, ', '))
               WHEN rec.kind = 'fault_injected' AND kind_fields.fault IS NULL THEN 'a fault_injected record needs fault'
               WHEN rec.kind = 'rank_info' AND kind_fields.host IS NULL THEN 'a rank_info record needs host'
               WHEN len(bad_placement) > 0
                    THEN format('field {} must be an integer from {} to {}, got {}', bad_placement[1].name,
                                bad_placement[1].low, $max_rank, bad_placement[1].raw)
           END AS format_reason
    FROM examined
)
SELECT source_id, line_offset, rec, kind_fields,
       CASE WHEN rec.kind NOT IN ('step', 'rank_step') OR has_unknown_fields OR reason IS NOT NULL
            THEN rtrim(line, chr(13) || chr(10)) END AS line,
       CASE WHEN reason IS NOT NULL THEN strlen(line) END AS length,
       CASE WHEN entries IS NOT NULL THEN map_from_entries(
           list_transform(list_filter(entries, lambda e: NOT list_contains(
                              CASE rec.kind
                                  WHEN 'step' THEN $step_metrics
                                  WHEN 'rank_step' THEN $rank_step_metrics
                                  WHEN 'checkpoint' THEN $checkpoint_metrics
                                  ELSE []
                              END, e.key)),
                          lambda e: {'key': e.key, 'value': e.value}))
       END AS user_metrics,
       has_unknown_fields,
       reason
FROM (SELECT *,
             coalesce(format_reason, CASE WHEN len(bad_entries) > 0 THEN
                 format('metrics.{} must be a number, got {}', bad_entries[1].key, bad_entries[1].raw) END) AS reason
      FROM checked);
