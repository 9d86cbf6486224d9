SELECT finding_id, incident_id FROM finding_rows;
