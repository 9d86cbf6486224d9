UPDATE incident_rows
SET resolved_by = closing.by, resolve_note = closing.note, closed_at = closing.at
FROM closing WHERE incident_rows.incident_id = closing.incident_id;
