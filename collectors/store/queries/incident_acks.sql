SELECT incident_id, resolved, acknowledged_by, ack_note, resolved_by, resolve_note FROM incident_rows;
