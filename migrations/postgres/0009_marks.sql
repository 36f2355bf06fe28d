-- Marked periods (`tidemark mark`): a run key recorded `done` without a
-- run, because another tool loaded it (`marked = 'done'`, adoption) or
-- because it is deliberately empty (`marked = 'skipped'`), with the
-- operator's note. On `_tm_runs` the columns describe the key's current
-- `done` (the next claim clears them); on `_tm_attempts` they say which
-- attempts were marks rather than runs (docs/ledger.md).
--
-- The stable views gain both columns at their end (a `v1` view may only
-- grow at the end): dropped and created again with 0008's definitions.

ALTER TABLE _tm_runs ADD COLUMN marked TEXT CHECK (marked IN ('done', 'skipped'));
ALTER TABLE _tm_runs ADD COLUMN mark_note TEXT;
ALTER TABLE _tm_attempts ADD COLUMN marked TEXT CHECK (marked IN ('done', 'skipped'));
ALTER TABLE _tm_attempts ADD COLUMN mark_note TEXT;

DROP VIEW tidemark_v1_periods;
DROP VIEW tidemark_v1_attempts;

CREATE VIEW tidemark_v1_periods AS
SELECT
    r.pipeline           AS pipeline,
    r.source             AS source,
    r.export_type        AS export_type,
    r.period_start       AS period_start,
    r.period_end         AS period_end,
    r.status             AS status,
    r.attempt            AS attempts,
    r.run_id             AS run_id,
    r.batches            AS batches,
    r.rows_read          AS rows_read,
    r.rows_inserted      AS rows_inserted,
    r.rows_updated       AS rows_updated,
    r.rows_unchanged     AS rows_unchanged,
    r.rows_deleted       AS rows_deleted,
    r.rows_rejected      AS rows_rejected,
    r.rows_superseded    AS rows_superseded,
    r.rows_expected      AS rows_expected,
    r.error_class        AS error_class,
    r.error_message      AS error_message,
    r.handler_version    AS handler_version,
    -- As `status` shows it: a done key that was done while its period was
    -- open. (On a pending or running key the column is the queue's note.)
    (r.status = 'done' AND r.provisional) AS provisional,
    r.priority           AS priority,
    r.enqueued_at        AS enqueued_at,
    r.enqueued_by        AS enqueued_by,
    r.not_before         AS not_before,
    r.failures           AS failures,
    r.lease_owner        AS lease_owner,
    r.lease_host         AS lease_host,
    r.lease_pid          AS lease_pid,
    r.lease_expires_at   AS lease_expires_at,
    r.started_at         AS started_at,
    r.finished_at        AS finished_at,
    r.created_at         AS created_at,
    r.updated_at         AS updated_at,
    r.marked             AS marked,
    r.mark_note          AS mark_note
FROM _tm_runs AS r;

CREATE VIEW tidemark_v1_attempts AS
SELECT
    r.pipeline           AS pipeline,
    r.source             AS source,
    r.export_type        AS export_type,
    r.period_start       AS period_start,
    r.period_end         AS period_end,
    a.attempt            AS attempt,
    a.run_id             AS run_id,
    a.worker             AS worker,
    a.status             AS status,
    a.resumed            AS resumed,
    a.from_batch         AS from_batch,
    a.rows_read          AS rows_read,
    a.rows_inserted      AS rows_inserted,
    a.rows_updated       AS rows_updated,
    a.rows_unchanged     AS rows_unchanged,
    a.rows_deleted       AS rows_deleted,
    a.rows_rejected      AS rows_rejected,
    a.rows_superseded    AS rows_superseded,
    a.rows_expected      AS rows_expected,
    a.error_class        AS error_class,
    a.error_message      AS error_message,
    a.started_at         AS started_at,
    a.finished_at        AS finished_at,
    CAST(ROUND(EXTRACT(EPOCH FROM (a.finished_at - a.started_at)) * 1000) AS BIGINT)
                         AS duration_ms,
    a.marked             AS marked,
    a.mark_note          AS mark_note
FROM _tm_attempts AS a
JOIN _tm_runs AS r ON r.id = a.run_ref;
