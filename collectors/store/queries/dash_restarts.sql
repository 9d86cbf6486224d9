-- Dashboard: the run's wall-clock span and how often it was interrupted (checkpoint loads after the start).
SELECT (SELECT min(time) FROM steps) AS started_at, (SELECT max(time) FROM steps) AS last_at,
       (SELECT count(DISTINCT time::BIGINT) FROM checkpoint_events WHERE event = 'loaded' AND rank = 0) AS restarts;
