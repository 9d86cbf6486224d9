-- bedside.open(RUN).run(): the run view's one row (docs/python.md).
SELECT * FROM run
