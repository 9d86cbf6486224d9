-- bedside demo: each injected fault against the findings of the kind it should produce
-- (args.expected_kind) that start within its window widened by a margin (change-point detectors date
-- onsets back); the delay is to the first finding from the fault on, else to the latest before it.
WITH matched AS (
    SELECT f.step, f.fault, CAST(f.target_ranks AS VARCHAR) AS target_ranks, d.kind, d.start_step
    FROM fault_labels f
    LEFT JOIN findings d
           ON d.timeline = f.timeline
          AND d.kind = f.args ->> 'expected_kind'
          AND d.start_step BETWEEN f.step - $margin
                               AND coalesce(TRY_CAST(f.args ->> 'last' AS BIGINT), f.step) + $margin
)
SELECT step, fault, target_ranks, string_agg(DISTINCT kind, ',' ORDER BY kind) AS found_as,
       coalesce(min(start_step) FILTER (WHERE start_step >= step - 2), max(start_step)) - step AS delay_steps
FROM matched
GROUP BY step, fault, target_ranks
ORDER BY step;
