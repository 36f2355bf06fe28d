//! SQLite behind the ledger's driver boundary: how arguments bind, how
//! cells read back, and the data plane on the raw handle.

use sqlx::sqlite::{SqliteArguments, SqliteRow};
use sqlx::{Row as _, Sqlite, Transaction, TypeInfo as _, ValueRef as _};
use tidemark_core::spec::OnMissing;
use tidemark_core::Error;

use super::{raw, table, SqliteStore};
use crate::db_error::DbResultExt;
use crate::ledger::driver::{Arg, Cell, Dialect, Driver};
use crate::schema::TableSchema;
use crate::stored::StoredHashes;
use crate::writer::{BatchOutcome, BatchWrite, Lineage, Stamp, StoredRow};

/// A ledger transaction on one SQLite connection.
pub(crate) struct SqliteTx(Transaction<'static, Sqlite>);

type Query<'q> = sqlx::query::Query<'q, Sqlite, SqliteArguments<'q>>;

/// Binds the arguments: JSON as its text (the columns are TEXT).
fn bind<'q>(mut query: Query<'q>, args: &'q [Arg<'q>]) -> Query<'q> {
    for arg in args {
        query = match *arg {
            Arg::Int(n) => query.bind(n),
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
        Ok(SqliteTx(self.pool.begin().await.db()?))
    }

    async fn ensure_table(&self, schema: &TableSchema) -> Result<(), Error> {
        table::ensure_table(&self.pool, schema).await
    }

    async fn stored_rows(
        &self,
        schema: &TableSchema,
        lineage: &Lineage,
        run_id: Option<&str>,
    ) -> Result<Vec<StoredRow>, Error> {
        let mut conn = self.pool.acquire().await.db()?;
        raw::with_raw(&mut conn, |c| raw::stored_rows(c, schema, lineage, run_id)).await
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
        let written = raw::with_raw(&mut tx.0, |c| {
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
        raw::with_raw(&mut tx.0, |c| {
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
        table::delete_rows(&mut tx.0, schema, on_missing, rowids).await
    }
}
