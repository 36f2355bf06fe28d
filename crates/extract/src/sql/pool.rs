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
//! The key holds the URL's password, but only in memory: it is never shown.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{LazyLock, Mutex, PoisonError};

use super::dialect::{Failure, Pool};

/// A pool's identity: the rendered URL, and for SQLite the folder a
/// relative path is read against.
type Key = (String, PathBuf);

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
    let key = (url.to_string(), base);
    let mut pools = POOLS.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(pool) = pools.get(&key).filter(|pool| pool.size() >= size) {
        return Ok(pool.clone());
    }
    let pool = Pool::new(url, &key.1, size)?;
    if let Some(old) = pools.insert(key, pool.clone()) {
        tokio::spawn(async move { old.close().await });
    }
    Ok(pool)
}

/// Closes every pool of the process, politely (each session ends with the
/// protocol's goodbye rather than a dropped socket); a program calls it
/// before it exits. A later read opens new pools.
pub async fn close_pools() {
    let pools: Vec<Pool> = POOLS
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .drain()
        .map(|(_, pool)| pool)
        .collect();
    for pool in pools {
        pool.close().await;
    }
}
