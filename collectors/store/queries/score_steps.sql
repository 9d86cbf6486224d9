-- The steps a run scored over: its last job-level step (0 when it has none).
SELECT coalesce(max(step), 0) AS last_step FROM steps;
