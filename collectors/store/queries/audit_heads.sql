-- The audit trail's heads the owner recorded, oldest first (collectors/audit.py).
SELECT seq, hash FROM audit_head ORDER BY seq
