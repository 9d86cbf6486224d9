-- bedside demo: the run's name, size, progress and status.
SELECT name, world_size, last_step, status FROM run;
