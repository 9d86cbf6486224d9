-- Record the control requests the audit trail says were filed, each once (collectors/audit.py: AuditKeeper).
INSERT INTO filed_requests (request_id, filed_at, action, operator, reason, args, audit_seq)
SELECT request_id, filed_at, action, operator, reason, args, audit_seq FROM filed ORDER BY audit_seq
ON CONFLICT (request_id) DO NOTHING
