-- Dashboard: what a rewind to $to_step throws away on the live (newest) timeline: the steps after it, the wall
-- time and FLOPs they took, and the global batches that will be trained again (docs/dashboard.md).
WITH live AS (
    SELECT step, time, flops, try_cast(extra['batch'] AS BIGINT) AS batch
    FROM steps WHERE timeline = (SELECT max(timeline) FROM steps)
), lost AS (
    SELECT * FROM live WHERE step > $to_step
)
SELECT count(*) AS steps,
       max(time) - coalesce((SELECT max(time) FROM live WHERE step <= $to_step), min(time)) AS seconds,
       sum(flops) AS flops,
       min(batch) AS first_batch, max(batch) AS last_batch,
       min(step) AS first_step, max(step) AS last_step
FROM lost;
