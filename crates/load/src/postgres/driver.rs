//! PostgreSQL behind the ledger's driver boundary: how arguments bind, how
//! cells read back, and the data plane (binary `COPY` in, `COPY` out).

use chrono::{DateTime, NaiveDateTime, Utc};
use sqlx::pool::PoolConnection;
use sqlx::postgres::{PgArguments, PgConnection, PgRow};
use sqlx::{Executor as _, Postgres, Row as _, TypeInfo as _, ValueRef as _};
use std::borrow::Cow;
use tidemark_core::spec::OnMissing;
use tidemark_core::{Error, Value};

use super::{stored_copy, table, PgStore};
use crate::db_error::DbResultExt;
use crate::ledger::driver::{Arg, Cell, Dialect, Driver};
use crate::schema::TableSchema;
use crate::stored::StoredHashes;
use crate::writer::{BatchOutcome, BatchWrite, Lineage, Stamp, StoredRow};

/// A ledger transaction on one PostgreSQL connection, with how its store
/// sends statements ([`PgStore::persistent`]), begun and ended by tidemark
/// itself rather than by sqlx's `Transaction`, so that it owns its pool
/// connection and can refuse to hand back one it cannot trust.
///
/// sqlx does not count a `COPY … TO STDOUT` among the answers its
/// connection still owes. A read of stored rows whose future is dropped
/// mid-`COPY` (a run cancelled by a program that embeds the engine) would
/// leave the rest of the data on the connection, which sqlx's
/// `Transaction` rolls back and returns to the pool looking idle: the
/// next statement on it reads that data as its answer and fails (the
/// class of stop 33's bug, there for a read that failed); a `COPY … FROM
/// STDIN` dropped mid-way sends `CopyFail` without counting its answer
/// either. A transaction dropped with a `COPY` not ended
/// ([`PgTx::copy_open`]) closes its connection instead; the
/// server rolls back what is left. Any other transaction that is not
/// committed is rolled back on a task of its own and its connection goes
/// back to the pool (or is closed, if the rollback fails).
pub(crate) struct PgTx {
    /// `None` once committed.
    conn: Option<PoolConnection<Postgres>>,
    persistent: bool,
    /// A `COPY` (out or in) was started and has not ended.
    copy_open: bool,
}

impl PgTx {
    /// A transaction of `store`, begun as its session needs. A connection
    /// whose `BEGIN` failed is closed.
    pub(super) async fn begin(store: &PgStore) -> Result<PgTx, Error> {
        let mut conn = store.acquire().await.db()?;
        if let Err(e) = conn.execute(store.begin_statement()).await {
            conn.close_on_drop();
            return Err(e).db();
        }
        Ok(PgTx {
            conn: Some(conn),
            persistent: store.persistent(),
            copy_open: false,
        })
    }

    pub(super) fn connection(&mut self) -> &mut PgConnection {
        self.conn
            .as_mut()
            .expect("a transaction is used only until it commits")
    }

    /// Marks a `COPY` started (`true`) or ended (`false`): a transaction
    /// dropped in between closes its connection.
    pub(super) fn copy_open(&mut self, open: bool) {
        self.copy_open = open;
    }

    /// Whether statements are kept prepared on the connection (not behind
    /// PgBouncer in transaction mode).
    pub(super) fn persistent(&self) -> bool {
        self.persistent
    }

    /// `sqlx::query(sql)`, prepared as the store sends statements.
    pub(super) fn query<'q>(&self, sql: &'q str) -> Query<'q> {
        sqlx::query(sql).persistent(self.persistent)
    }

    /// `sqlx::query_as(sql)`, prepared as the store sends statements.
    pub(super) fn query_as<'q, O>(
        &self,
        sql: &'q str,
    ) -> sqlx::query::QueryAs<'q, Postgres, O, PgArguments>
    where
        O: for<'r> sqlx::FromRow<'r, PgRow>,
    {
        sqlx::query_as(sql).persistent(self.persistent)
    }

    /// `sqlx::query_scalar(sql)`, prepared as the store sends statements.
    pub(super) fn query_scalar<'q, O>(
        &self,
        sql: &'q str,
    ) -> sqlx::query::QueryScalar<'q, Postgres, O, PgArguments>
    where
        (O,): for<'r> sqlx::FromRow<'r, PgRow>,
    {
        sqlx::query_scalar(sql).persistent(self.persistent)
    }

    /// Commits; a connection whose `COMMIT` failed is closed.
    pub(super) async fn commit_now(mut self) -> Result<(), Error> {
        let Some(mut conn) = self.conn.take() else {
            return Ok(());
        };
        match conn.execute("COMMIT").await {
            Ok(_) => Ok(()),
            Err(e) => {
                conn.close_on_drop();
                Err(e).db()
            }
        }
    }
}

impl Drop for PgTx {
    fn drop(&mut self) {
        let Some(mut conn) = self.conn.take() else {
            return;
        };
        if self.copy_open {
            conn.close_on_drop();
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            conn.close_on_drop();
            return;
        };
        runtime.spawn(async move {
            if conn.execute("ROLLBACK").await.is_err() {
                conn.close_on_drop();
            }
        });
    }
}

type Query<'q> = sqlx::query::Query<'q, Postgres, PgArguments>;

/// Binds the arguments. PostgreSQL's `text` and `jsonb` cannot hold U+0000,
/// and a record rejected for holding one (or an error message quoting it)
/// must still be stored: NULs become the six visible characters `\u0000`.
fn bind<'q>(mut query: Query<'q>, args: &'q [Arg<'q>]) -> Query<'q> {
    for arg in args {
        query = match *arg {
            Arg::Int(n) => query.bind(n),
            Arg::OptInt(n) => query.bind(n),
            Arg::Float(f) => query.bind(f),
            Arg::Bool(b) => query.bind(b),
            Arg::Text(s) => query.bind(visible_nul(s).into_owned()),
            Arg::OptText(s) => query.bind(s.map(|s| visible_nul(s).into_owned())),
            Arg::Bytes(b) => query.bind(b),
            Arg::Json(v) => query.bind(v.map(visible_nul_json)),
        };
    }
    query
}

fn visible_nul(text: &str) -> Cow<'_, str> {
    if text.contains('\0') {
        Cow::Owned(text.replace('\0', "\\u0000"))
    } else {
        Cow::Borrowed(text)
    }
}

/// [`visible_nul`] for every string and key of a JSON value.
fn visible_nul_json(value: &serde_json::Value) -> serde_json::Value {
    use serde_json::Value as J;
    match value {
        J::String(s) => J::String(visible_nul(s).into_owned()),
        J::Array(items) => J::Array(items.iter().map(visible_nul_json).collect()),
        J::Object(map) => J::Object(
            map.iter()
                .map(|(k, v)| (visible_nul(k).into_owned(), visible_nul_json(v)))
                .collect(),
        ),
        other => other.clone(),
    }
}

/// Reads a cell by its column's type. Times become the ledger's text form
/// (RFC 3339, UTC, milliseconds), as SQLite stores them.
fn cell(row: &PgRow, i: usize) -> Result<Cell, Error> {
    let raw = row.try_get_raw(i).db()?;
    if raw.is_null() {
        return Ok(Cell::Null);
    }
    let kind = raw.type_info().name().to_string();
    Ok(match kind.as_str() {
        "INT8" => Cell::Int(row.try_get(i).db()?),
        "INT4" => Cell::Int(i64::from(row.try_get::<i32, _>(i).db()?)),
        "INT2" => Cell::Int(i64::from(row.try_get::<i16, _>(i).db()?)),
        "BOOL" => Cell::Int(i64::from(row.try_get::<bool, _>(i).db()?)),
        "FLOAT8" => Cell::Float(row.try_get(i).db()?),
        "BYTEA" => Cell::Bytes(row.try_get(i).db()?),
        "JSONB" | "JSON" => Cell::Json(row.try_get(i).db()?),
        "TIMESTAMPTZ" => Cell::Text(crate::timestamp_text(
            row.try_get::<DateTime<Utc>, _>(i).db()?,
        )),
        "TIMESTAMP" => Cell::Text(crate::timestamp_text(
            row.try_get::<NaiveDateTime, _>(i).db()?.and_utc(),
        )),
        "TEXT" | "VARCHAR" | "BPCHAR" | "NAME" => Cell::Text(row.try_get(i).db()?),
        other => {
            return Err(Error::Database {
                message: format!(
                    "ledger query returned a column of type {other}, which tidemark does not read"
                ),
                transient: false,
            })
        }
    })
}

crate::ledger::driver::sqlx_ledger_tx!(PgTx, bind, cell);

impl Driver for PgStore {
    type Tx = PgTx;
    type Prepared = Vec<u8>;
    type Vanished = Vec<Vec<Value>>;

    const DIALECT: Dialect = Dialect::Postgres;

    async fn begin(&self) -> Result<PgTx, Error> {
        PgTx::begin(self).await
    }

    async fn begin_read(&self) -> Result<PgTx, Error> {
        self.begin().await
    }

    async fn ensure_table(&self, schema: &TableSchema) -> Result<(), Error> {
        table::ensure_table(self, schema).await
    }

    async fn stored_rows(
        &self,
        schema: &TableSchema,
        lineage: &Lineage,
        run_id: Option<&str>,
        each: impl FnMut(StoredRow) -> Result<(), Error> + Send,
    ) -> Result<(), Error> {
        // A period never loaded (every first backfill) holds nothing: one
        // indexed probe instead of the `COPY`'s four round trips.
        if !stored_copy::holds_live_rows(self, schema, lineage).await? {
            return Ok(());
        }
        let mut tx = PgTx::begin(self).await?;
        stored_copy::stored_rows(&mut tx, schema, lineage, run_id, each).await?;
        tx.commit_now().await
    }

    /// Encodes the batch for binary `COPY` before the transaction begins,
    /// so the run row's lock is not held while encoding.
    fn prepare(
        &self,
        schema: &TableSchema,
        stamp: &Stamp<'_>,
        batch: &BatchWrite<'_>,
    ) -> Result<Vec<u8>, Error> {
        if batch.rows.is_empty() {
            return Ok(Vec::new());
        }
        table::copy_data(schema, &batch.rows, stamp)
    }

    async fn write_rows(
        &self,
        tx: &mut PgTx,
        schema: &TableSchema,
        _stamp: &Stamp<'_>,
        batch: &BatchWrite<'_>,
        data: &Vec<u8>,
    ) -> Result<BatchOutcome, Error> {
        table::write_rows(tx, schema, batch, data).await
    }

    async fn vanished(
        &self,
        tx: &mut PgTx,
        schema: &TableSchema,
        lineage: &Lineage,
        existing: &StoredHashes,
    ) -> Result<(u64, Vec<Vec<Value>>), Error> {
        stored_copy::vanished_keys(tx, schema, lineage, existing).await
    }

    async fn remove_vanished(
        &self,
        tx: &mut PgTx,
        schema: &TableSchema,
        lineage: &Lineage,
        on_missing: OnMissing,
        keys: &Vec<Vec<Value>>,
    ) -> Result<u64, Error> {
        table::delete_keys(tx, schema, lineage, on_missing, keys).await
    }
}
