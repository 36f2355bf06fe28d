-- Ledger states as docs/ledger.md draws them: run keys may be `cancelled`
-- (taken out of the queue), attempts `interrupted` (stopped by a signal and
-- put back to `pending`). Columns for the work queue (priority, when and by
-- whom a key was queued, the backoff of a failing key), for open periods
-- (`provisional`), for schema evolution (`fields_fingerprint`), for
-- completeness (`rows_expected`) and for rows a later period holds
-- (`rows_superseded`).
--
-- SQLite cannot change a CHECK constraint, so the tables are rebuilt, in
-- the one transaction sqlx runs a migration in. Foreign keys stay on (the
-- pragma cannot change inside a transaction), so the old run table is never
-- dropped while a table references it: dropping it would cascade into the
-- attempt history. Renaming a table rewrites the references to it, so:
-- rename the run table away, create the new one, rebuild each child table
-- against it, and drop the old run table last, unreferenced.

ALTER TABLE _tm_runs RENAME TO _tm_runs_old;

CREATE TABLE _tm_runs (
    id                 INTEGER PRIMARY KEY,
    pipeline           TEXT    NOT NULL,
    source             TEXT    NOT NULL,
    export_type        TEXT    NOT NULL,
    period_start       TEXT    NOT NULL,
    period_end         TEXT    NOT NULL,
    status             TEXT    NOT NULL DEFAULT 'pending'
                       CHECK (status IN ('pending', 'running', 'done', 'failed', 'cancelled')),
    attempt            INTEGER NOT NULL DEFAULT 0,
    run_id             TEXT,
    lease_owner        TEXT,
    lease_host         TEXT,
    lease_pid          INTEGER,
    lease_expires_at   TEXT,
    checkpoint         TEXT,
    batches            INTEGER NOT NULL DEFAULT 0,
    rows_read          INTEGER NOT NULL DEFAULT 0,
    rows_inserted      INTEGER NOT NULL DEFAULT 0,
    rows_updated       INTEGER NOT NULL DEFAULT 0,
    rows_unchanged     INTEGER NOT NULL DEFAULT 0,
    rows_deleted       INTEGER NOT NULL DEFAULT 0,
    rows_rejected      INTEGER NOT NULL DEFAULT 0,
    handler_version    TEXT,
    error_class        TEXT,
    error_message      TEXT,
    result             TEXT,
    started_at         TEXT,
    finished_at        TEXT,
    created_at         TEXT    NOT NULL,
    updated_at         TEXT    NOT NULL,
    priority           INTEGER NOT NULL DEFAULT 0,
    enqueued_at        TEXT,
    enqueued_by        TEXT,
    not_before         TEXT,
    failures           INTEGER NOT NULL DEFAULT 0,
    provisional        INTEGER NOT NULL DEFAULT 0,
    fields_fingerprint TEXT,
    rows_expected      INTEGER,
    rows_superseded    INTEGER NOT NULL DEFAULT 0,
    UNIQUE (pipeline, source, export_type, period_start)
);
INSERT INTO _tm_runs (
    id, pipeline, source, export_type, period_start, period_end, status, attempt, run_id, lease_owner,
    lease_host, lease_pid, lease_expires_at, checkpoint, batches, rows_read, rows_inserted, rows_updated,
    rows_unchanged, rows_deleted, rows_rejected, handler_version, error_class, error_message, result,
    started_at, finished_at, created_at, updated_at)
SELECT
    id, pipeline, source, export_type, period_start, period_end, status, attempt, run_id, lease_owner,
    lease_host, lease_pid, lease_expires_at, checkpoint, batches, rows_read, rows_inserted, rows_updated,
    rows_unchanged, rows_deleted, rows_rejected, handler_version, error_class, error_message, result,
    started_at, finished_at, created_at, updated_at
FROM _tm_runs_old;

ALTER TABLE _tm_attempts RENAME TO _tm_attempts_old;

CREATE TABLE _tm_attempts (
    run_ref         INTEGER NOT NULL REFERENCES _tm_runs (id) ON DELETE CASCADE,
    attempt         INTEGER NOT NULL,
    run_id          TEXT    NOT NULL,
    worker          TEXT    NOT NULL,
    status          TEXT    NOT NULL
                    CHECK (status IN ('running', 'done', 'failed', 'lost', 'interrupted')),
    resumed         INTEGER NOT NULL DEFAULT 0,
    rows_read       INTEGER,
    rows_inserted   INTEGER,
    rows_updated    INTEGER,
    rows_unchanged  INTEGER,
    rows_deleted    INTEGER,
    rows_rejected   INTEGER,
    error_class     TEXT,
    error_message   TEXT,
    started_at      TEXT    NOT NULL,
    finished_at     TEXT,
    rows_superseded INTEGER,
    PRIMARY KEY (run_ref, attempt)
);
INSERT INTO _tm_attempts (
    run_ref, attempt, run_id, worker, status, resumed, rows_read, rows_inserted, rows_updated,
    rows_unchanged, rows_deleted, rows_rejected, error_class, error_message, started_at, finished_at)
SELECT
    run_ref, attempt, run_id, worker, status, resumed, rows_read, rows_inserted, rows_updated,
    rows_unchanged, rows_deleted, rows_rejected, error_class, error_message, started_at, finished_at
FROM _tm_attempts_old;
DROP TABLE _tm_attempts_old;
CREATE INDEX _tm_attempts_finished ON _tm_attempts (finished_at);

ALTER TABLE _tm_batches RENAME TO _tm_batches_old;
CREATE TABLE _tm_batches (
    run_ref    INTEGER NOT NULL REFERENCES _tm_runs (id) ON DELETE CASCADE,
    run_id     TEXT    NOT NULL,
    batch_no   INTEGER NOT NULL,
    -- 16-byte natural-key hashes the batch saw without writing, concatenated.
    key_hashes BLOB    NOT NULL,
    PRIMARY KEY (run_ref, run_id, batch_no)
);
INSERT INTO _tm_batches (run_ref, run_id, batch_no, key_hashes)
SELECT run_ref, run_id, batch_no, key_hashes FROM _tm_batches_old;
DROP TABLE _tm_batches_old;

DROP TABLE _tm_runs_old;

-- The queue: pending keys in claim order.
CREATE INDEX _tm_runs_queue ON _tm_runs (priority DESC, enqueued_at) WHERE status = 'pending';
