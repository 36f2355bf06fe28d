//! This process as a worker in the ledger, and the ticks of its loops.
//!
//! [`Presence`] records the process in `_tm_workers` the first time it
//! works (a `serve` at start, a command when it first claims a key), renews
//! `last_seen` on a ticker every third of the lease length and notes a
//! graceful end on [`crate::Engine::close`]. A process killed with SIGKILL
//! stops renewing, and every reader sees it `dead` once its lease length
//! has passed.
//!
//! [`Health`] is what `/healthz` judges: every loop of the process (the
//! presence ticker, the scheduler, each worker slot) ticks with the longest
//! it may stay silent; one silent past its bound is wedged.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tidemark_load::{Store, WorkerId, WorkerInfo, WorkerKind};
use tokio::task::JoinHandle;

/// The name of the presence ticker's loop in [`Health`].
pub const HEARTBEAT_LOOP: &str = "heartbeat";

/// The ticks of a process's loops.
#[derive(Debug, Clone, Default)]
pub struct Health {
    loops: Arc<Mutex<BTreeMap<String, Tick>>>,
}

#[derive(Debug, Clone, Copy)]
struct Tick {
    at: Instant,
    bound: Duration,
    /// Running a key: a worker slot is not wedged while its attempt runs
    /// (the attempt has its own lease heartbeat).
    busy: bool,
}

/// A loop silent past its bound.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Wedged {
    /// The loop's name (`scheduler`, `worker 0`, `heartbeat`).
    pub name: String,
    /// How long it has been silent.
    pub silent: Duration,
    /// Its bound.
    pub bound: Duration,
}

impl Health {
    /// `name` is alive now and must tick again within `bound`.
    pub fn tick(&self, name: &str, bound: Duration) {
        self.set(name, bound, false);
    }

    /// `name` runs something of unbounded length (a key): not judged until
    /// its next [`Health::tick`].
    pub fn busy(&self, name: &str, bound: Duration) {
        self.set(name, bound, true);
    }

    /// `name` has ended on purpose: no longer judged.
    pub fn done(&self, name: &str) {
        self.loops
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(name);
    }

    fn set(&self, name: &str, bound: Duration, busy: bool) {
        let tick = Tick {
            at: Instant::now(),
            bound,
            busy,
        };
        self.loops
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(name.to_string(), tick);
    }

    /// The loops ticking now, by name.
    pub fn loops(&self) -> Vec<String> {
        let loops = self.loops.lock().unwrap_or_else(PoisonError::into_inner);
        loops.keys().cloned().collect()
    }

    /// Every loop silent past its bound.
    pub fn wedged(&self) -> Vec<Wedged> {
        let now = Instant::now();
        let loops = self.loops.lock().unwrap_or_else(PoisonError::into_inner);
        loops
            .iter()
            .filter(|(_, t)| !t.busy)
            .filter_map(|(name, t)| {
                let silent = now.saturating_duration_since(t.at);
                (silent > t.bound).then(|| Wedged {
                    name: name.clone(),
                    silent,
                    bound: t.bound,
                })
            })
            .collect()
    }
}

/// This process's row in `_tm_workers`. Cheap to clone; clones share it.
#[derive(Debug, Clone)]
pub(crate) struct Presence {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    store: Store,
    worker: WorkerId,
    lease_ttl: Duration,
    health: Health,
    ticker: tokio::sync::Mutex<Option<JoinHandle<()>>>,
}

impl Presence {
    pub(crate) fn new(store: Store, worker: WorkerId, lease_ttl: Duration, health: Health) -> Self {
        Presence {
            inner: Arc::new(Inner {
                store,
                worker,
                lease_ttl,
                health,
                ticker: tokio::sync::Mutex::new(None),
            }),
        }
    }

    /// How often `last_seen` is renewed: a third of the lease, as leases are.
    fn interval(&self) -> Duration {
        (self.inner.lease_ttl / 3).max(Duration::from_millis(100))
    }

    /// Records the worker and starts its ticker, unless done already. A
    /// database that refuses is logged, never fatal: the work matters more
    /// than being seen, and the ticker tries again.
    pub(crate) async fn ensure(&self, kind: WorkerKind, slots: u32) {
        let mut ticker = self.inner.ticker.lock().await;
        if ticker.is_some() {
            return;
        }
        let info = WorkerInfo {
            id: self.inner.worker.clone(),
            version: env!("CARGO_PKG_VERSION").to_string(),
            kind,
            slots,
            lease_ttl: self.inner.lease_ttl,
            heartbeat: self.interval(),
        };
        if let Err(e) = self.inner.store.register_worker(&info).await {
            tracing::warn!(error = %e, "cannot record this worker in the ledger; trying again");
        }
        *ticker = Some(tokio::spawn(beat(
            self.inner.store.clone(),
            info,
            self.inner.health.clone(),
        )));
    }

    /// Stops the ticker and notes the graceful end (when recorded).
    pub(crate) async fn stop(&self) {
        let Some(ticker) = self.inner.ticker.lock().await.take() else {
            return;
        };
        ticker.abort();
        self.inner.health.done(HEARTBEAT_LOOP);
        let stopping = self.inner.store.worker_stopped(&self.inner.worker);
        match tokio::time::timeout(Duration::from_secs(5), stopping).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, "cannot record this worker's end"),
            Err(_) => tracing::warn!("recording this worker's end took over 5 s; not waiting"),
        }
    }
}

/// The ticker: renews `last_seen` (registering again when the row is gone)
/// and ticks [`HEARTBEAT_LOOP`] at every beat, whether or not the database
/// took it: an unreachable database is `/readyz`'s to report, and a
/// liveness probe that failed with it would restart every worker at once.
/// Each renewal is bounded by the beat, so a hung connection never stops
/// the loop.
async fn beat(store: Store, info: WorkerInfo, health: Health) {
    let every = info.heartbeat;
    let bound = every * 3 + Duration::from_secs(1);
    health.tick(HEARTBEAT_LOOP, bound);
    loop {
        tokio::time::sleep(every).await;
        let renew = async {
            match store.worker_heartbeat(&info.id).await {
                Ok(true) => Ok(()),
                Ok(false) => store.register_worker(&info).await,
                Err(e) => Err(e),
            }
        };
        match tokio::time::timeout(every, renew).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, "worker heartbeat failed; will try again"),
            Err(_) => tracing::warn!("worker heartbeat got no answer in time; will try again"),
        }
        health.tick(HEARTBEAT_LOOP, bound);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_loop_silent_past_its_bound_is_wedged_unless_busy_or_done() {
        let health = Health::default();
        health.tick("scheduler", Duration::from_millis(20));
        health.tick("worker 0", Duration::from_secs(60));
        assert!(health.wedged().is_empty());
        std::thread::sleep(Duration::from_millis(40));
        let wedged = health.wedged();
        assert_eq!(wedged.len(), 1, "{wedged:?}");
        assert_eq!(wedged[0].name, "scheduler");
        assert!(wedged[0].silent > wedged[0].bound);

        // Running a key of unbounded length is not being wedged.
        health.busy("scheduler", Duration::from_millis(20));
        std::thread::sleep(Duration::from_millis(40));
        assert!(health.wedged().is_empty());

        health.tick("worker 1", Duration::from_millis(1));
        health.done("worker 1");
        std::thread::sleep(Duration::from_millis(5));
        assert!(
            health.wedged().is_empty(),
            "a loop that ended is not judged"
        );
        assert_eq!(health.loops(), vec!["scheduler", "worker 0"]);
    }
}
