-- Dashboard: the job-level training curves of every timeline, with each step's pace: step_s, the wall time since
-- the timeline's previous step record per step between them, and tokens_per_s, the step's tokens over it (NULL for
-- the first step of a timeline, and where the run reports no tokens). nonfinite names the metrics whose value was
-- NaN or infinite (a value not reported is NULL, not NaN: it is no alarm).
SELECT timeline, step, time, loss, grad_norm, lr, tokens, step_s, tokens / step_s AS tokens_per_s,
       list_filter(
           [CASE WHEN NOT isfinite(loss) THEN 'loss' END, CASE WHEN NOT isfinite(grad_norm) THEN 'grad_norm' END,
            CASE WHEN NOT isfinite(lr) THEN 'lr' END],
           lambda name: name IS NOT NULL
       ) AS nonfinite
FROM (
    SELECT *, nullif(time - lag(time) OVER pace, 0) / nullif(step - lag(step) OVER pace, 0) AS step_s
    FROM step_metrics
    WINDOW pace AS (PARTITION BY timeline ORDER BY step, time)
)
ORDER BY timeline, step;
