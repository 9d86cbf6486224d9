SELECT notifier, incident_id, event, severity, incident_status, status, message_id, payload, created_at
FROM outbox
ORDER BY seq;
