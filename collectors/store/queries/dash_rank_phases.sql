-- Dashboard: each rank's median phase times in ms over the last $steps steps of one timeline, with its place, and
-- its compute and data time over its peers' (the median rank of its pipeline stage and TP index; every rank when
-- the run declares no topology): the slowest compute first.
WITH recent AS (
    SELECT * FROM rank_step_metrics
    WHERE timeline = $timeline AND step > (SELECT max(step) FROM rank_steps WHERE timeline = $timeline) - $steps
), per_rank AS (
    SELECT rank, any_value(host) AS host, any_value(dp) AS dp, any_value(tp) AS tp, any_value(pp) AS pp,
           1000 * median(step_time) AS step_ms, 1000 * median(data_time) AS data_ms,
           1000 * median(compute_time) AS compute_ms, 1000 * median(comm_time) AS comm_ms,
           1000 * median(optimizer_time) AS optimizer_ms
    FROM recent
    GROUP BY rank
)
SELECT *, compute_ms / nullif(median(compute_ms) OVER peers, 0) AS compute_slowdown,
       data_ms / nullif(median(data_ms) OVER peers, 0) AS data_slowdown
FROM per_rank
WINDOW peers AS (PARTITION BY pp, tp)
ORDER BY compute_slowdown DESC NULLS LAST, rank;
