-- The SQL console's example queries (the dashboard's SQL page offers them): each one after a `-- example:` line
-- with its title. {timeline}, {first}, {last} and {recent} are filled with the run's own numbers: the live
-- timeline, a window of steps around its newest incident (else its last steps), and where its last 200 steps begin.
-- example: open incidents
SELECT severity, title, start_step, summary FROM incidents WHERE status <> 'resolved'
-- example: loss around a step
SELECT step, loss, grad_norm, shards FROM step_metrics WHERE timeline = {timeline} AND step BETWEEN {first} AND {last} ORDER BY step
-- example: slowest ranks
SELECT rank, host, median(compute_time) AS compute_s FROM rank_step_metrics WHERE timeline = {timeline} AND step >= {recent} GROUP BY ALL ORDER BY compute_s DESC LIMIT 10
-- example: rank times around a step
SELECT rank, step, step_time, compute_time, comm_time FROM rank_step_metrics WHERE timeline = {timeline} AND step BETWEEN {first} AND {last} ORDER BY rank, step
-- example: eval against compute
SELECT step, cum_flops, name, value FROM eval_scores ORDER BY step
-- example: alerts sent
SELECT notifier, event, incident_id, status, last_error FROM alerts
-- example: rejected lines
SELECT path, line_offset, reason FROM rejected
