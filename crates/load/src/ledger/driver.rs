//! The driver boundary: what a database backend provides so that the
//! ledger's flow ([`super::flow`]) can be written once.
//!
//! A backend supplies
//! - a transaction that runs ledger SQL with neutral arguments ([`Arg`]) and
//!   returns neutral rows ([`Record`]): the type mapping, and nothing else;
//! - its [`Dialect`], which fills in the few SQL fragments the databases
//!   spell differently (the clock, `FOR UPDATE`, `GREATEST`);
//! - the data plane, whose fast paths really differ (SQLite's prepared
//!   single-row statements on the raw handle, PostgreSQL's binary `COPY`):
//!   reading a run key's stored hashes, writing a batch's rows, finding and
//!   removing vanished rows, creating or checking the table.
//!
//! Everything a backend returns is already classified (`tidemark_core::Error`
//! knows whether it is transient).

use std::future::Future;
use std::sync::Arc;

use tidemark_core::spec::OnMissing;
use tidemark_core::Error;

use super::StoredClass;
use crate::durable::Durable;
use crate::schema::TableSchema;
use crate::stored::StoredHashes;
use crate::writer::{BatchOutcome, BatchWrite, Lineage, Stamp, StoredRow};

/// How a database spells the few things ledger SQL cannot write alike.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Dialect {
    /// PostgreSQL: `timestamptz` columns, row locks.
    Postgres,
    /// SQLite: times as RFC 3339 text (UTC, milliseconds), one writer.
    Sqlite,
}

/// One value bound to a ledger statement (`$1`, `$2`, ...: both databases
/// read numbered parameters).
#[derive(Debug, Clone, Copy)]
pub(crate) enum Arg<'a> {
    Int(i64),
    /// An integer or NULL (`rows_expected`).
    OptInt(Option<i64>),
    Float(f64),
    Bool(bool),
    Text(&'a str),
    OptText(Option<&'a str>),
    Bytes(&'a [u8]),
    /// A JSON document (`jsonb` on PostgreSQL, text on SQLite).
    Json(Option<&'a serde_json::Value>),
}

/// One value read from a ledger row.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Cell {
    Null,
    Int(i64),
    Float(f64),
    /// Text; times arrive as RFC 3339 text in UTC with milliseconds on
    /// every backend.
    Text(String),
    Bytes(Vec<u8>),
    Json(serde_json::Value),
}

/// One row read by ledger SQL, its cells addressed by column name.
#[derive(Debug, Clone)]
pub(crate) struct Record {
    names: Arc<[String]>,
    cells: Vec<Cell>,
}

impl Record {
    pub(crate) fn new(names: Arc<[String]>, cells: Vec<Cell>) -> Record {
        Record { names, cells }
    }

    fn cell(&self, name: &str) -> Result<&Cell, Error> {
        self.names
            .iter()
            .position(|n| n == name)
            .and_then(|i| self.cells.get(i))
            .ok_or_else(|| corrupt(name, "is missing from the ledger query"))
    }

    pub(crate) fn opt_int(&self, name: &str) -> Result<Option<i64>, Error> {
        match self.cell(name)? {
            Cell::Null => Ok(None),
            Cell::Int(n) => Ok(Some(*n)),
            other => Err(corrupt(name, &format!("holds {other:?}, not an integer"))),
        }
    }

    pub(crate) fn int(&self, name: &str) -> Result<i64, Error> {
        self.opt_int(name)?
            .ok_or_else(|| corrupt(name, "is NULL, not an integer"))
    }

    /// A number as a float (SQLite may hand back an integer for a sum).
    #[allow(clippy::cast_precision_loss)] // counts and seconds, far below 2^53
    pub(crate) fn opt_float(&self, name: &str) -> Result<Option<f64>, Error> {
        match self.cell(name)? {
            Cell::Null => Ok(None),
            Cell::Float(f) => Ok(Some(*f)),
            Cell::Int(n) => Ok(Some(*n as f64)),
            other => Err(corrupt(name, &format!("holds {other:?}, not a number"))),
        }
    }

    pub(crate) fn float(&self, name: &str) -> Result<f64, Error> {
        self.opt_float(name)?
            .ok_or_else(|| corrupt(name, "is NULL, not a number"))
    }

    pub(crate) fn opt_text(&self, name: &str) -> Result<Option<String>, Error> {
        match self.cell(name)? {
            Cell::Null => Ok(None),
            Cell::Text(s) => Ok(Some(s.clone())),
            other => Err(corrupt(name, &format!("holds {other:?}, not text"))),
        }
    }

    pub(crate) fn text(&self, name: &str) -> Result<String, Error> {
        self.opt_text(name)?
            .ok_or_else(|| corrupt(name, "is NULL, not text"))
    }

    /// A state column, parsed into its enum.
    pub(crate) fn state<S: std::str::FromStr<Err = super::UnknownState>>(
        &self,
        name: &str,
    ) -> Result<S, Error> {
        self.text(name)?
            .parse()
            .map_err(|e: super::UnknownState| corrupt(name, &e.to_string()))
    }

    /// An `error_class` column, parsed. A name no [`StoredClass`] spells
    /// is an invariant error naming it: tidemark never writes one.
    pub(crate) fn opt_class(&self, name: &str) -> Result<Option<StoredClass>, Error> {
        self.opt_text(name)?
            .map(|text| {
                text.parse().map_err(|e: super::UnknownClass| {
                    Error::Invariant(format!(
                        "ledger column `{name}` holds an {e}: not written by this tidemark \
                         (a newer one, or an edit by hand)"
                    ))
                })
            })
            .transpose()
    }

    pub(crate) fn bytes(&self, name: &str) -> Result<Vec<u8>, Error> {
        match self.cell(name)? {
            Cell::Bytes(b) => Ok(b.clone()),
            other => Err(corrupt(name, &format!("holds {other:?}, not bytes"))),
        }
    }

    /// A JSON column: a document on PostgreSQL, its text on SQLite.
    pub(crate) fn json(&self, name: &str) -> Result<Option<serde_json::Value>, Error> {
        match self.cell(name)? {
            Cell::Null => Ok(None),
            Cell::Json(v) => Ok(Some(v.clone())),
            Cell::Text(s) => serde_json::from_str(s)
                .map(Some)
                .map_err(|e| corrupt(name, &format!("is not valid JSON: {e}"))),
            other => Err(corrupt(name, &format!("holds {other:?}, not JSON"))),
        }
    }
}

/// A ledger row that tidemark cannot have written: permanent.
fn corrupt(column: &str, what: &str) -> Error {
    Error::Database {
        message: format!("ledger column `{column}` {what}"),
        transient: false,
    }
}

/// A transaction that runs ledger SQL. Dropping it without [`commit`]
/// rolls back.
///
/// [`commit`]: LedgerTx::commit
pub(crate) trait LedgerTx: Send {
    /// Runs a statement; the number of rows it changed.
    fn execute(
        &mut self,
        sql: &str,
        args: &[Arg<'_>],
    ) -> impl Future<Output = Result<u64, Error>> + Send;

    /// Runs a query and hands each row to `each`, without holding them all.
    fn fetch_each(
        &mut self,
        sql: &str,
        args: &[Arg<'_>],
        each: impl FnMut(Record) -> Result<(), Error> + Send,
    ) -> impl Future<Output = Result<(), Error>> + Send;

    /// Commits.
    fn commit(self) -> impl Future<Output = Result<(), Error>> + Send;

    /// Commits a transaction begun by [`Driver::begin_shared`]: on a
    /// backend that shares commits (SQLite), possibly later, together with
    /// the next periods' ([`Durable`] tells when); elsewhere now.
    fn commit_shared(self) -> impl Future<Output = Result<Durable, Error>> + Send
    where
        Self: Sized,
    {
        async move { self.commit().await.map(|()| Durable::now()) }
    }
}

/// Implements [`LedgerTx`] for a backend's transaction type, which has a
/// `connection()` method, a `persistent()` one (whether statements stay
/// prepared on the connection) and an `async fn commit_now(self)`
/// (PostgreSQL's; SQLite's ledger runs on its raw connection). A backend gives
/// only what differs: its `bind(query, args)` and its `cell(row, index)`
/// (the type mapping); running and streaming are the same for every sqlx
/// database.
macro_rules! sqlx_ledger_tx {
    ($tx:ident, $bind:path, $cell:path) => {
        impl $crate::ledger::driver::LedgerTx for $tx {
            async fn execute(
                &mut self,
                sql: &str,
                args: &[$crate::ledger::driver::Arg<'_>],
            ) -> Result<u64, tidemark_core::Error> {
                use $crate::db_error::DbResultExt as _;
                let done = $bind(sqlx::query(sql).persistent(self.persistent()), args)
                    .execute(self.connection())
                    .await
                    .db()?;
                Ok(done.rows_affected())
            }

            async fn fetch_each(
                &mut self,
                sql: &str,
                args: &[$crate::ledger::driver::Arg<'_>],
                mut each: impl FnMut($crate::ledger::driver::Record) -> Result<(), tidemark_core::Error>
                    + Send,
            ) -> Result<(), tidemark_core::Error> {
                use futures_util::TryStreamExt as _;
                use sqlx::{Column as _, Row as _};
                use $crate::db_error::DbResultExt as _;
                let persistent = self.persistent();
                let mut rows = $bind(sqlx::query(sql).persistent(persistent), args)
                    .fetch(self.connection());
                let mut names: Option<std::sync::Arc<[String]>> = None;
                while let Some(row) = rows.try_next().await.db()? {
                    let names = names.get_or_insert_with(|| {
                        row.columns().iter().map(|c| c.name().to_string()).collect()
                    });
                    let cells = (0..row.len())
                        .map(|i| $cell(&row, i))
                        .collect::<Result<_, _>>()?;
                    each($crate::ledger::driver::Record::new(
                        std::sync::Arc::clone(names),
                        cells,
                    ))?;
                }
                Ok(())
            }

            async fn commit(self) -> Result<(), tidemark_core::Error> {
                self.commit_now().await
            }
        }
    };
}
pub(crate) use sqlx_ledger_tx;

/// The rows of a query, collected.
pub(crate) async fn fetch_all<T: LedgerTx>(
    tx: &mut T,
    sql: &str,
    args: &[Arg<'_>],
) -> Result<Vec<Record>, Error> {
    let mut rows = Vec::new();
    tx.fetch_each(sql, args, |row| {
        rows.push(row);
        Ok(())
    })
    .await?;
    Ok(rows)
}

/// The first row of a query, if any.
pub(crate) async fn fetch_optional<T: LedgerTx>(
    tx: &mut T,
    sql: &str,
    args: &[Arg<'_>],
) -> Result<Option<Record>, Error> {
    Ok(fetch_all(tx, sql, args).await?.into_iter().next())
}

/// The rows of a run key that reconciliation found vanished, in whatever
/// form the backend deletes them by.
pub(crate) trait Vanished: Send {
    /// How many rows.
    fn count(&self) -> usize;
}

impl<T: Send> Vanished for Vec<T> {
    fn count(&self) -> usize {
        self.len()
    }
}

/// A database backend: its ledger transactions, its dialect and its data
/// plane.
pub(crate) trait Driver: Send + Sync {
    /// A transaction on one connection.
    type Tx: LedgerTx;
    /// A batch made ready for [`Driver::write_rows`] before its transaction
    /// begins, so CPU work is not done while holding locks.
    type Prepared: Send + Sync;
    /// What [`Driver::vanished`] finds.
    type Vanished: Vanished + Sync;

    /// The SQL dialect.
    const DIALECT: Dialect;

    /// Begins a transaction that will write. On SQLite it takes the write
    /// lock at once (`BEGIN IMMEDIATE`), waiting on the busy timeout, so it
    /// never fails later on a stale read snapshot.
    fn begin(&self) -> impl Future<Output = Result<Self::Tx, Error>> + Send;

    /// Begins the finishing transaction of a one-batch period whose
    /// commit may be shared with the next such periods (ADR 0022): on
    /// SQLite it joins the shared transaction open on this store, behind a
    /// savepoint of its own. PostgreSQL commits each period at once.
    fn begin_shared(&self) -> impl Future<Output = Result<Self::Tx, Error>> + Send {
        self.begin()
    }

    /// Begins a transaction that only reads: on SQLite it does not keep
    /// writers waiting while it reads.
    fn begin_read(&self) -> impl Future<Output = Result<Self::Tx, Error>> + Send;

    /// Creates the destination table when missing, or checks that the
    /// existing one agrees with the pipeline (a contract error otherwise).
    fn ensure_table(&self, schema: &TableSchema) -> impl Future<Output = Result<(), Error>> + Send;

    /// Hands `each` the key hash, row hash and "written by this run" (when
    /// `run_id` is given) of every live row of the run key, as they stream
    /// in: a period's stored rows are never all held as rows.
    fn stored_rows(
        &self,
        schema: &TableSchema,
        lineage: &Lineage,
        run_id: Option<&str>,
        each: impl FnMut(StoredRow) -> Result<(), Error> + Send,
    ) -> impl Future<Output = Result<(), Error>> + Send;

    /// Encodes or renders a batch's rows for [`Driver::write_rows`].
    fn prepare(
        &self,
        schema: &TableSchema,
        stamp: &Stamp<'_>,
        batch: &BatchWrite<'_>,
    ) -> Result<Self::Prepared, Error>;

    /// Writes a batch's rows inside `tx`.
    fn write_rows(
        &self,
        tx: &mut Self::Tx,
        schema: &TableSchema,
        stamp: &Stamp<'_>,
        batch: &BatchWrite<'_>,
        prepared: &Self::Prepared,
    ) -> impl Future<Output = Result<BatchOutcome, Error>> + Send;

    /// The run key's live row count, and its rows that were there at the
    /// start and that no batch of this run has seen.
    fn vanished(
        &self,
        tx: &mut Self::Tx,
        schema: &TableSchema,
        lineage: &Lineage,
        existing: &StoredHashes,
    ) -> impl Future<Output = Result<(u64, Self::Vanished), Error>> + Send;

    /// Deletes or soft-deletes the vanished rows; how many it changed.
    fn remove_vanished(
        &self,
        tx: &mut Self::Tx,
        schema: &TableSchema,
        lineage: &Lineage,
        on_missing: OnMissing,
        vanished: &Self::Vanished,
    ) -> impl Future<Output = Result<u64, Error>> + Send;
}
