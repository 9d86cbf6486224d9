-- The run's status as the run view derives it (live, stalled, finished, failed, aborted, empty).
SELECT status FROM run;
