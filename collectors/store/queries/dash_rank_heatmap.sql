-- Dashboard: each rank's $phase time ('data', 'compute', 'comm', 'optimizer', else the step's) over the median of its
-- peers' at the same step (the ranks at its place: the same pipeline stage and TP index; every rank when the run
-- declares no topology), averaged over each bucket of $bucket steps, on one timeline: 1 is typical, 2 twice as slow.
WITH times AS (
    SELECT rank, step, coalesce(pp, -1) AS pp, coalesce(tp, -1) AS tp,
           CASE $phase WHEN 'data' THEN data_time WHEN 'compute' THEN compute_time WHEN 'comm' THEN comm_time
                       WHEN 'optimizer' THEN optimizer_time ELSE step_time END AS seconds
    FROM rank_step_metrics
    WHERE timeline = $timeline
), peers AS (
    SELECT step, pp, tp, median(seconds) AS typical FROM times GROUP BY ALL
)
SELECT rank, (step // $bucket) * $bucket AS step, avg(seconds / nullif(typical, 0)) AS ratio
FROM times JOIN peers USING (step, pp, tp)
GROUP BY ALL
ORDER BY rank, step;
