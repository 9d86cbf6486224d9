-- cpu_wait_time: the seconds a rank's thread waited on a run queue for a CPU during the
-- step's work (the kit reads Linux's schedstat), so that a rank slowed by processes it
-- shares a host with is told apart from a rank slow of itself. The two views that list
-- the per-rank metrics are defined here, with it (they were in 002 before it).
ALTER TABLE rank_steps ADD COLUMN cpu_wait_time DOUBLE;

CREATE OR REPLACE VIEW rank_step_metrics AS
SELECT s.timeline, s.step, to_timestamp(s.time) AS ts, s.time, s.rank,
       r.host, r.local_rank, r.dp, r.tp, r.pp,
       s.step_time, s.data_time, s.compute_time, s.comm_time, s.optimizer_time,
       s.local_grad_norm, s.cpu_wait_time, s.param_checksum, s.extra
FROM rank_steps s LEFT JOIN ranks r USING (rank);

CREATE OR REPLACE VIEW metrics AS
WITH job AS (
    UNPIVOT (SELECT timeline, step, time, rank, loss, grad_norm, lr, tokens, flops FROM steps)
    ON loss, grad_norm, lr, tokens, flops INTO NAME name VALUE value
), per_rank AS (
    UNPIVOT (SELECT timeline, step, time, rank, step_time, data_time, compute_time, comm_time,
                    optimizer_time, local_grad_norm, cpu_wait_time FROM rank_steps)
    ON step_time, data_time, compute_time, comm_time, optimizer_time, local_grad_norm, cpu_wait_time
    INTO NAME name VALUE value
), user_job AS (
    SELECT timeline, step, time, rank, e.key AS name, e.value AS value
    FROM steps, unnest(map_entries(extra)) AS u(e) WHERE extra IS NOT NULL
), user_rank AS (
    SELECT timeline, step, time, rank, e.key AS name, e.value AS value
    FROM rank_steps, unnest(map_entries(extra)) AS u(e) WHERE extra IS NOT NULL
)
SELECT 'step' AS kind, timeline, step, time, rank, name, value FROM job
UNION ALL SELECT 'step', timeline, step, time, rank, name, value FROM user_job
UNION ALL SELECT 'rank_step', timeline, step, time, rank, name, value FROM per_rank
UNION ALL SELECT 'rank_step', timeline, step, time, rank, name, value FROM user_rank
UNION ALL SELECT 'eval', timeline, step, time, NULL, 'eval/' || name, value FROM eval_scores;
