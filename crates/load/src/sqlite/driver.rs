//! SQLite behind the ledger's driver boundary: how arguments bind, how
//! cells read back, and the data plane on the raw handle.

use sqlx::pool::PoolConnection;
use sqlx::sqlite::{SqliteArguments, SqliteConnection, SqlitePool, SqliteRow};
use sqlx::{Row as _, Sqlite, TypeInfo as _, ValueRef as _};
use tidemark_core::spec::OnMissing;
use tidemark_core::Error;

use super::{raw, table, SqliteStore};
use crate::db_error::{db_error, DbResultExt};
use crate::ledger::driver::{Arg, Cell, Dialect, Driver};
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
pub(crate) struct SqliteTx {
    conn: PoolConnection<Sqlite>,
    open: bool,
}

impl SqliteTx {
    async fn begin(pool: &SqlitePool, begin: &str) -> Result<SqliteTx, Error> {
        let mut conn = pool.acquire().await.db()?;
        match sqlx::query(begin).execute(&mut *conn).await {
            Ok(_) => Ok(SqliteTx { conn, open: true }),
            Err(e) => {
                conn.close_on_drop();
                Err(db_error(e))
            }
        }
    }

    fn connection(&mut self) -> &mut SqliteConnection {
        &mut self.conn
    }

    async fn commit_now(mut self) -> Result<(), Error> {
        sqlx::query("COMMIT").execute(&mut *self.conn).await.db()?;
        self.open = false;
        Ok(())
    }
}

impl Drop for SqliteTx {
    fn drop(&mut self) {
        if self.open {
            self.conn.close_on_drop();
        }
    }
}

type Query<'q> = sqlx::query::Query<'q, Sqlite, SqliteArguments<'q>>;

/// Binds the arguments: JSON as its text (the columns are TEXT).
fn bind<'q>(mut query: Query<'q>, args: &'q [Arg<'q>]) -> Query<'q> {
    for arg in args {
        query = match *arg {
            Arg::Int(n) => query.bind(n),
            Arg::OptInt(n) => query.bind(n),
            Arg::Float(f) => query.bind(f),
            Arg::Bool(b) => query.bind(b),
            Arg::Text(s) => query.bind(s),
            Arg::OptText(s) => query.bind(s),
            Arg::Bytes(b) => query.bind(b),
            Arg::Json(v) => query.bind(v.map(serde_json::Value::to_string)),
        };
    }
    query
}

/// Reads a cell by the type of the value stored in it: SQLite's columns
/// are typed by value, not by declaration.
fn cell(row: &SqliteRow, i: usize) -> Result<Cell, Error> {
    let raw = row.try_get_raw(i).db()?;
    if raw.is_null() {
        return Ok(Cell::Null);
    }
    let kind = raw.type_info().name().to_string();
    Ok(match kind.as_str() {
        "INTEGER" | "BOOLEAN" => Cell::Int(row.try_get_unchecked(i).db()?),
        "REAL" => Cell::Float(row.try_get_unchecked(i).db()?),
        "BLOB" => Cell::Bytes(row.try_get_unchecked(i).db()?),
        _ => Cell::Text(row.try_get_unchecked(i).db()?),
    })
}

crate::ledger::driver::sqlx_ledger_tx!(SqliteTx, bind, cell);

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
        let written = raw::with_raw(tx.connection(), |c| {
            raw::write_rows(c, schema, &stamp, &batch.rows, rendered)
        })
        .await?;
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
        raw::with_raw(tx.connection(), |c| {
            raw::vanished_rows(c, schema, lineage, existing)
        })
        .await
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
