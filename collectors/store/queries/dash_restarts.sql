-- Dashboard: the run's wall-clock span and how often it was interrupted: checkpoint loads after the start, not
-- counting those an operator's rewind made (the load at the timeline and step where the rewind was applied).
SELECT (SELECT min(time) FROM steps) AS started_at, (SELECT max(time) FROM steps) AS last_at,
       (SELECT count(DISTINCT time::BIGINT) FROM checkpoint_events c
        WHERE event = 'loaded' AND rank = 0
          AND NOT EXISTS (SELECT 1 FROM action_events a
                          WHERE a.action = 'rewind' AND a.status = 'applied'
                            AND a.timeline = c.timeline AND a.step = c.step)) AS restarts;
