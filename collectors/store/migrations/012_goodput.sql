-- Goodput: where the run's wall time and FLOPs went (docs/schema.md, "Goodput").
--
-- The job's step records (those of the lowest rank that writes them) cut the run's wall time into
-- intervals, each ending at one step record. An interval's first part is the step itself (the ranks'
-- median step_time, else the run's median interval, at most the interval), its data wait split out;
-- the rest is time between steps, named after what happened in it. Every second of the run is in
-- exactly one category.
--
-- A step's progress is kept unless a later timeline starts at or before it (a rewind abandoned it) or
-- the same timeline trained that step again later (a restart from a checkpoint redid it).

CREATE OR REPLACE VIEW goodput_intervals AS
WITH job AS (
    SELECT timeline, step, time, seq, flops, tokens,
           row_number() OVER (PARTITION BY timeline, step ORDER BY time, seq) AS attempt,
           count(*) OVER (PARTITION BY timeline, step) AS attempts,
           lag(time) OVER (ORDER BY time, seq) AS previous
    FROM steps
    WHERE rank = (SELECT min(rank) FROM steps)
), phases AS (
    SELECT timeline, step, attempt, median(step_time) AS step_time, median(data_time) AS data_time
    FROM (
        SELECT timeline, step, step_time, data_time,
               row_number() OVER (PARTITION BY rank, timeline, step ORDER BY time, seq) AS attempt
        FROM rank_steps
    )
    GROUP BY timeline, step, attempt
), starts AS (
    SELECT timeline, min(step) AS first_step FROM steps GROUP BY timeline
), abandoned AS (
    SELECT s.timeline, min(later.first_step) AS from_step
    FROM starts s JOIN starts later ON later.timeline > s.timeline
    GROUP BY s.timeline
), records AS (
    SELECT time FROM steps UNION ALL SELECT time FROM rank_steps UNION ALL SELECT time FROM evals
    UNION ALL SELECT time FROM checkpoints UNION ALL SELECT time FROM actions UNION ALL SELECT time FROM events
), typical AS (  -- a step's time where the ranks report none (an imported run): the median interval
    SELECT median(time - previous) AS step_time FROM job
), bounds AS (
    SELECT min(time) AS first_time, max(time) AS last_time FROM records
), markers AS (
    -- what happened between two steps, by precedence (the lowest wins an interval)
    SELECT time, 1 AS precedence, 'restart' AS category FROM events
    WHERE kind = 'rank_info' AND time > (SELECT min(time) FROM steps)
    UNION ALL SELECT time, 2, 'paused' FROM actions WHERE action IN ('pause', 'resume') AND status = 'applied'
    UNION ALL SELECT time, 3, 'checkpoint_restore' FROM checkpoints WHERE event = 'loaded'
    UNION ALL SELECT time, 4, 'checkpoint_save' FROM checkpoints c  -- where the save began (an async one ends later)
    WHERE event = 'save_started' OR event IN ('saved', 'save_failed') AND NOT EXISTS (
        SELECT 1 FROM checkpoints b
        WHERE b.event = 'save_started' AND (b.timeline, b.step, b.rank) = (c.timeline, c.step, c.rank))
    UNION ALL SELECT time, 5, 'eval' FROM evals
), placed AS (
    SELECT j.time AS ends_at, arg_min(m.category, m.precedence) AS category
    FROM markers m ASOF JOIN job j ON m.time <= j.time
    GROUP BY j.time
), intervals AS (
    SELECT j.timeline, j.step, j.attempt, j.flops, j.tokens,
           coalesce(j.previous, b.first_time) AS started_at, j.time AS ends_at,
           j.time - coalesce(j.previous, b.first_time) AS seconds,
           greatest(least(coalesce(p.step_time, t.step_time, 0.0), j.time - coalesce(j.previous, b.first_time)), 0.0)
               AS step_s,
           p.data_time,
           CASE WHEN j.attempt < j.attempts THEN 'redone_after_restart'
                WHEN j.step >= a.from_step THEN 'abandoned_timeline'
                ELSE 'productive' END AS progress,
           coalesce(pl.category, CASE WHEN j.previous IS NULL THEN 'startup' ELSE 'other' END) AS between_category
    FROM job j CROSS JOIN bounds b CROSS JOIN typical t
    LEFT JOIN phases p USING (timeline, step, attempt)
    LEFT JOIN abandoned a USING (timeline)
    LEFT JOIN placed pl ON pl.ends_at = j.time
)
SELECT timeline, step, attempt, started_at, ends_at, seconds, step_s,
       CASE WHEN progress = 'productive' THEN least(coalesce(data_time, 0.0), step_s) ELSE 0.0 END AS data_s,
       seconds - step_s AS between_s, progress, between_category, flops, tokens
FROM intervals
UNION ALL  -- from the last step record to the run's last record: shutdown, or a run that stopped stepping
SELECT NULL, NULL, NULL, j.last_step, b.last_time, b.last_time - j.last_step, 0.0, 0.0, b.last_time - j.last_step,
       NULL, 'after_last_step', 0.0, 0.0
FROM (SELECT max(time) AS last_step FROM job) j CROSS JOIN bounds b
WHERE b.last_time > j.last_step
ORDER BY ends_at;

CREATE OR REPLACE VIEW goodput AS
WITH parts AS (
    SELECT progress AS category, step_s - data_s AS seconds, flops, tokens, 1 AS steps
    FROM goodput_intervals WHERE progress IS NOT NULL
    UNION ALL SELECT 'data_loading', data_s, 0.0, 0.0, 0 FROM goodput_intervals WHERE data_s > 0
    UNION ALL SELECT between_category, between_s, 0.0, 0.0, 0 FROM goodput_intervals WHERE between_s > 0
), totals AS (
    SELECT category, sum(seconds) AS seconds, sum(coalesce(flops, 0)) AS flops, sum(coalesce(tokens, 0)) AS tokens,
           sum(steps) AS steps
    FROM parts GROUP BY category
)
SELECT category, category = 'productive' AS useful, seconds, seconds / sum(seconds) OVER () AS share, steps, flops,
       tokens
FROM totals
ORDER BY seconds DESC;
