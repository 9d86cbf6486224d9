-- Dashboard: each timeline's span.
SELECT timeline, first_step, last_step, steps FROM timelines ORDER BY timeline;
