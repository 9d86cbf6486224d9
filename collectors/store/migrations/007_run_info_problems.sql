-- What run.json got wrong: each field left out (wrong type, out of range) and why,
-- so that a bad value is reported where the run is looked at, not only in a log.
ALTER TABLE run_info ADD COLUMN problems VARCHAR[];
