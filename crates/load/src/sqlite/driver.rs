//! SQLite behind the ledger's driver boundary: its transactions (their
//! statements run in `ledger_sql`) and the data plane on the raw handle.

use std::sync::Arc;
use std::time::Duration;

use sqlx::sqlite::SqliteConnection;
use tidemark_core::spec::OnMissing;
use tidemark_core::Error;

use super::ffi::HeldConnection;
use super::kept::Kept;
use super::{ledger_sql, raw, table, SqliteStore, BUSY_TIMEOUT};
use crate::ledger::driver::{Arg, Dialect, Driver, LedgerTx, Record};
use crate::schema::TableSchema;
use crate::stored::StoredHashes;
use crate::writer::{BatchOutcome, BatchWrite, Lineage, Stamp, StoredRow};

/// A transaction on one SQLite connection, begun and ended by tidemark
/// itself rather than by sqlx's `Transaction`: after a failed statement or
/// `COMMIT` (a full disk, an I/O error) SQLite may or may not have rolled
/// the transaction back, and sqlx's count of open transactions then no
/// longer matches the connection; handed back to the pool, such a
/// connection went on holding the write lock (every other writer waited
/// 60 s) or ran later statements outside any transaction. A transaction
/// that is not committed therefore closes its connection instead of
/// returning it: SQLite rolls back what is left at once.
///
/// Its statements run on the connection's held raw handle
/// ([`HeldConnection`]), and a committed transaction leaves the connection,
/// still held and with its statements prepared, to the next one
/// ([`Kept`]). A `BEGIN` that finds another writer's lock taken waits on
/// the runtime's timer, not on a thread ([`begin_on`]).
pub(crate) struct SqliteTx {
    /// `None` once committed.
    conn: Option<HeldConnection>,
    kept: Arc<Kept>,
}

impl SqliteTx {
    /// Begins on a kept connection or one of `pool`, which is closed if
    /// beginning fails (SQLite may have left a transaction on it).
    async fn begin(store: &SqliteStore, begin: &str) -> Result<SqliteTx, Error> {
        let mut conn = store.kept.take(&store.pool).await?;
        match begin_on(&mut conn, begin).await {
            Ok(()) => Ok(SqliteTx {
                conn: Some(conn),
                kept: Arc::clone(&store.kept),
            }),
            Err(e) => {
                conn.close_on_drop();
                Err(e)
            }
        }
    }

    fn held(&mut self) -> &mut HeldConnection {
        self.conn
            .as_mut()
            .expect("a transaction is used only until it commits")
    }

    /// The connection for sqlx (table DDL and checks).
    fn connection(&mut self) -> &mut SqliteConnection {
        self.held().sqlx()
    }

    /// The transaction's raw connection.
    async fn raw(&mut self) -> Result<&rusqlite::Connection, Error> {
        self.held().raw().await
    }

    async fn commit_now(mut self) -> Result<(), Error> {
        ledger_sql::execute(self.raw().await?, "COMMIT", &[])?;
        if let Some(conn) = self.conn.take() {
            self.kept.keep(conn);
        }
        Ok(())
    }
}

/// The longest pause between two tries of a `BEGIN` that found the write
/// lock taken. SQLite's own busy handler, which this replaces for `BEGIN`,
/// sleeps 1 ms growing to 100 ms; a shorter ceiling notices a short
/// transaction's end sooner.
const BEGIN_PAUSE_MAX: Duration = Duration::from_millis(20);

/// Begins on the raw handle, trying again after a pause on the runtime's
/// timer while another connection holds the write lock, for as long as
/// the busy timeout. SQLite's busy handler would wait inside the call,
/// holding a runtime thread, and waiting through sqlx instead would end
/// the hold, and with it the connection's prepared statements.
async fn begin_on(conn: &mut HeldConnection, begin: &str) -> Result<(), Error> {
    let deadline = tokio::time::Instant::now() + BUSY_TIMEOUT;
    let mut pause = Duration::from_millis(1);
    while !ledger_sql::try_begin(conn.raw().await?, begin)? {
        if tokio::time::Instant::now() >= deadline {
            return Err(Error::Database {
                message: format!(
                    "database is locked: another connection held the write lock for {} s",
                    BUSY_TIMEOUT.as_secs()
                ),
                transient: true,
            });
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(BEGIN_PAUSE_MAX);
    }
    Ok(())
}

impl Drop for SqliteTx {
    fn drop(&mut self) {
        if let Some(conn) = &mut self.conn {
            conn.close_on_drop();
        }
    }
}

impl LedgerTx for SqliteTx {
    async fn execute(&mut self, sql: &str, args: &[Arg<'_>]) -> Result<u64, Error> {
        ledger_sql::execute(self.raw().await?, sql, args)
    }

    async fn fetch_each(
        &mut self,
        sql: &str,
        args: &[Arg<'_>],
        each: impl FnMut(Record) -> Result<(), Error> + Send,
    ) -> Result<(), Error> {
        ledger_sql::fetch_each(self.raw().await?, sql, args, each)
    }

    async fn commit(self) -> Result<(), Error> {
        self.commit_now().await
    }
}

/// Batches of at least this many rows are written with the runtime told
/// that the thread blocks (`block_in_place`), so the reader one batch ahead
/// and the heartbeat go on elsewhere. A smaller batch takes less time than
/// that hand-over of the worker thread costs.
const BLOCKING_ROWS: usize = 1_000;

impl Driver for SqliteStore {
    type Tx = SqliteTx;
    type Prepared = raw::Rendered;
    type Vanished = Vec<i64>;

    const DIALECT: Dialect = Dialect::Sqlite;

    async fn begin(&self) -> Result<SqliteTx, Error> {
        SqliteTx::begin(self, "BEGIN IMMEDIATE").await
    }

    async fn begin_read(&self) -> Result<SqliteTx, Error> {
        SqliteTx::begin(self, "BEGIN").await
    }

    /// Checks or creates the table on one connection, under the write lock,
    /// so two runs starting together cannot both create it.
    async fn ensure_table(&self, schema: &TableSchema) -> Result<(), Error> {
        let mut tx = self.begin().await?;
        table::ensure_table(tx.connection(), schema).await?;
        tx.commit_now().await
    }

    async fn stored_rows(
        &self,
        schema: &TableSchema,
        lineage: &Lineage,
        run_id: Option<&str>,
        each: impl FnMut(StoredRow) -> Result<(), Error> + Send,
    ) -> Result<(), Error> {
        let mut conn = self.kept.take(&self.pool).await?;
        let raw = conn.raw().await?;
        // A period never loaded (every first backfill) holds nothing: asked
        // on this thread, without the hand-over to a blocking thread that
        // a long read needs (thread wake-ups are most of a tiny period's
        // time, ADR 0022).
        if raw::holds_live_rows(raw, schema, lineage)? {
            raw::blocking(|| raw::stored_rows(raw, schema, lineage, run_id, each))?;
        }
        self.kept.keep(conn);
        Ok(())
    }

    /// Renders decimals, times, JSON and row hashes as the text SQLite
    /// stores, before the write lock is taken: formatting was 5% of a first
    /// backfill, and inside the lock every other period waits for it.
    fn prepare(
        &self,
        _schema: &TableSchema,
        _stamp: &Stamp<'_>,
        batch: &BatchWrite<'_>,
    ) -> Result<raw::Rendered, Error> {
        Ok(raw::Rendered::new(&batch.rows))
    }

    async fn write_rows(
        &self,
        tx: &mut SqliteTx,
        schema: &TableSchema,
        stamp: &Stamp<'_>,
        batch: &BatchWrite<'_>,
        rendered: &raw::Rendered,
    ) -> Result<BatchOutcome, Error> {
        let loaded_at = crate::timestamp_text(stamp.loaded_at);
        let stamp = table::Stamp {
            lineage: stamp.lineage,
            run_id: stamp.run_id,
            loaded_at: &loaded_at,
        };
        let conn = tx.raw().await?;
        let write = || raw::write_rows(conn, schema, &stamp, &batch.rows, rendered);
        let written = if batch.rows.len() >= BLOCKING_ROWS {
            raw::blocking(write)?
        } else {
            write()?
        };
        Ok(BatchOutcome {
            written,
            direct_copy_conflict: false,
        })
    }

    async fn vanished(
        &self,
        tx: &mut SqliteTx,
        schema: &TableSchema,
        lineage: &Lineage,
        existing: &StoredHashes,
    ) -> Result<(u64, Vec<i64>), Error> {
        let conn = tx.raw().await?;
        raw::blocking(|| raw::vanished_rows(conn, schema, lineage, existing))
    }

    async fn remove_vanished(
        &self,
        tx: &mut SqliteTx,
        schema: &TableSchema,
        _lineage: &Lineage,
        on_missing: OnMissing,
        rowids: &Vec<i64>,
    ) -> Result<u64, Error> {
        table::delete_rows(tx.connection(), schema, on_missing, rowids).await
    }
}
