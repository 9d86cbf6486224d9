-- Dashboard: the slowest step time of each rank in each bucket of $bucket steps, on one timeline.
SELECT rank, (step // $bucket) * $bucket AS step, max(step_time) AS step_time
FROM rank_steps
WHERE timeline = $timeline
GROUP BY ALL
ORDER BY rank, step;
