-- bedside demo: how many distinct parameter checksums the replicas report at each checksum step.
SELECT step, count(DISTINCT param_checksum) AS distinct_checksums, count(*) AS ranks
FROM rank_step_metrics
WHERE param_checksum IS NOT NULL AND step >= $from_step - 10
GROUP BY step
ORDER BY step;
