//! What this process's rate gates have made its requests wait, per
//! pipeline and source (`tidemark_rate_limit_wait_seconds_total`,
//! `tidemark_rate_limit_paused`). Every gate the engine hands a reader is
//! wrapped in a [`MeteredGate`]; the totals live as long as the process.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use tidemark_core::rate::{GateFuture, RateGate};
use tidemark_core::Error;

/// One source's totals in this process.
#[derive(Debug, Default)]
struct GateStats {
    /// Nanoseconds spent waiting in `acquire`.
    waited_nanos: AtomicU64,
    /// Until when the source asked to be left alone.
    paused_until: Mutex<Option<Instant>>,
}

type Key = (String, String);

fn registry() -> &'static Mutex<BTreeMap<Key, Arc<GateStats>>> {
    static STATS: OnceLock<Mutex<BTreeMap<Key, Arc<GateStats>>>> = OnceLock::new();
    STATS.get_or_init(Default::default)
}

fn stats_of(pipeline: &str, source: &str) -> Arc<GateStats> {
    let mut all = registry().lock().unwrap_or_else(PoisonError::into_inner);
    Arc::clone(
        all.entry((pipeline.to_string(), source.to_string()))
            .or_default(),
    )
}

/// One source's rate-limit totals in this process.
#[derive(Debug, Clone, PartialEq)]
pub struct RateStat {
    /// Pipeline.
    pub pipeline: String,
    /// Source id.
    pub source: String,
    /// Seconds requests waited for the gate, in all.
    pub waited_seconds: f64,
    /// The source asked to be left alone, and its pause has not ended.
    pub paused: bool,
}

/// Every source a gate of this process has served.
pub fn rate_stats() -> Vec<RateStat> {
    let now = Instant::now();
    let all = registry().lock().unwrap_or_else(PoisonError::into_inner);
    all.iter()
        .map(|((pipeline, source), stats)| RateStat {
            pipeline: pipeline.clone(),
            source: source.clone(),
            waited_seconds: Duration::from_nanos(stats.waited_nanos.load(Ordering::Relaxed))
                .as_secs_f64(),
            paused: stats
                .paused_until
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .is_some_and(|until| until > now),
        })
        .collect()
}

/// A gate that counts what it makes requests wait.
pub(crate) struct MeteredGate {
    inner: Arc<dyn RateGate>,
    stats: Arc<GateStats>,
}

impl MeteredGate {
    pub(crate) fn wrap(
        pipeline: &str,
        source: &str,
        inner: Arc<dyn RateGate>,
    ) -> Arc<dyn RateGate> {
        Arc::new(MeteredGate {
            inner,
            stats: stats_of(pipeline, source),
        })
    }
}

impl RateGate for MeteredGate {
    fn acquire(&self) -> GateFuture<'_, Result<(), Error>> {
        Box::pin(async move {
            let started = Instant::now();
            let acquired = self.inner.acquire().await;
            let waited = u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX);
            self.stats.waited_nanos.fetch_add(waited, Ordering::Relaxed);
            acquired
        })
    }

    fn pause_for(&self, delay: Duration) -> GateFuture<'_, Result<(), Error>> {
        Box::pin(async move {
            let until = Instant::now() + delay;
            {
                let mut paused = self
                    .stats
                    .paused_until
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner);
                *paused = Some(paused.map_or(until, |at| at.max(until)));
            }
            self.inner.pause_for(delay).await
        })
    }
}
