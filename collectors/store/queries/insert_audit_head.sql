-- Record the audit trail's head (collectors/audit.py: AuditKeeper).
INSERT INTO audit_head SELECT seq, hash, recorded_at FROM head
