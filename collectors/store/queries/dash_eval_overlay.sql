-- Dashboard: one run's headline held-out metric against compute (the runs overlay).
SELECT step, cum_flops, value FROM eval_scores WHERE name = $name ORDER BY cum_flops;
