-- Dashboard: what a run reports that the Runs page can compare: each training metric (canonical or user) and each
-- eval score (by split and name), its values, and whether those values can be placed by tokens and by FLOPs spent.
WITH canonical AS (
    UNPIVOT (SELECT count(loss) AS loss, count(grad_norm) AS grad_norm, count(lr) AS lr, count(tokens) AS tokens,
                    count(flops) AS flops
             FROM step_metrics)
    ON loss, grad_norm, lr, tokens, flops INTO NAME name VALUE points
), user_metrics AS (
    SELECT e.key AS name, count(e.value) AS points
    FROM step_metrics, unnest(map_entries(extra)) AS u(e) WHERE extra IS NOT NULL GROUP BY name
), axes AS (
    SELECT count(tokens) > 0 AS by_tokens, count(flops) > 0 AS by_flops FROM step_metrics
)
SELECT 'train' AS source, '' AS split, name, points, by_tokens, by_flops
FROM (SELECT * FROM canonical UNION ALL SELECT * FROM user_metrics), axes WHERE points > 0
UNION ALL
SELECT 'eval', split, name, count(value), count(cum_tokens) > 0, count(cum_flops) > 0
FROM eval_scores GROUP BY split, name
ORDER BY source DESC, split, name;
