-- The Incidents page's cost of a rewind: what each abandoned timeline trained past the step the run went back to
-- (docs/schema.md, "Goodput"), in steps, wall time and FLOPs.
SELECT timeline, min(step) AS from_step, max(step) AS last_step, count(*) AS steps,
       sum(step_s + between_s) AS seconds, sum(coalesce(flops, 0)) AS flops
FROM goodput_intervals
WHERE progress = 'abandoned_timeline'
GROUP BY timeline;
