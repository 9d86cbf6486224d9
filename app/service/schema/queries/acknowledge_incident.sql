UPDATE incident_rows
SET acknowledged_by = ack.by, acknowledged_at = ack.at, ack_note = ack.note
FROM ack WHERE incident_rows.incident_id = ack.incident_id;
