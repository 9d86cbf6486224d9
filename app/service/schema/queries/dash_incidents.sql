-- Dashboard: every incident in triage order: unresolved before resolved, then critical, warning, info, then the
-- newest onset first. onset_at is the wall-clock time of the incident's first step on its timeline (or of the step
-- before it, for a step that never finished: a hang): when the fault began, not when the detectors saw it (a
-- replayed store detects a day-old run's incidents in seconds).
WITH onsets AS (
    SELECT i.incident_id, s.time AS onset_at
    FROM incidents i ASOF JOIN steps s ON s.timeline = i.timeline AND s.step <= i.start_step
)
SELECT incident_id, title, status, severity, cause, timeline, start_step, end_step, kinds, ranks, findings, summary,
       suggested_action, epoch(opened_at) AS opened_at, epoch(updated_at) AS updated_at, o.onset_at,
       acknowledged_by, ack_note, resolved_by, resolve_note, resolution
FROM incidents i LEFT JOIN onsets o USING (incident_id)
ORDER BY status = 'resolved', CASE severity WHEN 'critical' THEN 0 WHEN 'warning' THEN 1 ELSE 2 END,
         coalesce(o.onset_at, epoch(i.opened_at)) DESC, incident_id;
