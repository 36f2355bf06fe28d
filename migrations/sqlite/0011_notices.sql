-- The notices outbox (docs/ledger.md "Notices", ADR 0024): a row per notice
-- and target, inserted in the same transaction as the ledger change that
-- causes it, delivered later by any process (at least once, with the id as
-- the `Idempotency-Key`). No URL or secret is stored: the deliverer reads
-- the target's URL from the pipeline file when it sends.
CREATE TABLE _tm_notices (
    id            TEXT    PRIMARY KEY,
    kind          TEXT    NOT NULL,
    target        TEXT    NOT NULL,
    pipeline      TEXT    NOT NULL,
    source        TEXT    NOT NULL,
    export_type   TEXT    NOT NULL,
    period_start  TEXT    NOT NULL,
    attempt       INTEGER NOT NULL,
    due_key       TEXT    NOT NULL DEFAULT '',
    payload       TEXT    NOT NULL,
    status        TEXT    NOT NULL DEFAULT 'pending'
                  CHECK (status IN ('pending', 'sent', 'dead')),
    attempts      INTEGER NOT NULL DEFAULT 0,
    not_before    TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    claimed_by    TEXT,
    lease_until   TEXT,
    last_error    TEXT,
    created_at    TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    sent_at       TEXT,
    -- One notice per change and target: `late` once per (run key, due
    -- instant) however many schedulers find it.
    UNIQUE (pipeline, source, export_type, period_start, kind, target, attempt, due_key)
);
-- Deliverers read the pending rows in order of creation.
CREATE INDEX _tm_notices_pending ON _tm_notices (created_at) WHERE status = 'pending';
