-- bedside demo: each rank's median phase times while the straggler is slowed.
SELECT rank, host,
       round(median(compute_time) * 1000, 1) AS compute_ms,
       round(median(comm_time) * 1000, 1) AS comm_ms
FROM rank_step_metrics
WHERE step BETWEEN $first AND $last
GROUP BY ALL
ORDER BY rank;
