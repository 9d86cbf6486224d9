UPDATE outbox
SET status = $status, attempts = attempts + $attempted, next_attempt_at = $next_attempt_at,
    delivered_at = $delivered_at, last_error = $last_error
WHERE message_id = $message_id AND status = 'pending';
