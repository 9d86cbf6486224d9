-- bedside demo: each rank's gradient norm before the all-reduce at one step.
SELECT step, rank, local_grad_norm FROM rank_step_metrics WHERE step = $step ORDER BY rank;
