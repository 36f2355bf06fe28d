-- Workers in the ledger (docs/ledger.md "Workers"): every `serve` and every
-- command that claims run keys records itself in `_tm_workers` at start,
-- renews `last_seen` on a ticker while it runs and sets `stopped_at` when it
-- ends gracefully. A worker not stopped whose `last_seen` is older than its
-- own `lease_ttl_ms` (by the database's clock) is dead: a peer killed with
-- SIGKILL is seen dead by every reader, without asking its host.
--
-- `worker` is the lease owner string (`host:pid:instance`), the same text
-- `_tm_attempts.worker` and `_tm_runs.lease_owner` hold.

CREATE TABLE _tm_workers (
    worker        TEXT        PRIMARY KEY,
    host          TEXT        NOT NULL,
    pid           BIGINT      NOT NULL,
    version       TEXT        NOT NULL,
    kind          TEXT        NOT NULL CHECK (kind IN ('serve', 'cli')),
    slots         BIGINT      NOT NULL,
    lease_ttl_ms  BIGINT      NOT NULL,
    heartbeat_ms  BIGINT      NOT NULL,
    started_at    TIMESTAMPTZ NOT NULL,
    last_seen     TIMESTAMPTZ NOT NULL,
    stopped_at    TIMESTAMPTZ
);
CREATE INDEX _tm_workers_last_seen ON _tm_workers (last_seen);

-- When the attempt's run key entered the work queue (its `enqueued_at`,
-- for an attempt that claimed a queued key; NULL otherwise): queue wait is
-- `started_at - queued_at` (`tidemark_queue_wait_seconds`).
ALTER TABLE _tm_attempts ADD COLUMN queued_at TIMESTAMPTZ;

-- /metrics counts run keys per pipeline, source and status from an index
-- alone, and finds the first period not done (freshness) among the few
-- keys not done; the newest done one before it is then one look-up in the
-- run key's unique index. Attempts are read by `finished_at` (indexed
-- since 0001) as they end, never all at once after the first scrape.
-- `status` leads: an index led by (pipeline, source, export_type) would
-- compete with the unique index for look-ups of one run key, and a planner
-- without statistics (a fresh ledger filling with a million keys) picked
-- it, reading every key of the pipeline per look-up.
CREATE INDEX _tm_runs_metrics ON _tm_runs (status, pipeline, source, export_type);
CREATE INDEX _tm_runs_open ON _tm_runs (pipeline, source, export_type, period_start)
    WHERE status <> 'done';

-- A stable view of the workers, with the state every view judges alike.
CREATE VIEW tidemark_v1_workers AS
SELECT
    w.worker        AS worker,
    w.host          AS host,
    w.pid           AS pid,
    w.version       AS version,
    w.kind          AS kind,
    w.slots         AS slots,
    w.lease_ttl_ms  AS lease_ttl_ms,
    w.heartbeat_ms  AS heartbeat_ms,
    w.started_at    AS started_at,
    w.last_seen     AS last_seen,
    w.stopped_at    AS stopped_at,
    CASE
        WHEN w.stopped_at IS NOT NULL THEN 'stopped'
        WHEN w.last_seen + make_interval(secs => w.lease_ttl_ms / 1000.0) < now() THEN 'dead'
        ELSE 'live'
    END             AS state
FROM _tm_workers AS w;
