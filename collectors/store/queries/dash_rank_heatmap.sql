-- Dashboard: each rank's mean $phase time ('data', 'compute', 'comm', 'optimizer', else the step's) over each bucket
-- of $bucket steps of one timeline from $first_step to $last_step (NULL: its last), over the median of its peers'
-- means in the same bucket (the ranks at its place: the same pipeline stage and TP index; every rank when the run
-- declares no topology): 1 is typical, 2 twice as slow. Aggregated per rank first, so the peers' median is taken
-- over (ranks x buckets), not (ranks x steps).
-- Rows are the heatmap's (dash_rank_rows: host, then mesh coordinates; a rank without a place last) from $first_row up
-- to $last_row (excluded), grouped into bands of $band consecutive rows: each band's highest ratio and the rank
-- that has it (with $band = 1, one row per rank: its ratio).
WITH cells AS (
    SELECT rank, (step // $bucket) * $bucket AS step,
           avg(CASE $phase WHEN 'data' THEN data_time WHEN 'compute' THEN compute_time WHEN 'comm' THEN comm_time
                           WHEN 'optimizer' THEN optimizer_time ELSE step_time END) AS seconds
    FROM rank_steps
    WHERE timeline = $timeline AND step >= $first_step AND ($last_step IS NULL OR step <= $last_step)
    GROUP BY ALL
), placed AS MATERIALIZED (
    SELECT c.rank, c.step, c.seconds, r.host, r.dp, r.tp, r.pp
    FROM cells c LEFT JOIN ranks r USING (rank)
), ratios AS (
    SELECT rank, step,
           seconds / nullif(median(seconds) OVER (PARTITION BY step, coalesce(pp, -1), coalesce(tp, -1)), 0) AS ratio
    FROM placed
), rows AS (
    SELECT rank, row_number() OVER (ORDER BY host, pp, tp, dp, rank) - 1 AS row
    FROM (SELECT DISTINCT rank, host, dp, tp, pp FROM placed)
)
SELECT (w.row - $first_row) // $band AS band, x.step,
       max(x.ratio) AS ratio, arg_max(x.rank, x.ratio) AS slowest_rank
FROM ratios x JOIN rows w USING (rank)
WHERE w.row >= $first_row AND w.row < $last_row
GROUP BY ALL
ORDER BY band, step;
