-- The work queue's claim order: `queue_rank` = `enqueued_at` minus one
-- minute per point of `priority`, so higher priority is a head start in
-- time and waiting is aging: a key of priority 0 queued an hour ago is
-- claimed before one of priority 60 queued now, so no key is starved.
-- A static column, so claims read the queue in index order (with SKIP
-- LOCKED, each worker takes the first key no other claim holds).
ALTER TABLE _tm_runs ADD COLUMN queue_rank TIMESTAMPTZ;
DROP INDEX _tm_runs_queue;
CREATE INDEX _tm_runs_queue ON _tm_runs (queue_rank) WHERE status = 'pending';
