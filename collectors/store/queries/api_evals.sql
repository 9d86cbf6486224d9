-- bedside.open(RUN).evals(): every eval score, in order (docs/python.md).
SELECT * FROM eval_scores ORDER BY timeline, step, split, name
