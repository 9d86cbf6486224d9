-- Why an incident is resolved, in words: every finding cleared, or a rewind abandoned its timeline
-- (docs/detectors.md, incidents); NULL while it is open. Closing by hand keeps its own columns.

ALTER TABLE incident_rows ADD COLUMN resolution VARCHAR;

CREATE OR REPLACE VIEW incidents AS
SELECT incident_id, title,
       CASE WHEN resolved OR resolved_by IS NOT NULL THEN 'resolved'
            WHEN acknowledged_by IS NOT NULL THEN 'acknowledged' ELSE 'open' END AS status,
       severity, cause, timeline, start_step, end_step, kinds, ranks, findings, summary, suggested_action,
       to_timestamp(opened_at) AS opened_at, to_timestamp(updated_at) AS updated_at,
       to_timestamp(coalesce(closed_at, resolved_at)) AS resolved_at, acknowledged_by,
       to_timestamp(acknowledged_at) AS acknowledged_at, ack_note, resolved_by, resolve_note,
       CASE WHEN resolved_by IS NOT NULL THEN 'closed by hand' ELSE resolution END AS resolution
FROM incident_rows;
