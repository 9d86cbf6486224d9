-- An operator can close an incident by hand (a false alarm, or handled): it stays resolved, and findings that
-- would have joined it open a new incident (docs/dashboard.md).

ALTER TABLE incident_rows ADD COLUMN resolved_by VARCHAR;
ALTER TABLE incident_rows ADD COLUMN resolve_note VARCHAR;
ALTER TABLE incident_rows ADD COLUMN closed_at DOUBLE;

CREATE OR REPLACE VIEW incidents AS
SELECT incident_id, title,
       CASE WHEN resolved OR resolved_by IS NOT NULL THEN 'resolved'
            WHEN acknowledged_by IS NOT NULL THEN 'acknowledged' ELSE 'open' END AS status,
       severity, cause, timeline, start_step, end_step, kinds, ranks, findings, summary, suggested_action,
       to_timestamp(opened_at) AS opened_at, to_timestamp(updated_at) AS updated_at,
       to_timestamp(coalesce(closed_at, resolved_at)) AS resolved_at, acknowledged_by,
       to_timestamp(acknowledged_at) AS acknowledged_at, ack_note, resolved_by, resolve_note
FROM incident_rows;
