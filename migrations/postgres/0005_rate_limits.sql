-- One token bucket per rate-limited source, shared by every process on
-- every host that reads it (ADR 0010). A take is one UPDATE that refills
-- `tokens` for the time since `refilled_at` (the database's clock, so the
-- hosts' clocks do not matter), caps them at the capacity and hands out
-- whole tokens; `granted` is what the last take got (UPDATE … RETURNING
-- sees only the new row). `paused_until` is the source's own Retry-After:
-- no take succeeds before it.
CREATE TABLE _tm_rate_buckets (
    pipeline TEXT NOT NULL,
    source TEXT NOT NULL,
    per_second INTEGER NOT NULL,
    burst INTEGER NOT NULL,
    tokens DOUBLE PRECISION NOT NULL,
    granted INTEGER NOT NULL DEFAULT 0,
    refilled_at TIMESTAMPTZ NOT NULL,
    paused_until TIMESTAMPTZ,
    PRIMARY KEY (pipeline, source)
);
