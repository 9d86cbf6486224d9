-- Dashboard: incidents not yet resolved, by severity, and how many of them are acknowledged.
SELECT severity, count(*) AS incidents, count(*) FILTER (WHERE status = 'acknowledged') AS acknowledged
FROM incidents WHERE status <> 'resolved' GROUP BY severity;
