SELECT incident_id, resolved, acknowledged_by, ack_note, resolved_by FROM incident_rows;
