-- Dashboard: control requests and what the trainer did with them (one row per request, its latest status).
SELECT request_id, arg_max(status, time) AS status, any_value(action) AS action, any_value(operator) AS operator,
       any_value(reason) AS reason, any_value(args) AS args,
       min(time) FILTER (WHERE status = 'requested') AS requested_at,
       max(time) AS updated_at, arg_max(step, time) AS step, arg_max(timeline, time) AS timeline,
       arg_max(message, time) AS message
FROM action_events
GROUP BY request_id
ORDER BY updated_at;
