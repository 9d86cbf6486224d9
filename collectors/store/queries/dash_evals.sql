-- Dashboard: every eval score with the compute spent at it.
SELECT timeline, step, split, name, value, cum_tokens, cum_flops FROM eval_scores ORDER BY timeline, step;
