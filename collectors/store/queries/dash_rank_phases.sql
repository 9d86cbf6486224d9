-- Dashboard: each rank's median phase times in ms over the last $steps steps of one timeline, with its place, and
-- its compute and data time over its peers' (the median rank of its pipeline stage and TP index; every rank when
-- the run declares no topology): the slowest compute first.
WITH per_rank AS (
    SELECT rank, 1000 * median(step_time) AS step_ms, 1000 * median(data_time) AS data_ms,
           1000 * median(compute_time) AS compute_ms, 1000 * median(comm_time) AS comm_ms,
           1000 * median(optimizer_time) AS optimizer_ms
    FROM rank_steps
    WHERE timeline = $timeline AND step > (SELECT max(step) FROM rank_steps WHERE timeline = $timeline) - $steps
    GROUP BY rank
)
SELECT p.rank, r.host, r.dp, r.tp, r.pp, p.step_ms, p.data_ms, p.compute_ms, p.comm_ms, p.optimizer_ms,
       p.compute_ms / nullif(median(p.compute_ms) OVER peers, 0) AS compute_slowdown,
       p.data_ms / nullif(median(p.data_ms) OVER peers, 0) AS data_slowdown
FROM per_rank p LEFT JOIN ranks r USING (rank)
WINDOW peers AS (PARTITION BY r.pp, r.tp)
ORDER BY compute_slowdown DESC NULLS LAST, p.rank;
