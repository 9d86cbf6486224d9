-- bedside demo: job-level metrics in the five steps around the bad shard's loss spike.
SELECT step, round(loss, 3) AS loss, round(grad_norm, 2) AS grad_norm, shards
FROM step_metrics
WHERE step BETWEEN $spike_step - 2 AND $spike_step + 2
ORDER BY step;
