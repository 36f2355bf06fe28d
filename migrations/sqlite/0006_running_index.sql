-- Every queue claim also looks for running keys it may take over (an
-- expired lease, or a holder on this host that may be gone). Without an
-- index that look was a scan of the whole ledger per claim: 3.9 ms at
-- 10,000 run keys on PostgreSQL, growing with the ledger, and the queue's
-- throughput with it (241 periods/s through the queue at 1,000 keys, 130/s
-- at 10,000). Running keys are few, so a partial index keeps it constant.
CREATE INDEX _tm_runs_running ON _tm_runs (lease_expires_at) WHERE status = 'running';
