-- Dashboard: the newest good checkpoint (verified, else saved; never one a `corrupt` event names by path) and
-- the work since it on the live timeline (0 FLOPs when no step came after it; NULL when steps report none).
WITH corrupt AS (
    SELECT DISTINCT path FROM checkpoint_events WHERE event = 'corrupt' AND path IS NOT NULL
), sound AS (
    SELECT * FROM checkpoint_events WHERE path IS NULL OR path NOT IN (SELECT path FROM corrupt)
), good AS (
    SELECT timeline, step, time FROM sound
    WHERE event = 'verified' OR (event = 'saved' AND NOT EXISTS (SELECT 1 FROM sound WHERE event = 'verified'))
), live AS (
    SELECT * FROM step_metrics WHERE timeline = (SELECT max(timeline) FROM step_metrics)
), last_good AS (
    SELECT * FROM good ORDER BY time DESC LIMIT 1
)
SELECT g.step AS checkpoint_step, g.time AS checkpoint_time,
       (SELECT max(step) FROM live) - g.step AS steps_at_risk,
       (SELECT max(time) FROM live) - g.time AS seconds_at_risk,
       (SELECT CASE WHEN count(*) = 0 THEN 0 ELSE sum(flops) END FROM live WHERE step > g.step) AS flops_at_risk
FROM last_good g;
