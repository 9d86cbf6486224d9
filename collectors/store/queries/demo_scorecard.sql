-- bedside demo: each injected fault against the findings that start within its window (plus a margin).
SELECT f.step, f.fault, f.target_ranks,
       string_agg(DISTINCT d.kind, ',' ORDER BY d.kind) AS found_as,
       min(d.start_step) - f.step AS delay_steps
FROM fault_labels f
LEFT JOIN findings d
       ON d.timeline = f.timeline
      AND d.start_step BETWEEN f.step - 2
                           AND coalesce(TRY_CAST(f.args ->> 'last' AS BIGINT), f.step) + $margin
GROUP BY ALL
ORDER BY f.step;
