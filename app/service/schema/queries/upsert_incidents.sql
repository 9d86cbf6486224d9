INSERT INTO incident_rows (incident_id, title, severity, resolved, cause, timeline, start_step, end_step, kinds, ranks,
                           findings, summary, suggested_action, opened_at, updated_at, resolved_at, acknowledged_by,
                           acknowledged_at, ack_note, resolution)
SELECT incident_id, title, severity, resolved, cause, timeline, start_step, end_step, kinds, ranks, findings,
       summary, suggested_action::JSON, now, now, CASE WHEN resolved THEN now END, NULL, NULL, NULL, resolution
FROM new_incidents
ON CONFLICT (incident_id) DO UPDATE SET
    title = excluded.title, severity = excluded.severity, start_step = excluded.start_step, resolved = excluded.resolved, cause = excluded.cause,
    end_step = excluded.end_step, kinds = excluded.kinds, ranks = excluded.ranks, findings = excluded.findings,
    summary = excluded.summary, suggested_action = excluded.suggested_action, updated_at = excluded.updated_at,
    resolved_at = CASE WHEN excluded.resolved THEN coalesce(incident_rows.resolved_at, excluded.updated_at) END,
    resolution = excluded.resolution;
