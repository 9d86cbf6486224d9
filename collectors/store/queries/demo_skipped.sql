-- bedside demo: the trainer's error log lines (updates skipped on non-finite gradients).
SELECT step, rank, message FROM event_log WHERE kind = 'log' AND level = 'error' ORDER BY step;
