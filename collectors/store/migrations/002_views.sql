-- Documented views (docs/schema.md). Queries, the dashboard and post-mortems
-- read these, not the tables, so that tables can change under a migration.

CREATE OR REPLACE VIEW ranks AS
WITH declared AS (
    SELECT rank, host, local_rank, dp, tp, pp, 'run.json' AS declared_by FROM rank_topology
), reported AS (
    SELECT rank,
           arg_max(payload ->> 'host', time)                      AS host,
           arg_max(CAST(payload ->> 'local_rank' AS INTEGER), time) AS local_rank,
           arg_max(CAST(payload ->> '$.mesh.dp' AS INTEGER), time)  AS dp,
           arg_max(CAST(payload ->> '$.mesh.tp' AS INTEGER), time)  AS tp,
           arg_max(CAST(payload ->> '$.mesh.pp' AS INTEGER), time)  AS pp,
           'rank_info' AS declared_by
    FROM events WHERE kind = 'rank_info' GROUP BY rank
)
SELECT * FROM declared
UNION ALL
SELECT * FROM reported WHERE rank NOT IN (SELECT rank FROM declared);

CREATE OR REPLACE VIEW step_metrics AS
SELECT timeline, step, to_timestamp(time) AS ts, time, rank,
       loss, grad_norm, lr, tokens, flops,
       sum(coalesce(tokens, 0)) OVER spent AS spent_tokens,
       sum(coalesce(flops, 0)) OVER spent  AS spent_flops,
       shards, extra
FROM steps
WINDOW spent AS (ORDER BY time, source_id, line_offset ROWS UNBOUNDED PRECEDING);

CREATE OR REPLACE VIEW eval_scores AS
SELECT timeline, step, to_timestamp(time) AS ts, time, split,
       e.key AS name, e.value AS value, cum_tokens, cum_flops
FROM evals, unnest(map_entries(scores)) AS u(e);

CREATE OR REPLACE VIEW checkpoint_events AS
SELECT timeline, step, to_timestamp(time) AS ts, time, rank, event, path, duration_s, bytes, message
FROM checkpoints;

CREATE OR REPLACE VIEW action_events AS
SELECT timeline, step, to_timestamp(time) AS ts, time, rank, request_id, action, status,
       operator, reason, message, args
FROM actions;

CREATE OR REPLACE VIEW event_log AS
SELECT timeline, step, to_timestamp(time) AS ts, time, rank, kind,
       payload ->> 'level' AS level,
       coalesce(payload ->> 'message', payload ->> 'status') AS message,
       payload
FROM events;

CREATE OR REPLACE VIEW fault_labels AS
SELECT timeline, step, to_timestamp(time) AS ts, time, rank, fault, target_ranks, args
FROM faults;

CREATE OR REPLACE VIEW rejected AS
SELECT s.path, r.line_offset, r.length, r.reason, r.line, to_timestamp(r.ingested_at) AS ingested_at
FROM rejected_lines r JOIN sources s USING (source_id);

CREATE OR REPLACE VIEW ingest_status AS
SELECT path, file_rank, committed_offset, lines, rejected, state, state_detail,
       to_timestamp(updated_at) AS updated_at
FROM sources;

CREATE OR REPLACE VIEW timelines AS
SELECT timeline, min(step) AS first_step, max(step) AS last_step,
       to_timestamp(min(time)) AS started, to_timestamp(max(time)) AS last_seen, count(*) AS steps
FROM steps GROUP BY timeline;

CREATE OR REPLACE VIEW run AS
WITH records AS (
    -- every telemetry record's rank and place in time (ground truth aside), with the
    -- status of those that end a rank
    SELECT rank, time, seq, NULL AS end_status FROM steps
    UNION ALL SELECT rank, time, seq, NULL FROM rank_steps
    UNION ALL SELECT rank, time, seq, NULL FROM evals
    UNION ALL SELECT rank, time, seq, NULL FROM checkpoints
    UNION ALL SELECT rank, time, seq, NULL FROM actions
    UNION ALL SELECT rank, time, seq, CASE WHEN kind = 'run_end' THEN payload ->> 'status' END FROM events
), ranks_latest AS (
    -- a rank has ended when its latest record (by time, then seq) is a run_end: one that
    -- restarts after a failure and keeps stepping is running again
    SELECT rank, max(time) AS time, arg_max_null(end_status, (time, seq)) AS end_status
    FROM records GROUP BY rank
), ends AS (
    SELECT count(end_status) AS ranks_ended,
           bool_or(end_status = 'failed')  AS any_failed,
           bool_or(end_status = 'aborted') AS any_aborted,
           max(time) AS last_seen
    FROM ranks_latest
), progress AS (
    SELECT max(step) AS last_step, max(timeline) AS timeline FROM steps
), world AS (
    -- run.json's world size, else the ranks that have written (a run without run.json)
    SELECT coalesce((SELECT max(world_size) FROM run_info),
                    (SELECT count(DISTINCT file_rank) FROM sources WHERE path LIKE 'telemetry/%')) AS size
)
SELECT i.run_id, i.name, to_timestamp(i.created) AS created, i.schema_version,
       w.size AS world_size,
       p.last_step, p.timeline, to_timestamp(e.last_seen) AS last_seen,
       CASE
           WHEN e.any_failed THEN 'failed'
           WHEN e.any_aborted THEN 'aborted'
           WHEN e.ranks_ended > 0 AND e.ranks_ended >= w.size THEN 'finished'
           WHEN e.last_seen IS NULL THEN 'empty'
           WHEN epoch(current_timestamp) - e.last_seen <= 120 THEN 'live'
           ELSE 'stalled'
       END AS status,
       i.config
FROM ends e CROSS JOIN progress p CROSS JOIN world w
LEFT JOIN run_info i ON true;
