SELECT message_id, payload, created_at, attempts, next_attempt_at, last_error
FROM outbox
WHERE notifier = $notifier AND status = 'pending'
ORDER BY seq
LIMIT 1;
