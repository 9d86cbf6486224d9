-- bedside.open(RUN).rank_steps(): every rank's step record, in order (docs/python.md).
SELECT * FROM rank_step_metrics ORDER BY timeline, step, rank, time
