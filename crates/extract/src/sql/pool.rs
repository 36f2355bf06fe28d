//! One small pool of connections per source database per process.
//!
//! Periods of a backfill open one after the other; without a pool each
//! would open (and tear down) a session of its own, twenty sessions for
//! twenty days. The registry keeps one [`Pool`] per rendered URL (for
//! SQLite, also the folder a relative path is read against), sized by the
//! number of periods the engine runs at once: each running period holds
//! one connection at a time, so a period never waits for another's.
//! Connections are opened when needed and closed after sitting idle
//! (`dialect::IDLE_TIMEOUT`), so a process between runs holds none.
//!
//! A pool's connections and maintenance task belong to the tokio runtime
//! that made it, so the key also names the runtime: a program (or a test
//! binary) that runs several runtimes gets a pool in each.
//!
//! The key holds the URL's password, but only in memory: it is never shown.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{LazyLock, Mutex, PoisonError};
use std::time::Duration;

use tokio::runtime::{Handle, Id};

use super::dialect::{Failure, Pool};

/// A pool's identity: the runtime, the rendered URL, and for SQLite the
/// folder a relative path is read against.
type Key = (Id, String, PathBuf);

/// How long [`close_pools`] waits for connections still in use to come
/// back: a reader somebody forgot to drop must not hang a process's exit.
const CLOSE_WAIT: Duration = Duration::from_secs(5);

static POOLS: LazyLock<Mutex<HashMap<Key, Pool>>> = LazyLock::new(Mutex::default);

/// The pool of `url`, of at least `at_once` connections. A pool made
/// smaller (an earlier caller ran fewer periods at once) is replaced by a
/// larger one; the old one closes as its connections come back.
pub(crate) fn pool_for(url: &str, base: &Path, at_once: usize) -> Result<Pool, Failure> {
    let size = u32::try_from(at_once.max(1)).unwrap_or(u32::MAX);
    let base = match url.starts_with("sqlite:") {
        true => base.to_path_buf(),
        false => PathBuf::new(),
    };
    let key = (Handle::current().id(), url.to_string(), base);
    let mut pools = POOLS.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(pool) = pools.get(&key).filter(|pool| pool.size() >= size) {
        return Ok(pool.clone());
    }
    let pool = Pool::new(url, &key.2, size)?;
    if let Some(old) = pools.insert(key, pool.clone()) {
        tokio::spawn(async move { old.close().await });
    }
    Ok(pool)
}

/// Closes the SQL sources' pools of this runtime, politely (each session
/// ends with the protocol's goodbye rather than a dropped socket); a
/// program calls it before it exits (`Engine::close` does). A connection
/// still in use is closed when it comes back, waited for 5 s at most. A
/// later read opens new pools.
pub async fn close_pools() {
    let runtime = Handle::current().id();
    let pools: Vec<Pool> = {
        let mut all = POOLS.lock().unwrap_or_else(PoisonError::into_inner);
        let ours: Vec<Key> = all.keys().filter(|k| k.0 == runtime).cloned().collect();
        ours.iter().filter_map(|k| all.remove(k)).collect()
    };
    let closing = pools.iter().map(|pool| pool.close());
    let _ = tokio::time::timeout(CLOSE_WAIT, futures_util::future::join_all(closing)).await;
}
