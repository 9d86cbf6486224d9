-- bedside demo: each rank's median phase times while the straggler is slowed; own_ms is
-- its compute less its wait for a CPU (the host's other processes), the work it did.
SELECT rank, host,
       round(median(compute_time) * 1000, 1) AS compute_ms,
       round(median(cpu_wait_time) * 1000, 1) AS cpu_wait_ms,
       round(median(compute_time - coalesce(cpu_wait_time, 0)) * 1000, 1) AS own_ms,
       round(median(comm_time) * 1000, 1) AS comm_ms
FROM rank_step_metrics
WHERE step BETWEEN $first AND $last
GROUP BY ALL
ORDER BY rank;
