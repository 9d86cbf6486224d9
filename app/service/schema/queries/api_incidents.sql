-- bedside.open(RUN).incidents(): every incident, oldest first (docs/python.md).
SELECT * FROM incidents ORDER BY opened_at, incident_id
