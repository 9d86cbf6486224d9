-- bedside demo: every non-finite local gradient norm, with its rank and step.
SELECT rank, step, local_grad_norm FROM rank_step_metrics WHERE NOT isfinite(local_grad_norm);
