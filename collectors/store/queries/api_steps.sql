-- bedside.open(RUN).steps(): every job-level step record, in order (docs/python.md).
SELECT * FROM step_metrics ORDER BY timeline, step, rank, time
