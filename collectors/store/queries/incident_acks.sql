SELECT incident_id, resolved, acknowledged_by, ack_note FROM incident_rows;
