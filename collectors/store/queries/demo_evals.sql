-- bedside demo: held-out loss, and how far it is above the language's entropy floor, against compute spent.
SELECT step, cum_flops,
       round(max(value) FILTER (name = 'loss'), 3) AS heldout_loss,
       round(max(value) FILTER (name = 'excess_loss'), 3) AS above_floor
FROM eval_scores
GROUP BY step, cum_flops
ORDER BY step;
