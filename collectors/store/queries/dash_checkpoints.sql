-- Dashboard: every checkpoint's life, newest first: started, saved (duration, size), verified or corrupt, loaded,
-- deleted. A checkpoint is corrupt when a `corrupt` event names its path: the trainer reports one at the step it
-- has reached, not at the checkpoint's. A `corrupt` event naming no checkpoint seen here is a row of its own.
-- A save still in flight when a rewind or restart began a new timeline is reported on the new timeline: its
-- outcome joins the save it ends (the newest earlier timeline that started a save at that step). A save that
-- never ends (no outcome, and a new timeline or rank 0's end came after it started) is `abandoned`.
WITH seen AS (
    SELECT DISTINCT path FROM checkpoint_events WHERE event NOT IN ('corrupt', 'deleted') AND path IS NOT NULL
), corrupt AS (
    SELECT DISTINCT path FROM checkpoint_events WHERE event = 'corrupt' AND path IS NOT NULL
), started AS (
    SELECT DISTINCT timeline, step FROM checkpoint_events WHERE event = 'save_started' AND rank = 0
), outcomes AS (
    SELECT e.* REPLACE (
        CASE WHEN e.event IN ('saved', 'save_failed', 'verified')
                  AND NOT EXISTS (SELECT 1 FROM started s WHERE s.timeline = e.timeline AND s.step = e.step)
             THEN coalesce((SELECT max(s.timeline) FROM started s WHERE s.step = e.step AND s.timeline < e.timeline),
                           e.timeline)
             ELSE e.timeline END AS timeline)
    FROM checkpoint_events e
), saved_at AS (
    SELECT path, any_value(timeline) AS timeline, any_value(step) AS step
    FROM outcomes WHERE event = 'saved' AND path IS NOT NULL GROUP BY path
), events AS (  -- a load is the loaded checkpoint's, not a row of the timeline it starts
    SELECT o.* REPLACE (coalesce(a.timeline, o.timeline) AS timeline, coalesce(a.step, o.step) AS step)
    FROM outcomes o LEFT JOIN saved_at a ON o.event = 'loaded' AND a.path = o.path
), life AS (
    SELECT * FROM events
    WHERE event <> 'deleted' AND (rank = 0 OR event IN ('corrupt', 'save_failed'))
      AND NOT (event = 'corrupt' AND coalesce(path IN (SELECT path FROM seen), false))
), gone AS (
    SELECT DISTINCT path FROM checkpoint_events WHERE event = 'deleted'
), moved_on AS (  -- when the run left each timeline: a later timeline's first record, or a rank's end
    SELECT time FROM (SELECT min(time) AS time FROM steps GROUP BY timeline)
    UNION ALL SELECT time FROM event_log WHERE kind = 'run_end' AND rank = 0
), checkpoint AS (
    SELECT timeline, step, any_value(path) FILTER (WHERE path IS NOT NULL) AS path,
           min(time) AS started_at, max(time) AS updated_at,
           max(duration_s) FILTER (WHERE event = 'saved') AS duration_s,
           max(bytes) FILTER (WHERE event = 'saved') AS bytes,
           CASE WHEN bool_or(event = 'corrupt' OR coalesce(path IN (SELECT path FROM corrupt), false)) THEN 'corrupt'
                WHEN bool_or(event = 'save_failed') THEN 'failed'
                WHEN bool_or(event = 'verified') THEN 'verified'
                WHEN bool_or(event = 'saved') THEN 'saved'
                ELSE 'saving' END AS state,
           bool_or(event = 'loaded') AS loaded,
           coalesce(bool_or(path IN (SELECT path FROM gone)), false) AS deleted
    FROM life
    GROUP BY timeline, step
)
SELECT * REPLACE (
    CASE WHEN state = 'saving' AND EXISTS (SELECT 1 FROM moved_on m WHERE m.time > started_at) THEN 'abandoned'
         ELSE state END AS state)
FROM checkpoint
ORDER BY started_at DESC;
