-- A file that shrank or was replaced: reported once, never silently re-read.
INSERT INTO source_incidents (source_id, time, state, detail) VALUES (?, ?, ?, ?);
