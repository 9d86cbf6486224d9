-- Dashboard: the job-level training curves, every timeline.
SELECT timeline, step, time, loss, grad_norm, lr FROM step_metrics ORDER BY timeline, step;
