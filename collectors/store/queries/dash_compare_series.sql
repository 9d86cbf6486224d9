-- Dashboard: one metric of a run against the x axis the Runs page compares by, every timeline, at most 2 x $buckets
-- points per timeline (each bucket's lowest and highest value: a one-step spike survives; NaN counts as highest).
-- $source 'train' reads the step records' metric $name (canonical or user); 'eval' the eval score $name of $split.
-- $x: 'step'; 'tokens' or 'flops' spent (every timeline, in time order; NULL where the run reports none); 'time',
-- seconds since the run's first step or eval.
WITH started AS (
    SELECT coalesce((SELECT min(time) FROM step_metrics), (SELECT min(time) FROM eval_scores)) AS t0
), train AS (
    SELECT timeline, step, time,
           CASE WHEN count(tokens) OVER () > 0 THEN spent_tokens END AS tokens,
           CASE WHEN count(flops) OVER () > 0 THEN spent_flops END AS flops,
           CASE $name WHEN 'loss' THEN loss WHEN 'grad_norm' THEN grad_norm WHEN 'lr' THEN lr
                      WHEN 'tokens' THEN tokens WHEN 'flops' THEN flops ELSE extra[$name] END AS value
    FROM step_metrics WHERE $source = 'train'
), evals AS (
    SELECT timeline, step, time, cum_tokens, cum_flops, value
    FROM eval_scores WHERE $source = 'eval' AND split = $split AND name = $name
), series AS (
    SELECT timeline, step, value,
           CASE $x WHEN 'step' THEN step WHEN 'tokens' THEN tokens WHEN 'flops' THEN flops ELSE time - t0 END AS x
    FROM (SELECT * FROM train UNION ALL SELECT * FROM evals), started
), bucketed AS (
    SELECT *, (row_number() OVER (PARTITION BY timeline ORDER BY x, step) - 1) * $buckets
              // count(*) OVER (PARTITION BY timeline) AS bucket
    FROM series WHERE x IS NOT NULL AND value IS NOT NULL
), ranked AS (
    SELECT *, row_number() OVER (PARTITION BY timeline, bucket ORDER BY value, step) AS lowest,
              row_number() OVER (PARTITION BY timeline, bucket ORDER BY value DESC, step) AS highest
    FROM bucketed
)
SELECT timeline, step, x, value FROM ranked WHERE lowest = 1 OR highest = 1 ORDER BY timeline, x, step;
