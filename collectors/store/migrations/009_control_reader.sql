-- Whether a control reader polls the run's requests: rank 0's heartbeats say so
-- (`control: true`, the JSON boolean, written by the kit's ControlClient). One row: the newest such
-- heartbeat's time (NULL when none was ever seen), its step and timeline, and how
-- many were seen.
CREATE OR REPLACE VIEW control_reader AS
SELECT max(time) AS last_beat,
       to_timestamp(max(time)) AS last_beat_ts,
       arg_max(step, time) AS step,
       arg_max(timeline, time) AS timeline,
       count(*) AS beats
FROM events
WHERE kind = 'heartbeat' AND json_type(payload, '$.control') = 'BOOLEAN' AND payload ->> 'control' = 'true';
