-- The run ledger: one row per run key, the history of attempts, the keys
-- seen by the batches of an unfinished run, and rejected records.
-- PostgreSQL version of migrations/sqlite/0001_ledger.sql (same tables).
-- It lives in the destination database so that a batch of rows, its
-- checkpoint and the fencing check commit in one transaction.

CREATE TABLE _tm_runs (
    id               BIGSERIAL PRIMARY KEY,
    pipeline         TEXT    NOT NULL,
    source           TEXT    NOT NULL,
    export_type      TEXT    NOT NULL,
    period_start     TEXT    NOT NULL,
    period_end       TEXT    NOT NULL,
    status           TEXT    NOT NULL DEFAULT 'pending'
                     CHECK (status IN ('pending', 'running', 'done', 'failed')),
    attempt          BIGINT  NOT NULL DEFAULT 0,
    run_id           TEXT,
    lease_owner      TEXT,
    lease_host       TEXT,
    lease_pid        BIGINT,
    lease_expires_at TIMESTAMPTZ,
    checkpoint       JSONB,
    batches          BIGINT  NOT NULL DEFAULT 0,
    rows_read        BIGINT  NOT NULL DEFAULT 0,
    rows_inserted    BIGINT  NOT NULL DEFAULT 0,
    rows_updated     BIGINT  NOT NULL DEFAULT 0,
    rows_unchanged   BIGINT  NOT NULL DEFAULT 0,
    rows_deleted     BIGINT  NOT NULL DEFAULT 0,
    rows_rejected    BIGINT  NOT NULL DEFAULT 0,
    handler_version  TEXT,
    error_class      TEXT,
    error_message    TEXT,
    result           JSONB,
    started_at       TIMESTAMPTZ,
    finished_at      TIMESTAMPTZ,
    created_at       TIMESTAMPTZ NOT NULL,
    updated_at       TIMESTAMPTZ NOT NULL,
    UNIQUE (pipeline, source, export_type, period_start)
);

CREATE TABLE _tm_attempts (
    run_ref        BIGINT  NOT NULL REFERENCES _tm_runs (id) ON DELETE CASCADE,
    attempt        BIGINT  NOT NULL,
    run_id         TEXT    NOT NULL,
    worker         TEXT    NOT NULL,
    status         TEXT    NOT NULL
                   CHECK (status IN ('running', 'done', 'failed', 'lost')),
    resumed        BOOLEAN NOT NULL DEFAULT FALSE,
    rows_read      BIGINT,
    rows_inserted  BIGINT,
    rows_updated   BIGINT,
    rows_unchanged BIGINT,
    rows_deleted   BIGINT,
    rows_rejected  BIGINT,
    error_class    TEXT,
    error_message  TEXT,
    started_at     TIMESTAMPTZ NOT NULL,
    finished_at    TIMESTAMPTZ,
    PRIMARY KEY (run_ref, attempt)
);

CREATE TABLE _tm_batches (
    run_ref    BIGINT  NOT NULL REFERENCES _tm_runs (id) ON DELETE CASCADE,
    run_id     TEXT    NOT NULL,
    batch_no   BIGINT  NOT NULL,
    -- 16-byte natural-key hashes of every record of the batch, concatenated.
    key_hashes BYTEA   NOT NULL,
    PRIMARY KEY (run_ref, run_id, batch_no)
);

CREATE TABLE _tm_rejects (
    id           BIGSERIAL PRIMARY KEY,
    pipeline     TEXT NOT NULL,
    source       TEXT NOT NULL,
    export_type  TEXT NOT NULL,
    period_start TEXT NOT NULL,
    run_id       TEXT NOT NULL,
    location     TEXT NOT NULL,
    field        TEXT,
    value        TEXT,
    reason       TEXT NOT NULL,
    record       JSONB,
    created_at   TIMESTAMPTZ NOT NULL
);

CREATE INDEX _tm_rejects_run_key ON _tm_rejects (pipeline, source, export_type, period_start);
CREATE INDEX _tm_rejects_created ON _tm_rejects (created_at);
CREATE INDEX _tm_attempts_finished ON _tm_attempts (finished_at);
