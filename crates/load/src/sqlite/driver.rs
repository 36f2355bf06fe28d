//! SQLite behind the ledger's driver boundary: its transactions (their
//! statements run in `ledger_sql`) and the data plane on the raw handle.

use sqlx::sqlite::{SqliteConnection, SqlitePool};
use tidemark_core::spec::OnMissing;
use tidemark_core::Error;

use super::ffi::HeldConnection;
use super::{ledger_sql, raw, table, SqliteStore};
use crate::db_error::DbResultExt;
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
/// ([`HeldConnection`]); only a `BEGIN` that has to wait for another
/// writer's lock goes through sqlx ([`begin_on`]), so the wait is spent on
/// sqlx's worker thread, not on the runtime's. Once the lock is taken
/// nothing else waits.
pub(crate) struct SqliteTx {
    conn: HeldConnection,
    open: bool,
}

impl SqliteTx {
    /// Begins on a connection of `pool`, which is closed if beginning
    /// fails (SQLite may have left a transaction on it).
    async fn begin(pool: &SqlitePool, begin: &str) -> Result<SqliteTx, Error> {
        let mut conn = HeldConnection::new(pool.acquire().await.db()?);
        match begin_on(&mut conn, begin).await {
            Ok(()) => Ok(SqliteTx { conn, open: true }),
            Err(e) => {
                conn.close_on_drop();
                Err(e)
            }
        }
    }

    /// The connection for sqlx (table DDL and checks).
    fn connection(&mut self) -> &mut SqliteConnection {
        self.conn.sqlx()
    }

    /// The transaction's raw connection.
    async fn raw(&mut self) -> Result<&rusqlite::Connection, Error> {
        self.conn.raw().await
    }

    async fn commit_now(mut self) -> Result<(), Error> {
        ledger_sql::execute(self.raw().await?, "COMMIT", &[])?;
        self.open = false;
        Ok(())
    }
}

/// Begins on the raw handle when the lock is free at once (no round trip to
/// sqlx's worker), else through sqlx, which waits on its own thread.
async fn begin_on(conn: &mut HeldConnection, begin: &str) -> Result<(), Error> {
    if ledger_sql::try_begin(conn.raw().await?, begin)? {
        return Ok(());
    }
    sqlx::query(begin).execute(conn.sqlx()).await.db()?;
    Ok(())
}

impl Drop for SqliteTx {
    fn drop(&mut self) {
        if self.open {
            self.conn.close_on_drop();
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
        SqliteTx::begin(&self.pool, "BEGIN IMMEDIATE").await
    }

    async fn begin_read(&self) -> Result<SqliteTx, Error> {
        SqliteTx::begin(&self.pool, "BEGIN").await
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
        let mut conn = self.pool.acquire().await.db()?;
        raw::with_raw(&mut conn, |c| {
            raw::stored_rows(c, schema, lineage, run_id, each)
        })
        .await
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
