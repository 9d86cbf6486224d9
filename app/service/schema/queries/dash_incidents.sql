-- Dashboard: every incident, newest first.
SELECT incident_id, title, status, severity, cause, timeline, start_step, end_step, kinds, ranks, findings, summary,
       suggested_action, epoch(opened_at) AS opened_at, epoch(updated_at) AS updated_at,
       acknowledged_by, ack_note, resolved_by, resolve_note
FROM incidents
ORDER BY CASE status WHEN 'open' THEN 0 WHEN 'acknowledged' THEN 1 ELSE 2 END, opened_at DESC;
