-- Dashboard: the training curves of one timeline between two steps, with each step's time and tokens (an
-- incident's evidence: its throughput for an incident about speed).
SELECT step, time, loss, grad_norm, lr, tokens FROM step_metrics
WHERE timeline = $timeline AND step BETWEEN $first AND $last
ORDER BY step;
