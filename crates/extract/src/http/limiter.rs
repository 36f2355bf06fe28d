//! Rate limits shared by every period of a source that runs in this
//! process at once (`backfill --concurrency N` runs N periods as tasks of
//! one process, each with its own reader).
//!
//! The limiter lives in a process-wide registry keyed by pipeline, source
//! and quota, so every reader of the same source draws from one bucket
//! without the runner having to pass anything around. A changed quota (the
//! pipeline file was edited under `serve`) gets a fresh limiter.

use std::collections::HashMap;
use std::num::NonZeroU32;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};
use tidemark_core::spec::RateLimit;

/// Registry key: pipeline name, source id, requests per second, burst.
type Key = (String, String, u32, u32);

static LIMITERS: OnceLock<Mutex<HashMap<Key, Arc<DefaultDirectRateLimiter>>>> = OnceLock::new();

/// The limiter of `source` of `pipeline`, created on first use. `None`
/// when `per_second` is zero (refused by the config check; never a panic).
///
/// `burst` is the number of *extra* requests allowed at once: the bucket
/// holds `1 + burst` requests and refills at `per_second`, so any one-second
/// window sees at most `per_second + burst` requests.
pub(crate) fn shared(
    pipeline: &str,
    source: &str,
    limit: RateLimit,
) -> Option<Arc<DefaultDirectRateLimiter>> {
    let per_second = NonZeroU32::new(limit.per_second)?;
    let burst = limit.burst.unwrap_or(0);
    let capacity = NonZeroU32::new(burst.saturating_add(1)).unwrap_or(NonZeroU32::MIN);
    let key = (
        pipeline.to_string(),
        source.to_string(),
        per_second.get(),
        burst,
    );
    let registry = LIMITERS.get_or_init(Mutex::default);
    // A panic while holding the lock cannot leave the map half-updated.
    let mut map = registry.lock().unwrap_or_else(PoisonError::into_inner);
    let limiter = map.entry(key).or_insert_with(|| {
        Arc::new(RateLimiter::direct(
            Quota::per_second(per_second).allow_burst(capacity),
        ))
    });
    Some(Arc::clone(limiter))
}
