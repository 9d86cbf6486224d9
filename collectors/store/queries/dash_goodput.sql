-- The Overview's goodput: where the run's wall time and FLOPs went, by category (docs/schema.md, "Goodput").
SELECT category, useful, seconds, share, steps, flops FROM goodput ORDER BY seconds DESC;
