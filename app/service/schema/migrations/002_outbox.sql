-- Alert messages waiting for delivery, delivered, held back by a rate limit, or given up on (docs/alerts.md).
-- Rows are written in the same transaction as the incident change they announce.

CREATE SEQUENCE outbox_order;

CREATE TABLE outbox (
    message_id      VARCHAR PRIMARY KEY,   -- the idempotency key: run/notifier/incident/event/n
    seq             BIGINT NOT NULL DEFAULT nextval('outbox_order'),  -- delivery order per notifier
    notifier        VARCHAR NOT NULL,
    incident_id     VARCHAR,               -- NULL for digests
    event           VARCHAR NOT NULL,      -- opened | escalated | reopened | resolved | acknowledged | digest
    severity        VARCHAR NOT NULL,
    incident_status VARCHAR,               -- open | acknowledged | resolved, as the message told it
    payload         JSON NOT NULL,         -- the alert payload, version 1 (alert.schema.json)
    created_at      DOUBLE NOT NULL,
    status          VARCHAR NOT NULL,      -- pending | delivered | failed | held | digested
    attempts        INTEGER NOT NULL DEFAULT 0,
    next_attempt_at DOUBLE NOT NULL,
    delivered_at    DOUBLE,
    last_error      VARCHAR,               -- secrets masked
    digest_id       VARCHAR                -- the digest that summarised a held message
);

CREATE OR REPLACE VIEW alerts AS
SELECT message_id, notifier, incident_id, event, severity, incident_status, status, attempts,
       to_timestamp(created_at) AS created_at, to_timestamp(delivered_at) AS delivered_at,
       to_timestamp(next_attempt_at) AS next_attempt_at, last_error, digest_id,
       payload->>'$.text' AS text
FROM outbox
ORDER BY seq;
