INSERT INTO finding_rows
SELECT finding_id, detector, kind, severity, timeline, start_step, end_step, ranks, score, summary,
       evidence::JSON, suggested_action::JSON, active, incident_id, now, now
FROM new_findings
ON CONFLICT (finding_id) DO UPDATE SET
    severity = excluded.severity, end_step = excluded.end_step, score = excluded.score,
    summary = excluded.summary, evidence = excluded.evidence, suggested_action = excluded.suggested_action,
    active = excluded.active, updated_at = excluded.updated_at;
