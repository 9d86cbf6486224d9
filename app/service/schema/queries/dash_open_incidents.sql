-- Dashboard: incidents not yet resolved, by severity.
SELECT severity, count(*) AS incidents FROM incidents WHERE status <> 'resolved' GROUP BY severity;
