-- Dashboard: the data each step of one timeline read between two steps (an incident's evidence): the global batch
-- (the `batch` metric, when the trainer reports one) and the data shard ids of the step record.
SELECT step, try_cast(extra['batch'] AS BIGINT) AS batch,
       coalesce(try_cast(shards AS BIGINT[]), []::BIGINT[]) AS shards
FROM steps
WHERE timeline = $timeline AND step BETWEEN $first AND $last
ORDER BY step;
