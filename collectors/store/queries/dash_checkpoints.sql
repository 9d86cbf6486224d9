-- Dashboard: every checkpoint's life: started, saved (duration, size), verified or corrupt, loaded, deleted.
-- A checkpoint is corrupt when a `corrupt` event names its path: the trainer reports one at the step it has
-- reached, not at the checkpoint's. A `corrupt` event naming no checkpoint seen here is a row of its own.
WITH seen AS (
    SELECT DISTINCT path FROM checkpoint_events WHERE event NOT IN ('corrupt', 'deleted') AND path IS NOT NULL
), corrupt AS (
    SELECT DISTINCT path FROM checkpoint_events WHERE event = 'corrupt' AND path IS NOT NULL
), life AS (
    SELECT * FROM checkpoint_events
    WHERE event <> 'deleted' AND (rank = 0 OR event IN ('corrupt', 'save_failed'))
      AND NOT (event = 'corrupt' AND coalesce(path IN (SELECT path FROM seen), false))
), gone AS (
    SELECT DISTINCT path FROM checkpoint_events WHERE event = 'deleted'
)
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
ORDER BY started_at;
