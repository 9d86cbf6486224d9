-- bedside.open(RUN).findings(): every finding's latest version, in order (docs/python.md).
SELECT * FROM findings ORDER BY timeline, start_step, finding_id
