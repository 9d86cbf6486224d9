-- bedside demo: each rank's median compute and communication time once the straggler slows down.
SELECT rank, host,
       round(median(compute_time) * 1000, 1) AS compute_ms,
       round(median(comm_time) * 1000, 1) AS comm_ms
FROM rank_step_metrics
WHERE step >= $straggler_from
GROUP BY ALL
ORDER BY rank;
