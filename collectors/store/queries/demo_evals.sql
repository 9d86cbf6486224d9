-- bedside demo: the held-out eval scores and the compute spent to reach them.
SELECT step, name, round(value, 3) AS value, cum_flops FROM eval_scores ORDER BY step, name;
