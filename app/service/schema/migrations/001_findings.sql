-- Detector findings and the incidents that group them (docs/detectors.md, docs/schema.md).

CREATE TABLE finding_rows (
    finding_id       VARCHAR PRIMARY KEY,  -- kind@timeline:start_step[/rRANKS], stable across updates
    detector         VARCHAR NOT NULL,
    kind             VARCHAR NOT NULL,
    severity         VARCHAR NOT NULL,     -- info | warning | critical
    timeline         INTEGER NOT NULL,
    start_step       BIGINT NOT NULL,
    end_step         BIGINT NOT NULL,
    ranks            INTEGER[] NOT NULL,
    score            DOUBLE,
    summary          VARCHAR NOT NULL,
    evidence         JSON NOT NULL,
    suggested_action JSON NOT NULL,
    active           BOOLEAN NOT NULL,     -- the condition still lasts
    incident_id      VARCHAR NOT NULL,
    first_seen       DOUBLE NOT NULL,      -- when bedside first reported it (unix seconds)
    updated_at       DOUBLE NOT NULL
);

CREATE TABLE incident_rows (
    incident_id      VARCHAR PRIMARY KEY,  -- the finding_id of its first finding
    title            VARCHAR NOT NULL,
    severity         VARCHAR NOT NULL,
    resolved         BOOLEAN NOT NULL,     -- every finding of it has cleared
    cause            VARCHAR,
    timeline         INTEGER NOT NULL,
    start_step       BIGINT NOT NULL,
    end_step         BIGINT NOT NULL,
    kinds            VARCHAR[] NOT NULL,
    ranks            INTEGER[] NOT NULL,
    findings         INTEGER NOT NULL,
    summary          VARCHAR NOT NULL,
    suggested_action JSON NOT NULL,
    opened_at        DOUBLE NOT NULL,
    updated_at       DOUBLE NOT NULL,
    resolved_at      DOUBLE,
    acknowledged_by  VARCHAR,
    acknowledged_at  DOUBLE,
    ack_note         VARCHAR
);

CREATE OR REPLACE VIEW findings AS
SELECT finding_id, incident_id, detector, kind, severity, timeline, start_step, end_step, ranks, score,
       summary, evidence, suggested_action, active,
       to_timestamp(first_seen) AS first_seen, to_timestamp(updated_at) AS updated_at
FROM finding_rows;

CREATE OR REPLACE VIEW incidents AS
SELECT incident_id, title,
       CASE WHEN resolved THEN 'resolved' WHEN acknowledged_by IS NOT NULL THEN 'acknowledged' ELSE 'open' END
           AS status,
       severity, cause, timeline, start_step, end_step, kinds, ranks, findings, summary, suggested_action,
       to_timestamp(opened_at) AS opened_at, to_timestamp(updated_at) AS updated_at,
       to_timestamp(resolved_at) AS resolved_at, acknowledged_by, to_timestamp(acknowledged_at) AS acknowledged_at,
       ack_note
FROM incident_rows;
