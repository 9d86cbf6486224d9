-- Dashboard: the findings of one incident.
SELECT kind, severity, active, start_step, end_step, ranks, score, summary, evidence, suggested_action
FROM findings
WHERE incident_id = $incident_id
ORDER BY start_step, kind;
