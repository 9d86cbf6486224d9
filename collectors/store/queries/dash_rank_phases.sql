-- Dashboard: each rank's median phase times over the last $steps steps of one timeline, with its place.
WITH recent AS (
    SELECT * FROM rank_step_metrics
    WHERE timeline = $timeline AND step > (SELECT max(step) FROM rank_steps WHERE timeline = $timeline) - $steps
)
SELECT rank, any_value(host) AS host, any_value(dp) AS dp, any_value(tp) AS tp, any_value(pp) AS pp,
       median(step_time) AS step_time, median(data_time) AS data_time, median(compute_time) AS compute_time,
       median(comm_time) AS comm_time, median(optimizer_time) AS optimizer_time
FROM recent
GROUP BY rank
ORDER BY host, pp, tp, dp, rank;
