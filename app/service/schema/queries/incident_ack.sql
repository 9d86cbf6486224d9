-- Who acknowledged one incident, and their note (no row: nobody yet); the store is the only record of it.
SELECT acknowledged_by, coalesce(ack_note, '') AS ack_note FROM incident_rows
WHERE incident_id = $incident_id AND acknowledged_by IS NOT NULL
