-- Dashboard: per-rank step and compute times of one timeline between two steps (an incident's evidence).
SELECT rank, step, step_time, compute_time, local_grad_norm FROM rank_steps
WHERE timeline = $timeline AND step BETWEEN $first AND $last
ORDER BY rank, step;
