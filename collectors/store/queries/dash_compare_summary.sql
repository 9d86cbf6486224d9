-- Dashboard: a run's row in the Runs table beyond its identity: the last training loss it reported (the newest
-- timeline's latest step with one; NULL when it reports none).
SELECT arg_max(loss, (timeline, step)) FILTER (WHERE loss IS NOT NULL) AS last_loss FROM step_metrics;
