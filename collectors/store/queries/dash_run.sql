-- Dashboard: the run's identity and status (docs/dashboard.md).
SELECT run_id, name, world_size, last_step, timeline, epoch(last_seen) AS last_seen, status,
       try_cast(config ->> 'peak_flops_per_device' AS DOUBLE) AS peak_flops_per_device,
       try_cast(config ->> 'global_batch' AS BIGINT) AS global_batch,
       try_cast(config -> 'data' ->> 'samples_per_shard' AS BIGINT) AS samples_per_shard
FROM run;
