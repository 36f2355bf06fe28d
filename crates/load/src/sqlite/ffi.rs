//! Every raw call into SQLite, in one place: borrowing sqlx's connection
//! handle for rusqlite (held by a transaction and kept between them:
//! [`HeldConnection`]), the WAL commit hook, and the statement that binds
//! texts in place ([`statement`]). `unsafe` is allowed in this module and
//! nowhere else in the workspace; the rest of the SQLite backend uses what
//! it exports through safe signatures.
//!
//! The handle sqlx hands out and the one rusqlite takes are the same C
//! type only while sqlx and rusqlite link the same `libsqlite3-sys`, which
//! the workspace pins (`Cargo.toml`); [`SAME_LIBRARY`] makes the build
//! fail, here, if they ever diverge.
#![allow(unsafe_code)]

mod statement;

use std::ffi::{c_char, c_int, c_void};

use rusqlite::{ffi, Connection};
use sqlx::pool::PoolConnection;
use sqlx::sqlite::LockedSqliteHandle;
use sqlx::{Sqlite, SqliteConnection};
use tidemark_core::Error;

use crate::db_error::DbResultExt;

pub(super) use statement::BorrowingStatement;

/// Compiles only while sqlx's handle type (from the pinned
/// `libsqlite3-sys`) is rusqlite's: a version bump of one without the
/// others stops the build at this line, not in a crash.
const SAME_LIBRARY: fn(*mut libsqlite3_sys::sqlite3) -> *mut ffi::sqlite3 = |handle| handle;

/// Statements a held connection keeps prepared: every ledger statement
/// and a run's stored-rows query, with room to spare (rusqlite's default
/// of 16 is fewer than the ledger has).
const STATEMENT_CACHE: usize = 64;

/// A pooled connection whose raw handle is held from its first raw
/// statement until it goes back to sqlx or to the pool: through a
/// transaction, and between transactions while it is kept
/// (`super::kept::Kept`), so its prepared statements outlive each one.
///
/// Each statement sent through sqlx is a round trip to the connection's
/// worker thread (two thread wake-ups), and so is each borrow of the raw
/// handle. A small period's ledger work is about a dozen short statements
/// in two transactions, and those wake-ups were most of its time (`perf`:
/// 40% of a 2,000-period backfill in the scheduler's context switches).
/// Holding the handle for the rest of the transaction makes every later
/// statement a plain function call.
pub(super) struct HeldConnection {
    // Declared first, so dropped first: the hold ends before the
    // connection goes back to the pool.
    held: Option<Held>,
    conn: Box<PoolConnection<Sqlite>>,
}

struct Held {
    // Dropped before the lock: finalizes the statements it prepared.
    raw: Connection,
    _lock: LockedSqliteHandle<'static>,
}

impl HeldConnection {
    pub(super) fn new(conn: PoolConnection<Sqlite>) -> HeldConnection {
        HeldConnection {
            held: None,
            conn: Box::new(conn),
        }
    }

    /// The connection for sqlx: the raw hold ends first (sqlx's worker
    /// would wait for it forever).
    pub(super) fn sqlx(&mut self) -> &mut SqliteConnection {
        self.held = None;
        &mut self.conn
    }

    /// The raw connection, held until [`HeldConnection::sqlx`] or drop.
    pub(super) async fn raw(&mut self) -> Result<&Connection, Error> {
        let held = match self.held.take() {
            Some(held) => held,
            None => {
                let handle = self.conn.lock_handle().await.db()?;
                // SAFETY: the lock borrows the boxed connection, which does
                // not move and outlives it: `held` is dropped before `conn`
                // (field order) and cleared before any other use of `conn`
                // (`sqlx`, `close_on_drop`), so nothing else touches the
                // connection while the lock exists.
                let mut lock: LockedSqliteHandle<'static> = unsafe { std::mem::transmute(handle) };
                let ptr = SAME_LIBRARY(lock.as_raw_handle().as_ptr());
                // SAFETY: only this connection's holder uses the handle
                // while the lock exists, and `from_handle` does not take
                // ownership: dropping `raw` finalizes the statements it
                // prepared and never closes the database.
                let raw = unsafe { Connection::from_handle(ptr) }.db()?;
                raw.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
                Held { raw, _lock: lock }
            }
        };
        Ok(&self.held.insert(held).raw)
    }

    /// The raw connection if it is held already: for a synchronous
    /// rollback where no `await` is possible (a transaction's drop).
    pub(super) fn raw_if_held(&self) -> Option<&Connection> {
        self.held.as_ref().map(|held| &held.raw)
    }

    /// Closes the connection when dropped instead of returning it.
    pub(super) fn close_on_drop(&mut self) {
        self.held = None;
        self.conn.close_on_drop();
    }
}

/// Wakes the background checkpointer when a commit leaves the WAL at
/// `threshold` frames or more; see [`install_wal_hook`].
#[derive(Debug)]
pub(super) struct WalSignal {
    pub(super) threshold: c_int,
    pub(super) notify: tokio::sync::Notify,
}

/// Replaces SQLite's automatic checkpoint on `conn` with a signal to the
/// background checkpointer. The automatic one copies the WAL into the file
/// inside `COMMIT`, on the committing connection, so the run that committed
/// waited for every page of it before it could write its next batch.
pub(super) async fn install_wal_hook(
    conn: &mut SqliteConnection,
    signal: &'static WalSignal,
) -> Result<(), sqlx::Error> {
    let mut handle = conn.lock_handle().await?;
    let raw = handle.as_raw_handle();
    let arg: *const WalSignal = signal;
    // SAFETY: `handle` keeps every other thread off the connection during
    // the call. `signal` lives for the whole program, so the pointer stays
    // valid for every later call of the hook, on whatever thread commits.
    unsafe {
        ffi::sqlite3_wal_hook(
            SAME_LIBRARY(raw.as_ptr()),
            Some(on_wal_commit),
            arg.cast_mut().cast(),
        );
    }
    Ok(())
}

/// SQLite calls this after each commit in WAL mode with the WAL's frame
/// count. It must not fail or block: it only wakes the checkpointer.
unsafe extern "C" fn on_wal_commit(
    arg: *mut c_void,
    _db: *mut ffi::sqlite3,
    _name: *const c_char,
    frames: c_int,
) -> c_int {
    // SAFETY: `arg` is the `&'static WalSignal` given to `install_wal_hook`.
    let signal = unsafe { &*arg.cast::<WalSignal>() };
    if frames >= signal.threshold {
        signal.notify.notify_one();
    }
    ffi::SQLITE_OK
}
