//! The in-process rate gate: one bucket shared by every period of a source
//! that runs in this process at once (`backfill --concurrency N` runs N
//! periods as tasks of one process, each with its own reader). It is the
//! gate on SQLite, where one process owns the database; on PostgreSQL the
//! binary hands the readers the ledger's shared bucket instead.
//!
//! Gates live in a process-wide registry keyed by pipeline, source and
//! quota, so every reader of the same source draws from one bucket. A
//! changed quota (the pipeline file was edited under `serve`) gets a fresh
//! gate.

use std::collections::HashMap;
use std::num::NonZeroU32;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};
use tidemark_core::rate::{GateFuture, RateGate};
use tidemark_core::spec::RateLimit;
use tidemark_core::Error;
use tokio::time::Instant;

/// The longest pause kept (a year): a larger `Retry-After` is capped
/// before it gets here, and this keeps the deadline arithmetic in range.
const MAX_PAUSE: Duration = Duration::from_secs(365 * 24 * 3600);

/// Registry key: pipeline name, source id, requests per second, burst.
type Key = (String, String, u32, u32);

static GATES: OnceLock<Mutex<HashMap<Key, Arc<LocalGate>>>> = OnceLock::new();

/// The in-process gate of `source` of `pipeline`, created on first use.
/// `None` when `per_second` is zero (refused by the config check; never a
/// panic).
///
/// `burst` is the number of *extra* requests allowed at once: the bucket
/// holds `1 + burst` requests and refills at `per_second`, so any one-second
/// window sees at most `per_second + burst` requests.
pub fn local_gate(pipeline: &str, source: &str, limit: RateLimit) -> Option<Arc<dyn RateGate>> {
    let per_second = NonZeroU32::new(limit.per_second)?;
    let burst = limit.burst.unwrap_or(0);
    let capacity = NonZeroU32::new(burst.saturating_add(1)).unwrap_or(NonZeroU32::MIN);
    let key = (
        pipeline.to_string(),
        source.to_string(),
        per_second.get(),
        burst,
    );
    let registry = GATES.get_or_init(Mutex::default);
    // A panic while holding the lock cannot leave the map half-updated.
    let mut map = registry.lock().unwrap_or_else(PoisonError::into_inner);
    let gate = map.entry(key).or_insert_with(|| {
        Arc::new(LocalGate {
            limiter: RateLimiter::direct(Quota::per_second(per_second).allow_burst(capacity)),
            paused_until: Mutex::new(None),
        })
    });
    Some(Arc::clone(gate) as Arc<dyn RateGate>)
}

/// governor's bucket, plus the source's own `Retry-After` pause.
struct LocalGate {
    limiter: DefaultDirectRateLimiter,
    paused_until: Mutex<Option<Instant>>,
}

impl LocalGate {
    /// The end of the pause, while one lasts.
    fn paused(&self) -> Option<Instant> {
        let until = *self
            .paused_until
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        until.filter(|until| *until > Instant::now())
    }
}

impl RateGate for LocalGate {
    fn acquire(&self) -> GateFuture<'_, Result<(), Error>> {
        Box::pin(async move {
            loop {
                while let Some(until) = self.paused() {
                    tokio::time::sleep_until(until).await;
                }
                self.limiter.until_ready().await;
                // A pause that began while this reader waited for its token
                // holds it too; the token is given up, not saved for later.
                if self.paused().is_none() {
                    return Ok(());
                }
            }
        })
    }

    fn pause_for(&self, delay: Duration) -> GateFuture<'_, Result<(), Error>> {
        Box::pin(async move {
            let until = Instant::now() + delay.min(MAX_PAUSE);
            let mut paused = self
                .paused_until
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            *paused = Some(paused.map_or(until, |earlier| earlier.max(until)));
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limit(per_second: u32, burst: u32) -> RateLimit {
        RateLimit {
            per_second,
            burst: Some(burst),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_pause_holds_every_reader_and_only_lengthens() {
        let gate = local_gate("p", "pause", limit(100, 0)).unwrap();
        gate.acquire().await.unwrap();
        let start = Instant::now();
        gate.pause_for(Duration::from_secs(3)).await.unwrap();
        gate.pause_for(Duration::from_secs(1)).await.unwrap();
        let other = local_gate("p", "pause", limit(100, 0)).unwrap();
        other.acquire().await.unwrap();
        assert!(start.elapsed() >= Duration::from_secs(3));
        assert!(start.elapsed() < Duration::from_millis(3100));
    }

    #[test]
    fn zero_per_second_has_no_gate() {
        assert!(local_gate("p", "zero", limit(0, 0)).is_none());
    }
}
