//! Connections kept out of the pool between transactions, their raw handle
//! still held, so that the statements prepared on them stay prepared.
//!
//! Preparing was a fifth of a small period's samples (`perf`, 2,000 periods
//! of 5 rows): every transaction borrowed a connection, prepared each
//! ledger statement again and finalized them all when it handed the
//! connection back. sqlx closes a connection it gets back by `sqlite3_close`,
//! which fails (and sqlx panics) while statements of ours are left on it,
//! so a statement cache can only live as long as tidemark holds the
//! connection. A kept connection is therefore never returned to the pool
//! with its hold: [`HeldConnection`] ends the hold (finalizing the cache)
//! before the connection goes back, and [`Kept::release_all`] hands every
//! kept one back before the pool closes.

use std::sync::Mutex;

use sqlx::sqlite::SqlitePool;
use tidemark_core::Error;

use super::ffi::HeldConnection;
use crate::db_error::DbResultExt;

/// At most `capacity` idle connections of one store's pool. The rest of
/// the pool stays free for sqlx's own users (the checkpointer, `close`),
/// which would otherwise wait for a connection that idles here.
pub(super) struct Kept {
    state: Mutex<State>,
    capacity: usize,
}

struct State {
    idle: Vec<HeldConnection>,
    /// Set by [`Kept::release_all`]: a transaction that ends later returns
    /// its connection to the closing pool, which waits for it.
    released: bool,
}

impl Kept {
    pub(super) fn new(capacity: usize) -> Kept {
        Kept {
            state: Mutex::new(State {
                idle: Vec::new(),
                released: false,
            }),
            capacity,
        }
    }

    /// A kept connection, or a new one from the pool.
    pub(super) async fn take(&self, pool: &SqlitePool) -> Result<HeldConnection, Error> {
        if let Some(conn) = self.lock().idle.pop() {
            return Ok(conn);
        }
        Ok(HeldConnection::new(pool.acquire().await.db()?))
    }

    /// Keeps `conn` for the next transaction, or returns it to the pool
    /// when enough are kept or the pool is closing. Only a connection
    /// outside any transaction may be kept.
    pub(super) fn keep(&self, conn: HeldConnection) {
        let mut state = self.lock();
        if !state.released && state.idle.len() < self.capacity {
            state.idle.push(conn);
            return;
        }
        drop(state);
        drop(conn);
    }

    /// Returns every kept connection to the pool, and every one offered
    /// later: a pool closes only once all of its connections are back.
    pub(super) fn release_all(&self) {
        let mut state = self.lock();
        state.released = true;
        let released = std::mem::take(&mut state.idle);
        drop(state);
        drop(released);
    }

    /// How many connections are kept now.
    #[cfg(test)]
    pub(super) fn lock_len(&self) -> usize {
        self.lock().idle.len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // The list holds no invariant a panic could break.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl std::fmt::Debug for Kept {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Kept")
            .field("idle", &self.lock().idle.len())
            .field("capacity", &self.capacity)
            .finish()
    }
}
