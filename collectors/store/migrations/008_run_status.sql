-- The run-status rule, in one place: the run view below and `bedside runs`
-- (collectors/runs.py, which reads only the files' tails) both evaluate this macro.
-- A rank has ended when its latest record is a run_end. The run has failed (or was
-- aborted) when an ended rank says so, has finished when every rank has ended, is empty
-- without records, and is live while its newest record is at most 120 seconds old
-- (stalled after that). `now` and `last_seen` are unix seconds.
CREATE OR REPLACE MACRO run_status(any_failed, any_aborted, ranks_ended, world_size, last_seen, now) AS
    CASE
        WHEN any_failed THEN 'failed'
        WHEN any_aborted THEN 'aborted'
        WHEN ranks_ended > 0 AND ranks_ended >= world_size THEN 'finished'
        WHEN last_seen IS NULL THEN 'empty'
        WHEN now - last_seen <= 120 THEN 'live'
        ELSE 'stalled'
    END;

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
       run_status(e.any_failed, e.any_aborted, e.ranks_ended, w.size, e.last_seen, epoch(current_timestamp)) AS status,
       i.config
FROM ends e CROSS JOIN progress p CROSS JOIN world w
LEFT JOIN run_info i ON true;
