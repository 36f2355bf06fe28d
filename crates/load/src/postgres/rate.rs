//! The shared rate gate on PostgreSQL: one bucket row per source in
//! `_tm_rate_buckets`, taken by every process on every host.
//!
//! A take is one `UPDATE … RETURNING` (the row is inserted by the first
//! take ever). It refills the bucket for the time since the last take on
//! the database's clock (`clock_timestamp()`, evaluated once the row is
//! locked), caps it at the capacity and hands out up to the wanted number
//! of whole tokens. When none is there (or the source paused), it answers
//! how long until the next one, and the caller sleeps that long instead of
//! polling. A process keeps the extra tokens of a lease only for the plan's
//! hold ([`crate::rate`]), shared by all its readers of the source.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{LazyLock, Mutex, PoisonError};
use std::time::Duration;

use tidemark_core::rate::{GateFuture, RateGate};
use tidemark_core::Error;
use tokio::time::Instant;

use crate::db_error::db_error;
use crate::rate::LeasePlan;

/// The tokens in the bucket now: the old level refilled for the time since
/// the last take, at most the capacity ($5) at $3 per second.
const AVAILABLE: &str = "least($5::float8, b.tokens + $3::float8 \
    * greatest(0, extract(epoch FROM c.now - b.refilled_at)::float8))";

/// Whether the source asked to be left alone until later than now.
const PAUSED: &str = "coalesce(b.paused_until > c.now, false)";

/// The refill, the grant and the answer, on the locked row, in one
/// statement. The database's clock is read once (`c.now`); when the take
/// waited for another take's lock, that reading is a little early, which
/// only errs on the safe side (less refill, a longer wait), as the
/// `greatest` guards keep it. SET sees the old row, so `granted` is kept in
/// the row for RETURNING, which sees the new one. Parameters: pipeline,
/// source, per_second, burst, capacity, wanted tokens.
static TAKE: LazyLock<String> = LazyLock::new(|| {
    let grant =
        format!("CASE WHEN {PAUSED} THEN 0 ELSE least($6::int, floor({AVAILABLE})::int) END");
    format!(
        "UPDATE _tm_rate_buckets b SET
            per_second = $3,
            burst = $4,
            tokens = {AVAILABLE} - {grant},
            granted = {grant},
            refilled_at = greatest(b.refilled_at, c.now)
        FROM (SELECT clock_timestamp() AS now) c
        WHERE b.pipeline = $1 AND b.source = $2
        RETURNING b.granted,
            CASE WHEN b.granted > 0 THEN 0
                 ELSE greatest(extract(epoch FROM b.paused_until - c.now)::float8,
                               (1 - b.tokens) / $3::float8
                                 + extract(epoch FROM b.refilled_at - c.now)::float8,
                               0.001) END"
    )
});

/// The first take of a source in this database: a full bucket.
const CREATE: &str = "
INSERT INTO _tm_rate_buckets (pipeline, source, per_second, burst, tokens, refilled_at)
VALUES ($1, $2, $3, $4, $5, clock_timestamp())
ON CONFLICT (pipeline, source) DO NOTHING";

/// The source's `Retry-After`: pauses only lengthen.
const PAUSE: &str = "
INSERT INTO _tm_rate_buckets (pipeline, source, per_second, burst, tokens, refilled_at, paused_until)
VALUES ($1, $2, $3, $4, $5, clock_timestamp(), clock_timestamp() + make_interval(secs => $6))
ON CONFLICT (pipeline, source) DO UPDATE
SET paused_until = greatest(_tm_rate_buckets.paused_until, EXCLUDED.paused_until)";

/// One source's shared bucket, as this process sees it.
pub(crate) struct PgRateGate {
    store: super::PgStore,
    pipeline: String,
    source: String,
    plan: LeasePlan,
    /// Tokens leased and not yet spent, and this process's view of a pause.
    local: Mutex<Local>,
    /// Only one reader of this process asks the database at a time; the
    /// others wait here and then find the tokens it leased for them.
    taking: tokio::sync::Mutex<()>,
    /// Readers inside `acquire`: how many tokens a lease is worth.
    waiting: AtomicUsize,
}

#[derive(Debug, Default)]
struct Local {
    tokens: u32,
    /// Leased tokens are dropped at this instant (the lease's hold).
    expires: Option<Instant>,
    paused_until: Option<Instant>,
}

/// What a take got from the bucket.
struct Take {
    granted: u32,
    wait: Duration,
}

impl PgRateGate {
    pub(crate) fn new(
        store: super::PgStore,
        pipeline: &str,
        source: &str,
        plan: LeasePlan,
    ) -> PgRateGate {
        PgRateGate {
            store,
            pipeline: pipeline.to_string(),
            source: source.to_string(),
            plan,
            local: Mutex::new(Local::default()),
            taking: tokio::sync::Mutex::new(()),
            waiting: AtomicUsize::new(0),
        }
    }

    /// Spends a leased token, or says how long a pause still lasts.
    fn local_token(&self) -> Result<bool, Duration> {
        let mut local = self.local.lock().unwrap_or_else(PoisonError::into_inner);
        let now = Instant::now();
        if let Some(until) = local.paused_until.filter(|until| *until > now) {
            return Err(until - now);
        }
        if local.tokens > 0 && local.expires.is_some_and(|expires| now < expires) {
            local.tokens -= 1;
            return Ok(true);
        }
        local.tokens = 0;
        Ok(false)
    }

    async fn acquire_token(&self) -> Result<(), Error> {
        let _waiting = Waiting::enter(&self.waiting);
        loop {
            match self.local_token() {
                Ok(true) => return Ok(()),
                Err(pause) => {
                    tokio::time::sleep(pause).await;
                    continue;
                }
                Ok(false) => {}
            }
            let _taking = self.taking.lock().await;
            // Another reader may have leased tokens (or met a pause) while
            // this one waited for its turn.
            match self.local_token() {
                Ok(true) => return Ok(()),
                Err(_) => continue,
                Ok(false) => {}
            }
            let started = Instant::now();
            let want = self.plan.want(self.waiting.load(Ordering::Relaxed));
            let take = self.take(want).await?;
            if take.granted > 0 {
                let mut local = self.local.lock().unwrap_or_else(PoisonError::into_inner);
                local.tokens = take.granted - 1;
                // From the round trip's start: the grant was made after it.
                local.expires = Some(started + self.plan.hold);
                return Ok(());
            }
            // Everyone else would get the same answer: wait holding the turn.
            tokio::time::sleep(take.wait + race_jitter(take.wait)).await;
        }
    }

    /// One round trip to the bucket (two the first time a database sees
    /// the source).
    async fn take(&self, want: u32) -> Result<Take, Error> {
        for _ in 0..2 {
            let take = sqlx::query_as(TAKE.as_str())
                .persistent(self.store.persistent())
                .bind(&self.pipeline)
                .bind(&self.source)
                .bind(self.int(self.plan.per_second))
                .bind(self.int(self.plan.burst))
                .bind(f64::from(self.plan.capacity))
                .bind(self.int(want));
            let row: Option<(i32, f64)> = async {
                let mut on = self.store.single().await?;
                let row = take.fetch_optional(on.connection()).await?;
                on.finish().await.map(|()| row)
            }
            .await
            .map_err(|e| self.error("take a token", e))?;
            if let Some((granted, wait)) = row {
                return Ok(Take {
                    granted: u32::try_from(granted).unwrap_or(0),
                    wait: Duration::try_from_secs_f64(wait).unwrap_or(Duration::from_millis(1)),
                });
            }
            let create = sqlx::query(CREATE)
                .persistent(self.store.persistent())
                .bind(&self.pipeline)
                .bind(&self.source)
                .bind(self.int(self.plan.per_second))
                .bind(self.int(self.plan.burst))
                .bind(f64::from(self.plan.capacity));
            async {
                let mut on = self.store.single().await?;
                create.execute(on.connection()).await?;
                on.finish().await
            }
            .await
            .map_err(|e| self.error("create the bucket", e))?;
        }
        Err(Error::Database {
            message: format!(
                "rate limit of source {} of pipeline {}: the bucket row vanished twice while taking a token",
                self.source, self.pipeline
            ),
            transient: true,
        })
    }

    async fn pause(&self, delay: Duration) -> Result<(), Error> {
        {
            let mut local = self.local.lock().unwrap_or_else(PoisonError::into_inner);
            let until = Instant::now() + delay;
            local.paused_until = Some(local.paused_until.map_or(until, |u| u.max(until)));
            local.tokens = 0;
        }
        let pause = sqlx::query(PAUSE)
            .persistent(self.store.persistent())
            .bind(&self.pipeline)
            .bind(&self.source)
            .bind(self.int(self.plan.per_second))
            .bind(self.int(self.plan.burst))
            .bind(f64::from(self.plan.capacity))
            .bind(delay.as_secs_f64());
        async {
            let mut on = self.store.single().await?;
            pause.execute(on.connection()).await?;
            on.finish().await
        }
        .await
        .map_err(|e| self.error("pause the source", e))?;
        Ok(())
    }

    /// Quotas fit an INTEGER column (the config check bounds them).
    fn int(&self, value: u32) -> i32 {
        i32::try_from(value).unwrap_or(i32::MAX)
    }

    /// A database error naming the bucket; its class and retryability stay.
    fn error(&self, what: &str, err: sqlx::Error) -> Error {
        match db_error(err) {
            Error::Database { message, transient } => Error::Database {
                message: format!(
                    "rate limit of source {} of pipeline {}: cannot {what}: {message}",
                    self.source, self.pipeline
                ),
                transient,
            },
            other => other,
        }
    }
}

impl RateGate for PgRateGate {
    fn acquire(&self) -> GateFuture<'_, Result<(), Error>> {
        Box::pin(self.acquire_token())
    }

    fn pause_for(&self, delay: Duration) -> GateFuture<'_, Result<(), Error>> {
        Box::pin(self.pause(delay))
    }
}

/// Counts a reader inside `acquire` until it leaves (or is cancelled).
struct Waiting<'a>(&'a AtomicUsize);

impl<'a> Waiting<'a> {
    fn enter(count: &'a AtomicUsize) -> Waiting<'a> {
        count.fetch_add(1, Ordering::Relaxed);
        Waiting(count)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A few milliseconds at random added to a wait for the next token. Every
/// waiting process is told the same instant, and the one granted the last
/// token asks first (the others' takes queued behind its row lock), so
/// without it that process won every next race too: a test saw three
/// processes take their five tokens each one after another. At most 5 ms
/// (2 % of a 4-per-second wait), so a lone process keeps its rate.
fn race_jitter(wait: Duration) -> Duration {
    (wait / 20)
        .min(Duration::from_millis(5))
        .mul_f64(rand::random::<f64>())
}
