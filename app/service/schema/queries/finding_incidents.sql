SELECT finding_id, incident_id, end_step, active FROM finding_rows;
