-- bedside demo: each rank's median phase times while the straggler is slowed; own_ms is
-- its compute less its wait for a CPU (the host's other processes), the work it did, and
-- own_before_ms the same over as many steps just before, so a slowdown reads against the
-- rank itself as well as against its peers.
SELECT rank, host,
       round(median(compute_time) FILTER (step >= $first) * 1000, 1) AS compute_ms,
       round(median(cpu_wait_time) FILTER (step >= $first) * 1000, 1) AS cpu_wait_ms,
       round(median(compute_time - coalesce(cpu_wait_time, 0)) FILTER (step < $first) * 1000, 1) AS own_before_ms,
       round(median(compute_time - coalesce(cpu_wait_time, 0)) FILTER (step >= $first) * 1000, 1) AS own_ms,
       round(median(comm_time) FILTER (step >= $first) * 1000, 1) AS comm_ms
FROM rank_step_metrics
WHERE step BETWEEN 2 * $first - $last - 1 AND $last
GROUP BY ALL
ORDER BY rank;
