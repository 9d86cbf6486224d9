-- The findings to score against the ground truth (detectors/scoring.py FINDING_COLUMNS).
SELECT finding_id, kind, severity, timeline, start_step, ranks FROM findings ORDER BY start_step, finding_id;
