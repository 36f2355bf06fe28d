//! Opening a SQLite file: the pool, the busy retries of start-up, and the
//! background WAL checkpointer.

use std::ffi::c_int;
use std::time::Duration;

use sqlx::sqlite::{SqliteConnectOptions, SqliteConnection, SqlitePool, SqlitePoolOptions};
use tidemark_core::Error;

use super::ffi::{self, WalSignal};
use super::BUSY_TIMEOUT;
use crate::db_error::{db_error, is_sqlite_busy};
use crate::retry_while;

/// How long opening waits for a busy file, as long as the busy timeout.
pub(super) const OPEN_DEADLINE: Duration = Duration::from_secs(60);

/// How long the ledger migration is retried after losing a race.
pub(super) const MIGRATE_DEADLINE: Duration = Duration::from_secs(2);

/// Opens the pool, waiting while another process holds the file.
///
/// The busy timeout covers almost every lock wait, but not one: a file
/// not yet in WAL mode (just created by another `tidemark`) is switched to
/// WAL by a read of its header followed by a write, and SQLite refuses that
/// upgrade at once with `SQLITE_BUSY` when another connection holds the
/// write lock, because waiting inside it could deadlock. Two schedulers and
/// a `status` started together on a new file hit exactly that, so opening
/// is retried with bounded, jittered backoff while the error is a busy one.
pub(super) async fn open_pool(
    options: SqliteConnectOptions,
    wal_signal: &'static WalSignal,
) -> Result<SqlitePool, Error> {
    retry_while(
        "database busy while opening",
        OPEN_DEADLINE,
        is_sqlite_busy,
        || {
            SqlitePoolOptions::new()
                .max_connections(4)
                .acquire_timeout(Duration::from_secs(120))
                .after_connect(move |conn, _| {
                    Box::pin(async move { ffi::install_wal_hook(conn, wal_signal).await })
                })
                .connect_with(options.clone())
        },
    )
    .await
    .map_err(|e| {
        let mut error = db_error(e);
        if let Error::Database { message, .. } | Error::Storage { message } = &mut error {
            *message = format!(
                "cannot open the SQLite database {}: {message}",
                options.get_filename().display()
            );
        }
        error
    })
}

/// One read-only connection (a dry run reads a few ledger rows), without
/// the WAL hook: it never commits a write.
pub(super) async fn open_read_only(options: SqliteConnectOptions) -> Result<SqlitePool, Error> {
    let shown = options.get_filename().display().to_string();
    SqlitePoolOptions::new()
        .max_connections(1)
        .acquire_timeout(Duration::from_secs(120))
        .connect_with(options)
        .await
        .map_err(|e| {
            let mut error = db_error(e);
            if let Error::Database { message, .. } | Error::Storage { message } = &mut error {
                *message = format!("cannot open the SQLite database {shown} read-only: {message}");
            }
            error
        })
}

/// WAL size, in pages, at which a commit wakes the background checkpointer:
/// 80 MB at 8 KiB pages. SQLite's own default of 1,000 pages was measured
/// slower (ADR 0003, decision 5).
pub(super) const WAL_CHECKPOINT_FRAMES: c_int = 10_000;

/// Copies the WAL into the database file on its own connection whenever a
/// commit has left the WAL at [`WAL_CHECKPOINT_FRAMES`] or more, and ends
/// when the pool is closed.
///
/// SQLite's automatic checkpoint ran inside `COMMIT` on the committing
/// connection: the run waited for 80 MB of copying and two `fsync`s before
/// it could write its next batch. Here the run goes on writing while the
/// pages are copied (`PASSIVE`: never waits for, nor blocks, a writer or a
/// reader). A single 1,000,000-row period: 2.85-3.18 s -> 2.51-2.67 s
/// (ADR 0003, decision 16). Wake-ups that arrive during a checkpoint fold
/// into one more pass.
///
/// A passive checkpoint alone never lets the WAL start over while commits
/// follow each other: each pass ends behind the frames committed during
/// it, and SQLite rewinds the WAL only once every frame is copied. Two
/// thousand tiny periods grew it to 352 MB, every commit appending pages
/// the kernel then had to write back (ADR 0022). So each pass ends with a
/// `RESTART` that does not wait ([`restart_without_waiting`]).
pub(super) async fn checkpoint_in_background(pool: SqlitePool, signal: &'static WalSignal) {
    loop {
        signal.notify.notified().await;
        if pool.is_closed() {
            return;
        }
        let Ok(mut conn) = pool.acquire().await else {
            return;
        };
        if let Err(e) = sqlx::query("PRAGMA wal_checkpoint(PASSIVE)")
            .execute(&mut *conn)
            .await
        {
            tracing::debug!(error = %e, "background WAL checkpoint failed");
            continue;
        }
        if let Err(e) = restart_without_waiting(&mut conn).await {
            tracing::debug!(error = %e, "background WAL restart failed");
            // The connection may still have a zero busy timeout: never
            // hand it back to the pool's other users.
            conn.close_on_drop();
        }
    }
}

/// Copies the few frames committed during the passive pass and rewinds the
/// WAL, but only if that costs no waiting: with a zero busy timeout SQLite
/// takes the write lock only when no transaction holds it (otherwise it
/// falls back to a passive pass and reports "busy"), and rewinds only when
/// no reader is still in the WAL. Holding the write lock for the remainder
/// of an already-copied WAL is short, so a writer waits at most for that;
/// the next wake-up tries again when this one was busy.
async fn restart_without_waiting(conn: &mut SqliteConnection) -> Result<(), sqlx::Error> {
    sqlx::query("PRAGMA busy_timeout = 0")
        .execute(&mut *conn)
        .await?;
    let restarted = sqlx::query("PRAGMA wal_checkpoint(RESTART)")
        .execute(&mut *conn)
        .await;
    sqlx::query(&format!(
        "PRAGMA busy_timeout = {}",
        BUSY_TIMEOUT.as_millis()
    ))
    .execute(&mut *conn)
    .await?;
    restarted.map(drop)
}
