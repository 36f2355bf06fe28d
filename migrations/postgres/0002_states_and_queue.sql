-- Ledger states as docs/ledger.md draws them: run keys may be `cancelled`
-- (taken out of the queue), attempts `interrupted` (stopped by a signal and
-- put back to `pending`). Columns for the work queue (priority, when and by
-- whom a key was queued, the backoff of a failing key), for open periods
-- (`provisional`), for schema evolution (`fields_fingerprint`), for
-- completeness (`rows_expected`) and for rows a later period holds
-- (`rows_superseded`). PostgreSQL version of
-- migrations/sqlite/0002_states_and_queue.sql (same columns).

ALTER TABLE _tm_runs DROP CONSTRAINT _tm_runs_status_check;
ALTER TABLE _tm_runs ADD CONSTRAINT _tm_runs_status_check
    CHECK (status IN ('pending', 'running', 'done', 'failed', 'cancelled'));
ALTER TABLE _tm_attempts DROP CONSTRAINT _tm_attempts_status_check;
ALTER TABLE _tm_attempts ADD CONSTRAINT _tm_attempts_status_check
    CHECK (status IN ('running', 'done', 'failed', 'lost', 'interrupted'));

ALTER TABLE _tm_runs
    ADD COLUMN priority           BIGINT  NOT NULL DEFAULT 0,
    ADD COLUMN enqueued_at        TIMESTAMPTZ,
    ADD COLUMN enqueued_by        TEXT,
    ADD COLUMN not_before         TIMESTAMPTZ,
    ADD COLUMN failures           BIGINT  NOT NULL DEFAULT 0,
    ADD COLUMN provisional        BOOLEAN NOT NULL DEFAULT FALSE,
    ADD COLUMN fields_fingerprint TEXT,
    ADD COLUMN rows_expected      BIGINT,
    ADD COLUMN rows_superseded    BIGINT  NOT NULL DEFAULT 0;
ALTER TABLE _tm_attempts ADD COLUMN rows_superseded BIGINT;

-- The queue: pending keys in claim order.
CREATE INDEX _tm_runs_queue ON _tm_runs (priority DESC, enqueued_at) WHERE status = 'pending';
