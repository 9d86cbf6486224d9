-- Dashboard: each rank's mean $phase time ('data', 'compute', 'comm', 'optimizer', else the step's) over each bucket
-- of $bucket steps of one timeline, over the median of its peers' means in the same bucket (the ranks at its place:
-- the same pipeline stage and TP index; every rank when the run declares no topology): 1 is typical, 2 twice as
-- slow. Aggregated per rank first, so the peers' median is taken over (ranks x buckets), not (ranks x steps).
WITH cells AS (
    SELECT rank, (step // $bucket) * $bucket AS step,
           avg(CASE $phase WHEN 'data' THEN data_time WHEN 'compute' THEN compute_time WHEN 'comm' THEN comm_time
                           WHEN 'optimizer' THEN optimizer_time ELSE step_time END) AS seconds
    FROM rank_steps
    WHERE timeline = $timeline
    GROUP BY ALL
), placed AS (
    SELECT c.rank, c.step, c.seconds, coalesce(r.pp, -1) AS pp, coalesce(r.tp, -1) AS tp
    FROM cells c LEFT JOIN ranks r USING (rank)
)
SELECT rank, step, seconds / nullif(median(seconds) OVER (PARTITION BY step, pp, tp), 0) AS ratio
FROM placed
ORDER BY rank, step;
