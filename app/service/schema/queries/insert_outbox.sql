INSERT INTO outbox (message_id, notifier, incident_id, event, severity, incident_status, payload, created_at, status,
                    next_attempt_at)
SELECT message_id, notifier, incident_id, event, severity, incident_status, payload::JSON, created_at, status,
       created_at
FROM new_messages
ORDER BY position
ON CONFLICT (message_id) DO NOTHING;
UPDATE outbox SET status = 'digested', digest_id = digested.digest_id
FROM digested WHERE outbox.message_id = digested.message_id AND outbox.status = 'held';
