-- bedside demo: the messages each notifier was given, and whether they arrived.
SELECT notifier, event, coalesce(incident_id, '(digest)') AS incident, status, attempts, last_error
FROM alerts
ORDER BY notifier, created_at;
