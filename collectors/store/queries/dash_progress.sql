-- Dashboard: progress on the live (newest) timeline, and the pace of its last $window steps. Tokens and FLOPs spent
-- are NULL, not 0, for a run that reports none.
WITH live AS (
    SELECT * FROM step_metrics WHERE timeline = (SELECT max(timeline) FROM step_metrics)
), recent AS (
    SELECT * FROM live ORDER BY step DESC LIMIT $window
)
SELECT (SELECT max(step) FROM live) AS step,
       (SELECT max(timeline) FROM live) AS timeline,
       (SELECT max(spent_tokens) FILTER (WHERE tokens IS NOT NULL) FROM step_metrics) AS spent_tokens,
       (SELECT max(spent_flops) FILTER (WHERE flops IS NOT NULL) FROM step_metrics) AS spent_flops,
       (sum(tokens) - arg_min(tokens, time)) / nullif(max(time) - min(time), 0) AS tokens_per_s,
       (sum(flops) - arg_min(flops, time)) / nullif(max(time) - min(time), 0) AS flops_per_s,
       max(time) AS last_step_time
FROM recent;
