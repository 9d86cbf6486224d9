-- Dashboard: the newest heartbeat that says a control reader polls the run's requests, and its age in seconds.
SELECT last_beat, epoch(current_timestamp) - last_beat AS age_s, step, timeline, beats FROM control_reader;
