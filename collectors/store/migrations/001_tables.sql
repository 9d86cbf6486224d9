-- Format v1 tables. Every telemetry row keeps (source_id, line_offset): the file
-- and byte offset it came from, which is what makes ingestion exactly-once.

CREATE TABLE sources (
    source_id        INTEGER PRIMARY KEY,
    path             VARCHAR NOT NULL UNIQUE,   -- relative to the run directory
    file_rank        INTEGER,                   -- rank the file name declares
    device           UBIGINT,
    inode            UBIGINT,
    head             BLOB,                      -- first bytes, to notice a replaced file
    committed_offset BIGINT NOT NULL DEFAULT 0, -- bytes ingested, committed with the rows
    lines            BIGINT NOT NULL DEFAULT 0,
    rejected         BIGINT NOT NULL DEFAULT 0,
    state            VARCHAR NOT NULL DEFAULT 'ok', -- ok | shrunk | replaced
    state_detail     VARCHAR,
    updated_at       DOUBLE
);

CREATE TABLE source_incidents (
    source_id INTEGER NOT NULL,
    time      DOUBLE NOT NULL,
    state     VARCHAR NOT NULL,
    detail    VARCHAR NOT NULL
);

CREATE TABLE run_info (
    run_id         VARCHAR,
    name           VARCHAR,
    created        DOUBLE,
    schema_version INTEGER,
    world_size     INTEGER,
    config         JSON,
    raw            JSON
);

CREATE TABLE rank_topology (
    rank       INTEGER NOT NULL,
    host       VARCHAR,
    local_rank INTEGER,
    dp         INTEGER,
    tp         INTEGER,
    pp         INTEGER
);

CREATE TABLE steps (
    source_id   INTEGER NOT NULL,
    line_offset BIGINT NOT NULL,
    time        DOUBLE NOT NULL,
    rank        INTEGER NOT NULL,
    step        BIGINT NOT NULL,
    timeline    INTEGER NOT NULL,
    seq         BIGINT NOT NULL,
    loss        DOUBLE,
    grad_norm   DOUBLE,
    lr          DOUBLE,
    tokens      DOUBLE,
    flops       DOUBLE,
    shards      JSON,
    extra       MAP(VARCHAR, DOUBLE),  -- user metrics beyond the canonical ones
    attrs       JSON                   -- the whole line, kept when it has fields unknown to v1
);

CREATE TABLE rank_steps (
    source_id       INTEGER NOT NULL,
    line_offset     BIGINT NOT NULL,
    time            DOUBLE NOT NULL,
    rank            INTEGER NOT NULL,
    step            BIGINT NOT NULL,
    timeline        INTEGER NOT NULL,
    seq             BIGINT NOT NULL,
    step_time       DOUBLE,
    data_time       DOUBLE,
    compute_time    DOUBLE,
    comm_time       DOUBLE,
    optimizer_time  DOUBLE,
    local_grad_norm DOUBLE,
    param_checksum  VARCHAR,
    extra           MAP(VARCHAR, DOUBLE),
    attrs           JSON
);

CREATE TABLE evals (
    source_id   INTEGER NOT NULL,
    line_offset BIGINT NOT NULL,
    time        DOUBLE NOT NULL,
    rank        INTEGER NOT NULL,
    step        BIGINT NOT NULL,
    timeline    INTEGER NOT NULL,
    seq         BIGINT NOT NULL,
    split       VARCHAR,
    cum_tokens  DOUBLE,
    cum_flops   DOUBLE,
    scores      MAP(VARCHAR, DOUBLE),
    payload     JSON
);

CREATE TABLE checkpoints (
    source_id   INTEGER NOT NULL,
    line_offset BIGINT NOT NULL,
    time        DOUBLE NOT NULL,
    rank        INTEGER NOT NULL,
    step        BIGINT NOT NULL,
    timeline    INTEGER NOT NULL,
    seq         BIGINT NOT NULL,
    event       VARCHAR NOT NULL,
    path        VARCHAR,
    duration_s  DOUBLE,
    bytes       DOUBLE,
    message     VARCHAR,
    payload     JSON
);

CREATE TABLE actions (
    source_id   INTEGER NOT NULL,
    line_offset BIGINT NOT NULL,
    time        DOUBLE NOT NULL,
    rank        INTEGER NOT NULL,
    step        BIGINT NOT NULL,
    timeline    INTEGER NOT NULL,
    seq         BIGINT NOT NULL,
    action      VARCHAR NOT NULL,
    status      VARCHAR NOT NULL,
    request_id  VARCHAR NOT NULL,
    operator    VARCHAR,
    reason      VARCHAR,
    message     VARCHAR,
    args        JSON,
    payload     JSON
);

-- rank_info, heartbeat, log, run_end and every kind unknown to v1.
CREATE TABLE events (
    source_id   INTEGER NOT NULL,
    line_offset BIGINT NOT NULL,
    time        DOUBLE NOT NULL,
    rank        INTEGER NOT NULL,
    step        BIGINT NOT NULL,
    timeline    INTEGER NOT NULL,
    seq         BIGINT NOT NULL,
    kind        VARCHAR NOT NULL,
    payload     JSON NOT NULL
);

-- Ground truth of injected faults; for scoring detectors, never read by them.
CREATE TABLE faults (
    source_id    INTEGER NOT NULL,
    line_offset  BIGINT NOT NULL,
    time         DOUBLE NOT NULL,
    rank         INTEGER NOT NULL,
    step         BIGINT NOT NULL,
    timeline     INTEGER NOT NULL,
    seq          BIGINT NOT NULL,
    fault        VARCHAR NOT NULL,
    target_ranks JSON,
    args         JSON,
    payload      JSON NOT NULL
);

CREATE TABLE rejected_lines (
    source_id   INTEGER NOT NULL,
    line_offset BIGINT NOT NULL,
    length      BIGINT NOT NULL,
    reason      VARCHAR NOT NULL,
    line        VARCHAR NOT NULL,     -- the raw text (invalid UTF-8 replaced)
    ingested_at DOUBLE NOT NULL
);
