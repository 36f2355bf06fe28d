-- The run ledger: one row per run key, the history of attempts, the keys
-- seen by the batches of an unfinished run, and rejected records.
-- It lives in the destination database so that a batch of rows, its
-- checkpoint and the fencing check commit in one transaction.

CREATE TABLE _tm_runs (
    id               INTEGER PRIMARY KEY,
    pipeline         TEXT    NOT NULL,
    source           TEXT    NOT NULL,
    export_type      TEXT    NOT NULL,
    period_start     TEXT    NOT NULL,
    period_end       TEXT    NOT NULL,
    status           TEXT    NOT NULL DEFAULT 'pending'
                     CHECK (status IN ('pending', 'running', 'done', 'failed')),
    attempt          INTEGER NOT NULL DEFAULT 0,
    run_id           TEXT,
    lease_owner      TEXT,
    lease_host       TEXT,
    lease_pid        INTEGER,
    lease_expires_at TEXT,
    checkpoint       TEXT,
    batches          INTEGER NOT NULL DEFAULT 0,
    rows_read        INTEGER NOT NULL DEFAULT 0,
    rows_inserted    INTEGER NOT NULL DEFAULT 0,
    rows_updated     INTEGER NOT NULL DEFAULT 0,
    rows_unchanged   INTEGER NOT NULL DEFAULT 0,
    rows_deleted     INTEGER NOT NULL DEFAULT 0,
    rows_rejected    INTEGER NOT NULL DEFAULT 0,
    handler_version  TEXT,
    error_class      TEXT,
    error_message    TEXT,
    result           TEXT,
    started_at       TEXT,
    finished_at      TEXT,
    created_at       TEXT    NOT NULL,
    updated_at       TEXT    NOT NULL,
    UNIQUE (pipeline, source, export_type, period_start)
);

CREATE TABLE _tm_attempts (
    run_ref        INTEGER NOT NULL REFERENCES _tm_runs (id) ON DELETE CASCADE,
    attempt        INTEGER NOT NULL,
    run_id         TEXT    NOT NULL,
    worker         TEXT    NOT NULL,
    status         TEXT    NOT NULL
                   CHECK (status IN ('running', 'done', 'failed', 'lost')),
    resumed        INTEGER NOT NULL DEFAULT 0,
    rows_read      INTEGER,
    rows_inserted  INTEGER,
    rows_updated   INTEGER,
    rows_unchanged INTEGER,
    rows_deleted   INTEGER,
    rows_rejected  INTEGER,
    error_class    TEXT,
    error_message  TEXT,
    started_at     TEXT    NOT NULL,
    finished_at    TEXT,
    PRIMARY KEY (run_ref, attempt)
);

CREATE TABLE _tm_batches (
    run_ref    INTEGER NOT NULL REFERENCES _tm_runs (id) ON DELETE CASCADE,
    run_id     TEXT    NOT NULL,
    batch_no   INTEGER NOT NULL,
    -- 16-byte natural-key hashes of every record of the batch, concatenated.
    key_hashes BLOB    NOT NULL,
    PRIMARY KEY (run_ref, run_id, batch_no)
);

CREATE TABLE _tm_rejects (
    id           INTEGER PRIMARY KEY,
    pipeline     TEXT NOT NULL,
    source       TEXT NOT NULL,
    export_type  TEXT NOT NULL,
    period_start TEXT NOT NULL,
    run_id       TEXT NOT NULL,
    location     TEXT NOT NULL,
    field        TEXT,
    value        TEXT,
    reason       TEXT NOT NULL,
    record       TEXT,
    created_at   TEXT NOT NULL
);

CREATE INDEX _tm_rejects_run_key ON _tm_rejects (pipeline, source, export_type, period_start);
CREATE INDEX _tm_rejects_created ON _tm_rejects (created_at);
CREATE INDEX _tm_attempts_finished ON _tm_attempts (finished_at);
