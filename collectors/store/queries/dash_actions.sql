-- Dashboard: control requests and what the trainer did with them (one row per request, its latest status;
-- 'not answered' for one filed through bedside that the loop has said nothing of).
SELECT request_id, status, action, operator, reason, args, taken_at AS requested_at, updated_at, step, timeline,
       message
FROM control_requests
ORDER BY updated_at;
