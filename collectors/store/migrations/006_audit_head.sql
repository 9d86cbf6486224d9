-- The audit trail's heads (RUN/control/audit.jsonl, docs/security.md): each (seq, hash) the owner checked and
-- recorded, so a trail cut short or rewritten from some entry on no longer matches the store.

CREATE TABLE audit_head (
    seq         BIGINT NOT NULL,   -- the head entry's 0-based line number
    hash        VARCHAR NOT NULL,  -- its hash
    recorded_at DOUBLE NOT NULL    -- when the owner recorded it (unix seconds)
);
