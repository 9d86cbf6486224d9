-- A run's status from the facts collectors/runs.py read in its files' tails, by the run view's own rule
-- (the run_status macro of migrations/008_run_status.sql).
SELECT run_status($any_failed, $any_aborted, $ranks_ended, $world_size, $last_seen, $now) AS status;
