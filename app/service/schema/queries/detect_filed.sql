SELECT filed_at AS time, request_id, action, operator, recorded
FROM filed_requests
WHERE recorded > $after
ORDER BY recorded;
