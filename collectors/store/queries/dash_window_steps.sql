-- Dashboard: the training curves of one timeline between two steps (an incident's evidence).
SELECT step, loss, grad_norm, lr FROM step_metrics
WHERE timeline = $timeline AND step BETWEEN $first AND $last
ORDER BY step;
