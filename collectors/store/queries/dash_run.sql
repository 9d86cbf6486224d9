-- Dashboard: the run's identity and status (docs/dashboard.md).
SELECT run_id, name, world_size, last_step, timeline, epoch(last_seen) AS last_seen, status,
       try_cast(config ->> 'peak_flops_per_device' AS DOUBLE) AS peak_flops_per_device
FROM run;
