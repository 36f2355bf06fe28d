//! What differs between the databases a SQL source reads, and nothing
//! else: how to connect read-only, the placeholder and identifier quoting,
//! how a read-only (snapshot) transaction begins, how a column's type maps
//! to a [`Cell`], and which errors are worth retrying. The reader
//! (`super`) is one flow over these.

use std::path::Path;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use futures_util::stream::{BoxStream, StreamExt};
use sqlx::mysql::{
    MySql, MySqlConnectOptions, MySqlConnection, MySqlDatabaseError, MySqlPool, MySqlRow,
};
use sqlx::pool::{PoolConnection, PoolOptions};
use sqlx::postgres::{PgConnectOptions, PgPool, PgRow, Postgres};
use sqlx::sqlite::{Sqlite, SqliteConnectOptions, SqlitePool, SqliteRow};
use sqlx::{Column, ConnectOptions, Connection, Executor, Row, TypeInfo, ValueRef};

use rust_decimal::Decimal;

use super::cell::Cell;

/// A pool of connections to one source database, read-only for the
/// whole session where the database can say so ([`super::pool`] keeps one
/// per source database per process).
#[derive(Clone)]
pub(crate) enum Pool {
    Postgres(PgPool),
    MySql(MySqlPool),
    Sqlite(SqlitePool),
}

/// A connection of a [`Pool`], and whether a transaction may be open on
/// it: such a connection is closed when dropped, never handed back to the
/// pool inside its old snapshot (see [`Db::begin`]).
pub(crate) struct Db {
    conn: Conn,
    dirty: bool,
}

enum Conn {
    Postgres(PoolConnection<Postgres>),
    MySql(PoolConnection<MySql>),
    Sqlite(PoolConnection<Sqlite>),
}

/// Why a statement failed, as the database said it: the reader turns it
/// into an [`tidemark_core::Error`] that names the pipeline, source and
/// period.
#[derive(Debug)]
pub(crate) struct Failure {
    /// The class of the failure.
    pub(crate) kind: FailureKind,
    /// The database's message (not yet redacted).
    pub(crate) message: String,
}

/// The classes a database failure falls in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FailureKind {
    /// Connection refused or reset, server shutting down, too many
    /// connections, serialization failure, deadlock: retried.
    Transient,
    /// The query or the URL is wrong: syntax, permission, login, a write
    /// refused in a read-only transaction. Never retried.
    Config,
    /// The source no longer has the shape the pipeline reads: an unknown
    /// table or column, a type tidemark does not read.
    Drift,
    /// Anything else: the source failed and retrying will not help.
    Permanent,
}

impl Failure {
    fn new(kind: FailureKind, message: impl Into<String>) -> Failure {
        Failure {
            kind,
            message: message.into(),
        }
    }
}

/// A row of cells.
pub(crate) struct SqlRow {
    pub(crate) cells: Vec<Cell>,
}

/// A row as the driver gave it, not yet decoded: a [`Layout`] reads it.
pub(crate) enum RawRow {
    Postgres(PgRow),
    MySql(MySqlRow),
    Sqlite(SqliteRow),
}

/// How each column of a result is decoded, decided once from a row of it
/// (PostgreSQL and MySQL type columns, so the type's name is looked at
/// once per column, never per cell) and kept for every row of the same
/// query, chunk after chunk.
pub(crate) struct Layout {
    /// The result's column names.
    pub(crate) columns: Arc<[String]>,
    decoders: Vec<Decoder>,
}

/// What a column's values are read as.
#[derive(Debug, Clone, PartialEq)]
enum Decoder {
    Bool,
    I16,
    I32,
    I64,
    /// MySQL's unsigned integers, refused past `i64::MAX`.
    U64,
    F32,
    F64,
    Decimal,
    Text,
    /// MySQL's binary strings: UTF-8 is text (see [`mysql_decoder`]).
    Bytes,
    Date,
    Timestamp,
    Timestamptz,
    Json,
    /// SQLite: each value by its own storage class.
    ByValue,
    /// A type tidemark does not read: the message its first value gets.
    Unreadable(String),
}

impl Layout {
    /// The layout of `row`'s result.
    pub(crate) fn new(row: &RawRow) -> Layout {
        fn names<R: Row>(row: &R) -> Arc<[String]> {
            row.columns().iter().map(|c| c.name().to_string()).collect()
        }
        let (columns, decoders) = match row {
            RawRow::Postgres(row) => (
                names(row),
                row.columns()
                    .iter()
                    .map(|c| pg_decoder(c.name(), c.type_info().name()))
                    .collect(),
            ),
            RawRow::MySql(row) => (
                names(row),
                row.columns()
                    .iter()
                    .map(|c| mysql_decoder(c.name(), c.type_info().name()))
                    .collect(),
            ),
            RawRow::Sqlite(row) => (names(row), vec![Decoder::ByValue; row.len()]),
        };
        Layout { columns, decoders }
    }

    /// Decodes `row` into `cells`, one per column, reusing the text
    /// buffers a previous row left there.
    pub(crate) fn decode(&self, row: &RawRow, cells: &mut Vec<Cell>) -> Result<(), Failure> {
        let len = match row {
            RawRow::Postgres(r) => r.len(),
            RawRow::MySql(r) => r.len(),
            RawRow::Sqlite(r) => r.len(),
        };
        if len != self.decoders.len() {
            return Err(Failure::new(
                FailureKind::Drift,
                format!(
                    "the result's columns changed mid-period: {len} columns, not the {} of {}",
                    self.decoders.len(),
                    self.columns.join(", ")
                ),
            ));
        }
        cells.resize(len, Cell::Null);
        let columns = self.columns.iter().zip(&self.decoders);
        for (i, ((column, decoder), slot)) in columns.zip(cells.iter_mut()).enumerate() {
            match row {
                RawRow::Postgres(row) => decode_pg(row, i, column, decoder, slot)?,
                RawRow::MySql(row) => decode_mysql(row, i, column, decoder, slot)?,
                RawRow::Sqlite(row) => decode_sqlite(row, i, column, slot)?,
            }
        }
        Ok(())
    }
}

/// How long an acquire waits for a connection before asking the server
/// directly why none came. The engine runs no more periods at once than
/// the pool holds, so a wait this long means the server refused (sqlx's
/// pool retries a refused connect until the timeout and then says only
/// "pool timed out").
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(5);

/// How long a connection may sit unused in the pool before it is closed:
/// a process between runs holds no session on the source.
const IDLE_TIMEOUT: Duration = Duration::from_secs(30);

/// The pool's settings: none opened ahead, at most `size`, idle ones
/// closed, each tested before it is handed out (a server restarted since
/// leaves dead connections behind).
fn pool_options<DB: sqlx::Database>(size: u32) -> PoolOptions<DB> {
    PoolOptions::new()
        .min_connections(0)
        .max_connections(size.max(1))
        .idle_timeout(IDLE_TIMEOUT)
        .acquire_timeout(ACQUIRE_TIMEOUT)
        .test_before_acquire(true)
}

impl Pool {
    /// A pool of at most `size` connections to `url`, each read-only where
    /// the database can say so for the whole session; none is opened
    /// until acquired. A relative SQLite path is read against `base`.
    pub(crate) fn new(url: &str, base: &Path, size: u32) -> Result<Pool, Failure> {
        match scheme(url) {
            Dialect::Postgres => {
                let options = PgConnectOptions::from_str(url)
                    .map_err(|e| classify(Dialect::Postgres, e))?
                    .options([("default_transaction_read_only", "on")]);
                Ok(Pool::Postgres(
                    pool_options(size).connect_lazy_with(options),
                ))
            }
            Dialect::MySql => {
                let url = url.replacen("mariadb:", "mysql:", 1);
                let options =
                    MySqlConnectOptions::from_str(&url).map_err(|e| classify(Dialect::MySql, e))?;
                let pool = pool_options(size)
                    .after_connect(|conn: &mut MySqlConnection, _| {
                        Box::pin(async move {
                            conn.execute("SET SESSION TRANSACTION READ ONLY").await?;
                            Ok(())
                        })
                    })
                    .connect_lazy_with(options);
                Ok(Pool::MySql(pool))
            }
            Dialect::Sqlite => {
                let path = url
                    .trim_start_matches("sqlite:")
                    .trim_start_matches("//")
                    .split('?')
                    .next()
                    .unwrap_or_default();
                // A missing file is an error, never a new empty database.
                let options = SqliteConnectOptions::new()
                    .filename(base.join(path))
                    .read_only(true)
                    .create_if_missing(false)
                    .pragma("query_only", "1");
                Ok(Pool::Sqlite(pool_options(size).connect_lazy_with(options)))
            }
            Dialect::Unknown => Err(Failure::new(
                FailureKind::Config,
                "the URL must start with postgres://, mysql:// (MariaDB too) or sqlite://",
            )),
        }
    }

    /// The most connections the pool holds.
    pub(crate) fn size(&self) -> u32 {
        match self {
            Pool::Postgres(p) => p.options().get_max_connections(),
            Pool::MySql(p) => p.options().get_max_connections(),
            Pool::Sqlite(p) => p.options().get_max_connections(),
        }
    }

    /// A connection of the pool. When none comes in time, one direct
    /// connect says why: the operator sees "connection refused" (still
    /// transient), not the pool's bare "pool timed out".
    pub(crate) async fn acquire(&self) -> Result<Db, Failure> {
        let conn = match self {
            Pool::Postgres(p) => p.acquire().await.map(Conn::Postgres),
            Pool::MySql(p) => p.acquire().await.map(Conn::MySql),
            Pool::Sqlite(p) => p.acquire().await.map(Conn::Sqlite),
        };
        match conn {
            Ok(conn) => Ok(Db { conn, dirty: false }),
            Err(sqlx::Error::PoolTimedOut) => Err(self.why_none_came().await),
            Err(e) => Err(classify(self.dialect(), e)),
        }
    }

    /// After an acquire timed out: the server's own answer to one direct
    /// connect (closed at once, so the pool's bound holds).
    async fn why_none_came(&self) -> Failure {
        let probe = match self {
            Pool::Postgres(p) => probe(&*p.connect_options()).await,
            Pool::MySql(p) => probe(&*p.connect_options()).await,
            Pool::Sqlite(p) => probe(&*p.connect_options()).await,
        };
        match probe {
            Err(e) => {
                let failure = classify(self.dialect(), e);
                let what = match failure.kind {
                    FailureKind::Transient => "the server could not be reached",
                    _ => "the server refused the connection",
                };
                Failure::new(failure.kind, format!("{what}: {}", failure.message))
            }
            Ok(()) => Failure::new(
                FailureKind::Transient,
                format!(
                    "the server answers, but none of the {} pooled connections came free \
                     within {ACQUIRE_TIMEOUT:?} (more periods at once than the pool is sized for)",
                    self.size()
                ),
            ),
        }
    }

    /// Closes the pool: connections in use are closed when released.
    pub(crate) async fn close(&self) {
        match self {
            Pool::Postgres(p) => p.close().await,
            Pool::MySql(p) => p.close().await,
            Pool::Sqlite(p) => p.close().await,
        }
    }

    fn dialect(&self) -> Dialect {
        match self {
            Pool::Postgres(_) => Dialect::Postgres,
            Pool::MySql(_) => Dialect::MySql,
            Pool::Sqlite(_) => Dialect::Sqlite,
        }
    }
}

/// Connects once with `options` and closes the connection again.
async fn probe<O>(options: &O) -> Result<(), sqlx::Error>
where
    O: ConnectOptions,
    O::Connection: Sized,
{
    let conn = options.connect().await?;
    let _ = conn.close().await;
    Ok(())
}

/// The dialect a URL's scheme names.
fn scheme(url: &str) -> Dialect {
    match url.split(':').next().unwrap_or_default() {
        "postgres" | "postgresql" => Dialect::Postgres,
        "mysql" | "mariadb" => Dialect::MySql,
        "sqlite" => Dialect::Sqlite,
        _ => Dialect::Unknown,
    }
}

/// A connection that may be inside a transaction (or whose statement
/// failed) goes back to the pool never: it is closed, and the server rolls
/// back what it held. Otherwise a period aborted mid-chunk (its reader
/// task dropped) would hand the next period a connection still in the old
/// snapshot, whose `BEGIN` PostgreSQL only warns about.
impl Drop for Db {
    fn drop(&mut self) {
        if self.dirty {
            match &mut self.conn {
                Conn::Postgres(c) => c.close_on_drop(),
                Conn::MySql(c) => c.close_on_drop(),
                Conn::Sqlite(c) => c.close_on_drop(),
            }
        }
    }
}

impl Db {
    /// Marks the connection as not to be reused: closed when dropped.
    pub(crate) fn discard(&mut self) {
        self.dirty = true;
    }

    /// The database this connection is to.
    pub(crate) fn dialect(&self) -> Dialect {
        match self.conn {
            Conn::Postgres(_) => Dialect::Postgres,
            Conn::MySql(_) => Dialect::MySql,
            Conn::Sqlite(_) => Dialect::Sqlite,
        }
    }

    /// The `n`th (1-based) placeholder of a statement.
    pub(crate) fn placeholder(&self, n: usize) -> String {
        match self.conn {
            Conn::Postgres(_) => format!("${n}"),
            Conn::MySql(_) | Conn::Sqlite(_) => "?".to_string(),
        }
    }

    /// A column name as an identifier.
    pub(crate) fn quote(&self, name: &str) -> String {
        match self.conn {
            Conn::MySql(_) => format!("`{}`", name.replace('`', "``")),
            Conn::Postgres(_) | Conn::Sqlite(_) => {
                format!("\"{}\"", name.replace('"', "\"\""))
            }
        }
    }

    /// Begins a read-only transaction; a consistent snapshot when the
    /// whole period is read by one statement stream. From here until a
    /// commit succeeds the connection is dirty: dropped, it is closed.
    pub(crate) async fn begin(&mut self) -> Result<(), Failure> {
        self.dirty = true;
        let statements: &[&str] = match self.conn {
            Conn::Postgres(_) => &["BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"],
            Conn::MySql(_) => &[
                "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ",
                "START TRANSACTION READ ONLY, WITH CONSISTENT SNAPSHOT",
            ],
            // A deferred transaction reads one snapshot of the file (WAL)
            // from its first read on; the connection is read-only.
            Conn::Sqlite(_) => &["BEGIN"],
        };
        for statement in statements {
            self.execute(statement).await?;
        }
        Ok(())
    }

    /// Ends the read-only transaction; the connection may go back to the
    /// pool again.
    pub(crate) async fn commit(&mut self) -> Result<(), Failure> {
        self.execute("COMMIT").await?;
        self.dirty = false;
        Ok(())
    }

    /// A statement without parameters, sent as text (`Executor::execute`
    /// rather than `raw_sql`, whose future a spawned task cannot prove
    /// `Send` for every lifetime).
    async fn execute(&mut self, statement: &str) -> Result<(), Failure> {
        let dialect = self.dialect();
        let done = match &mut self.conn {
            Conn::Postgres(c) => c.execute(statement).await.map(drop),
            Conn::MySql(c) => c.execute(statement).await.map(drop),
            Conn::Sqlite(c) => c.execute(statement).await.map(drop),
        };
        done.map_err(|e| classify(dialect, e))
    }

    /// The rows of `sql` with `binds`, decoded, as the database streams
    /// them (a layout per statement: for short results).
    pub(crate) fn fetch<'a>(
        &'a mut self,
        sql: &'a str,
        binds: &'a [Cell],
    ) -> BoxStream<'a, Result<SqlRow, Failure>> {
        let mut layout: Option<Layout> = None;
        self.fetch_raw(sql, binds)
            .map(move |row| {
                let row = row?;
                let layout = layout.get_or_insert_with(|| Layout::new(&row));
                let mut cells = Vec::new();
                layout.decode(&row, &mut cells)?;
                Ok(SqlRow { cells })
            })
            .boxed()
    }

    /// The rows of `sql` with `binds` as the database streams them, for
    /// the caller to decode with a [`Layout`] it keeps.
    pub(crate) fn fetch_raw<'a>(
        &'a mut self,
        sql: &'a str,
        binds: &'a [Cell],
    ) -> BoxStream<'a, Result<RawRow, Failure>> {
        let dialect = self.dialect();
        // SQLite has no decimal type: it gets text.
        macro_rules! decimal {
            (native, $query:expr, $v:expr) => {
                $query.bind(*$v)
            };
            (text, $query:expr, $v:expr) => {
                $query.bind($v.to_string())
            };
        }
        macro_rules! bound {
            ($conn:expr, $raw:path, $decimal:tt) => {{
                let mut query = sqlx::query(sql);
                for cell in binds {
                    query = match cell {
                        Cell::Null => query.bind(None::<i64>),
                        Cell::Int(v) => query.bind(*v),
                        Cell::Float(v) => query.bind(*v),
                        Cell::Decimal(v) => decimal!($decimal, query, v),
                        Cell::Text(v) => query.bind(v.as_str()),
                        Cell::Bool(v) => query.bind(*v),
                        Cell::Date(v) => query.bind(*v),
                        Cell::Timestamp(v) => query.bind(*v),
                        Cell::Timestamptz(v) => query.bind(*v),
                        Cell::Json(v) => query.bind(v.to_string()),
                    };
                }
                query
                    .fetch(&mut **$conn)
                    .map(move |row| row.map($raw).map_err(|e| classify(dialect, e)))
                    .boxed()
            }};
        }
        match &mut self.conn {
            Conn::Postgres(c) => bound!(c, RawRow::Postgres, native),
            Conn::MySql(c) => bound!(c, RawRow::MySql, native),
            Conn::Sqlite(c) => bound!(c, RawRow::Sqlite, text),
        }
    }
}

/// The databases a source URL may name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Dialect {
    Postgres,
    MySql,
    Sqlite,
    /// A scheme tidemark does not read: a configuration error.
    Unknown,
}

/// The decoder of a PostgreSQL column of type `ty`.
fn pg_decoder(column: &str, ty: &str) -> Decoder {
    match ty {
        "BOOL" => Decoder::Bool,
        "INT2" => Decoder::I16,
        "INT4" => Decoder::I32,
        "INT8" => Decoder::I64,
        "FLOAT4" => Decoder::F32,
        "FLOAT8" => Decoder::F64,
        "NUMERIC" => Decoder::Decimal,
        "TEXT" | "VARCHAR" | "BPCHAR" | "CHAR" | "NAME" => Decoder::Text,
        "DATE" => Decoder::Date,
        "TIMESTAMP" => Decoder::Timestamp,
        "TIMESTAMPTZ" => Decoder::Timestamptz,
        "JSON" | "JSONB" => Decoder::Json,
        _ => Decoder::Unreadable(unreadable(column, ty, &format!("{column}::text"))),
    }
}

/// The decoder of a MySQL/MariaDB column of type `ty`.
fn mysql_decoder(column: &str, ty: &str) -> Decoder {
    match ty {
        "BOOLEAN" => Decoder::Bool,
        "TINYINT" | "SMALLINT" | "INT" | "MEDIUMINT" | "BIGINT" | "YEAR" => Decoder::I64,
        "TINYINT UNSIGNED" | "SMALLINT UNSIGNED" | "INT UNSIGNED" | "MEDIUMINT UNSIGNED"
        | "BIGINT UNSIGNED" => Decoder::U64,
        "FLOAT" => Decoder::F32,
        "DOUBLE" => Decoder::F64,
        "DECIMAL" => Decoder::Decimal,
        "DATE" => Decoder::Date,
        "DATETIME" => Decoder::Timestamp,
        "TIMESTAMP" => Decoder::Timestamptz,
        "JSON" => Decoder::Json,
        "VARCHAR" | "CHAR" | "TEXT" | "TINYTEXT" | "MEDIUMTEXT" | "LONGTEXT" | "ENUM" | "SET" => {
            Decoder::Text
        }
        // Text with a binary collation (MariaDB's JSON is LONGTEXT with
        // utf8mb4_bin) carries the same BINARY flag as bytes, and sqlx does
        // not expose the character set that tells them apart: UTF-8 is read
        // as text, anything else is bytes.
        "BINARY" | "VARBINARY" | "TINYBLOB" | "BLOB" | "MEDIUMBLOB" | "LONGBLOB" => Decoder::Bytes,
        _ => Decoder::Unreadable(unreadable(column, ty, &format!("CAST({column} AS CHAR)"))),
    }
}

/// A value of a type tidemark does not read.
fn unreadable(column: &str, ty: &str, cast: &str) -> String {
    format!(
        "column `{column}` has type {ty}, which tidemark does not read (bytes and other \
         types have no [fields] type); cast it in the query, e.g. `{cast}`"
    )
}

/// `value` into `slot`.
fn put<T>(
    slot: &mut Cell,
    column: &str,
    value: Result<Option<T>, sqlx::Error>,
    cell: fn(T) -> Cell,
) -> Result<(), Failure> {
    *slot = decoded(column, value, cell)?;
    Ok(())
}

/// Text into `slot`, into the buffer the slot's previous text left when
/// there is one: no allocation per cell once the first rows are read.
fn put_text(
    slot: &mut Cell,
    column: &str,
    value: Result<Option<&str>, sqlx::Error>,
) -> Result<(), Failure> {
    match (value, &mut *slot) {
        (Ok(Some(text)), Cell::Text(buffer)) => {
            buffer.clear();
            buffer.push_str(text);
        }
        (Ok(Some(text)), _) => *slot = Cell::Text(text.to_owned()),
        (other, _) => put(slot, column, other.map(|_| None::<String>), Cell::Text)?,
    }
    Ok(())
}

fn decoded<T>(
    column: &str,
    value: Result<Option<T>, sqlx::Error>,
    cell: fn(T) -> Cell,
) -> Result<Cell, Failure> {
    match value {
        Ok(Some(v)) => Ok(cell(v)),
        Ok(None) => Ok(Cell::Null),
        Err(e) => Err(Failure::new(
            FailureKind::Drift,
            format!("column `{column}` cannot be read: {e}"),
        )),
    }
}

/// A decoder made for another database's rows: never, as a layout is
/// made from the rows it reads.
fn foreign(column: &str, decoder: &Decoder) -> Failure {
    Failure::new(
        FailureKind::Permanent,
        format!("column `{column}`: no {decoder:?} decoder for this database"),
    )
}

/// A PostgreSQL column, by the decoder its type name chose
/// ([`pg_decoder`]): sqlx's type check before each value (`try_get`) can
/// only agree, and was 4 % of a SQL re-sync's CPU.
fn decode_pg(
    row: &PgRow,
    i: usize,
    column: &str,
    decoder: &Decoder,
    slot: &mut Cell,
) -> Result<(), Failure> {
    match decoder {
        Decoder::Bool => put(slot, column, row.try_get_unchecked(i), Cell::Bool),
        Decoder::I16 => put(
            slot,
            column,
            row.try_get_unchecked::<Option<i16>, _>(i),
            |v| Cell::Int(v.into()),
        ),
        Decoder::I32 => put(
            slot,
            column,
            row.try_get_unchecked::<Option<i32>, _>(i),
            |v| Cell::Int(v.into()),
        ),
        Decoder::I64 => put(slot, column, row.try_get_unchecked(i), Cell::Int),
        Decoder::F32 => put(
            slot,
            column,
            row.try_get_unchecked::<Option<f32>, _>(i),
            |v| Cell::Float(v.into()),
        ),
        Decoder::F64 => put(slot, column, row.try_get_unchecked(i), Cell::Float),
        Decoder::Decimal => put_pg_decimal(slot, column, row, i),
        Decoder::Text => put_text(slot, column, row.try_get_unchecked(i)),
        Decoder::Date => put(slot, column, row.try_get_unchecked(i), Cell::Date),
        Decoder::Timestamp => put(slot, column, row.try_get_unchecked(i), Cell::Timestamp),
        Decoder::Timestamptz => put(slot, column, row.try_get_unchecked(i), Cell::Timestamptz),
        Decoder::Json => put(slot, column, row.try_get_unchecked(i), Cell::Json),
        Decoder::Unreadable(message) => Err(Failure::new(FailureKind::Drift, message.clone())),
        Decoder::U64 | Decoder::Bytes | Decoder::ByValue => Err(foreign(column, decoder)),
    }
}

/// A `numeric` value: [`pg_numeric`] where it applies, else sqlx's
/// decoder (which rounds past 28 places, and names what it cannot read).
fn put_pg_decimal(slot: &mut Cell, column: &str, row: &PgRow, i: usize) -> Result<(), Failure> {
    let fast = row
        .try_get_raw(i)
        .ok()
        .and_then(|value| match value.is_null() {
            true => Some(Cell::Null),
            false => value
                .as_bytes()
                .ok()
                .and_then(pg_numeric)
                .map(Cell::Decimal),
        });
    match fast {
        Some(cell) => {
            *slot = cell;
            Ok(())
        }
        None => put(slot, column, row.try_get_unchecked(i), Cell::Decimal),
    }
}

/// PostgreSQL's binary `numeric` as the [`Decimal`] sqlx's decoder makes
/// of it (same value, same scale), for values that need no rounding and fit
/// 96 bits; `None` for the rest, which the caller leaves to sqlx. sqlx
/// collects the base-10,000 digits into a vector and adds them up in
/// decimal arithmetic, 5 % of a SQL re-sync's CPU; this is one pass of
/// integer arithmetic over the bytes. The layout: digit count, weight (the
/// power of 10,000 of the first digit), sign, display scale, the digits.
fn pg_numeric(bytes: &[u8]) -> Option<Decimal> {
    let word = |at: usize| -> Option<u16> {
        let pair = bytes.get(at..at + 2)?;
        Some(u16::from_be_bytes([pair[0], pair[1]]))
    };
    let (count, weight, sign, scale) = (word(0)?, word(2)?, word(4)?, word(6)?);
    let negative = match sign {
        0x0000 => false,
        0x4000 => true,
        // NaN, infinities, anything else: sqlx's error.
        _ => return None,
    };
    if count == 0 {
        // sqlx's zero, whatever the display scale.
        return Some(Decimal::ZERO);
    }
    if scale > 28 {
        return None;
    }
    let mut mantissa = 0u128;
    for k in 0..usize::from(count) {
        let digit = word(8 + 2 * k).filter(|d| *d < 10_000)?;
        mantissa = mantissa
            .checked_mul(10_000)?
            .checked_add(u128::from(digit))?;
    }
    // The digits' value is `mantissa` times 10^(4 × (weight + 1 − count));
    // wanted: the value times 10^scale.
    let weight = i32::from(i16::from_be_bytes(weight.to_be_bytes()));
    let shift = 4 * (weight + 1 - i32::from(count)) + i32::from(scale);
    let mantissa = match u32::try_from(shift) {
        Ok(up) => mantissa.checked_mul(10u128.checked_pow(up)?)?,
        Err(_) => {
            let down = 10u128.checked_pow(shift.unsigned_abs())?;
            // Digits past the display scale would need sqlx's rounding.
            (mantissa % down == 0).then_some(mantissa / down)?
        }
    };
    let mantissa = i128::try_from(mantissa).ok()?;
    let signed = if negative { -mantissa } else { mantissa };
    Decimal::try_from_i128_with_scale(signed, u32::from(scale)).ok()
}

fn decode_mysql(
    row: &MySqlRow,
    i: usize,
    column: &str,
    decoder: &Decoder,
    slot: &mut Cell,
) -> Result<(), Failure> {
    match decoder {
        Decoder::Bool => put(slot, column, row.try_get(i), Cell::Bool),
        Decoder::I64 => put(slot, column, row.try_get(i), Cell::Int),
        Decoder::U64 => match row.try_get::<Option<u64>, _>(i) {
            Ok(Some(v)) => {
                *slot = i64::try_from(v).map(Cell::Int).map_err(|_| {
                    Failure::new(
                        FailureKind::Drift,
                        format!("column `{column}`: {v} does not fit a 64-bit signed int"),
                    )
                })?;
                Ok(())
            }
            other => put(slot, column, other.map(|_| None), Cell::Int),
        },
        Decoder::F32 => put(slot, column, row.try_get::<Option<f32>, _>(i), |v| {
            Cell::Float(v.into())
        }),
        Decoder::F64 => put(slot, column, row.try_get(i), Cell::Float),
        Decoder::Decimal => put(slot, column, row.try_get(i), Cell::Decimal),
        Decoder::Date => put(slot, column, row.try_get(i), Cell::Date),
        Decoder::Timestamp => put(slot, column, row.try_get(i), Cell::Timestamp),
        Decoder::Timestamptz => put(slot, column, row.try_get(i), Cell::Timestamptz),
        Decoder::Json => put(slot, column, row.try_get(i), Cell::Json),
        Decoder::Text => put_text(slot, column, row.try_get(i)),
        Decoder::Bytes => match row.try_get::<Option<&[u8]>, _>(i) {
            Ok(Some(bytes)) => match std::str::from_utf8(bytes) {
                Ok(text) => put_text(slot, column, Ok(Some(text))),
                Err(_) => Err(Failure::new(
                    FailureKind::Drift,
                    unreadable(
                        column,
                        row.columns()[i].type_info().name(),
                        &format!("HEX({column})"),
                    ),
                )),
            },
            other => put_text(slot, column, other.map(|_| None)),
        },
        Decoder::Unreadable(message) => Err(Failure::new(FailureKind::Drift, message.clone())),
        Decoder::I16 | Decoder::I32 | Decoder::ByValue => Err(foreign(column, decoder)),
    }
}

/// SQLite types values, not columns: each value is read by its own
/// storage class.
fn decode_sqlite(row: &SqliteRow, i: usize, column: &str, slot: &mut Cell) -> Result<(), Failure> {
    let raw = match row.try_get_raw(i) {
        Ok(raw) if raw.is_null() => {
            *slot = Cell::Null;
            return Ok(());
        }
        Ok(raw) => raw,
        Err(e) => return put::<i64>(slot, column, Err(e), Cell::Int),
    };
    match raw.type_info().name() {
        "INTEGER" => put(slot, column, row.try_get(i), Cell::Int),
        "REAL" => put(slot, column, row.try_get(i), Cell::Float),
        "TEXT" => put_text(slot, column, row.try_get(i)),
        ty => Err(Failure::new(
            FailureKind::Drift,
            unreadable(column, ty, &format!("CAST({column} AS TEXT)")),
        )),
    }
}

/// Classes a driver error where it arises (see [`FailureKind`]).
fn classify(dialect: Dialect, error: sqlx::Error) -> Failure {
    let kind = match &error {
        sqlx::Error::Io(_) | sqlx::Error::PoolTimedOut | sqlx::Error::Protocol(_) => {
            FailureKind::Transient
        }
        sqlx::Error::Configuration(_) | sqlx::Error::Tls(_) => FailureKind::Config,
        sqlx::Error::ColumnDecode { .. } | sqlx::Error::Decode(_) => FailureKind::Drift,
        sqlx::Error::Database(db) => match db.try_downcast_ref::<MySqlDatabaseError>() {
            Some(my) => mysql_kind(my.number()),
            None => match dialect {
                Dialect::Sqlite => sqlite_kind(db.code().as_deref(), db.message()),
                Dialect::Postgres | Dialect::MySql | Dialect::Unknown => {
                    pg_kind(db.code().as_deref().unwrap_or(""))
                }
            },
        },
        _ => FailureKind::Permanent,
    };
    Failure::new(kind, error.to_string())
}

/// PostgreSQL SQLSTATEs.
fn pg_kind(state: &str) -> FailureKind {
    match state {
        // serialization failure, deadlock, too many connections, out of
        // resources, admin/crash shutdown, cannot connect now, cancelled.
        "40001" | "40P01" | "57P01" | "57P02" | "57P03" | "57014" => FailureKind::Transient,
        s if s.starts_with("08") || s.starts_with("53") => FailureKind::Transient,
        // undefined table, undefined column, undefined function.
        "42P01" | "42703" | "42883" => FailureKind::Drift,
        // syntax and access rules, privileges, login, unknown database,
        // a write in a read-only transaction, a feature the query cannot
        // use (a data-modifying WITH inside the keyset wrapper).
        s if s.starts_with("42")
            || s.starts_with("28")
            || s == "3D000"
            || s == "25006"
            || s == "0A000" =>
        {
            FailureKind::Config
        }
        _ => FailureKind::Permanent,
    }
}

/// MySQL/MariaDB error numbers.
fn mysql_kind(number: u16) -> FailureKind {
    match number {
        // too many connections, shutdown, lock wait, deadlock, gone away,
        // lost connection, connection killed, query interrupted.
        1040 | 1053 | 1205 | 1213 | 2006 | 2013 | 1927 | 1317 | 1152 | 1158..=1161 => {
            FailureKind::Transient
        }
        // unknown table, unknown column.
        1146 | 1054 => FailureKind::Drift,
        // syntax, access denied (database, login, table, column), unknown
        // database, a write in a read-only transaction.
        1064 | 1044 | 1045 | 1142 | 1143 | 1049 | 1792 | 1290 => FailureKind::Config,
        _ => FailureKind::Permanent,
    }
}

/// SQLite result codes. Its generic error (1) covers both a syntax error
/// and an unknown table or column; only the message tells them apart.
fn sqlite_kind(code: Option<&str>, message: &str) -> FailureKind {
    let primary = code.and_then(|c| c.parse::<i32>().ok()).map(|c| c & 0xff);
    match primary {
        // busy, locked.
        Some(5 | 6) => FailureKind::Transient,
        Some(1)
            if message.starts_with("no such table") || message.starts_with("no such column") =>
        {
            FailureKind::Drift
        }
        // error (syntax), read-only, authorization, cannot open.
        Some(1 | 8 | 23 | 14) => FailureKind::Config,
        _ => FailureKind::Permanent,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The PostgreSQL test server (as the integration tests find it).
    fn pg_url() -> String {
        std::env::var("TIDEMARK_TEST_DATABASE_URL")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_string())
    }

    /// The server process behind `db`'s session.
    async fn backend(db: &mut Db) -> Cell {
        let row = db.fetch("SELECT pg_backend_pid()::int8", &[]).next().await;
        row.expect("a row").expect("the pid").cells.remove(0)
    }

    /// The fast `numeric` decoder gives exactly sqlx's value and scale
    /// (so a record's text, and its raw hash, do not change), and takes
    /// the common values; NaN, infinities, rounding and values past 96 bits
    /// are left to sqlx.
    #[tokio::test]
    async fn numeric_values_decode_as_sqlx_decodes_them() {
        use sqlx::Connection as _;
        let values = [
            "0",
            "0.00",
            "1",
            "-1",
            "12.5",
            "-12.50",
            "0.0001",
            "-0.000123",
            "9999",
            "10000",
            "10000.0001",
            "123456789012345678.90",
            "79228162514264337593543950335",
            "-79228162514264337593543950335",
            "79228162514264337593543950336",
            "1e-28",
            "1.23e-30",
            "100000000000000000000000000000000",
            "1e20",
            "5.000000",
            "NaN",
            "Infinity",
            "-Infinity",
        ];
        let fast = [
            "0",
            "0.00",
            "1",
            "-12.50",
            "0.0001",
            "10000.0001",
            "123456789012345678.90",
            "1e20",
        ];
        let mut conn = sqlx::PgConnection::connect(&pg_url())
            .await
            .expect("PostgreSQL test server");
        for value in values {
            let row = sqlx::query(&format!("SELECT '{value}'::numeric"))
                .fetch_one(&mut conn)
                .await
                .expect("a numeric");
            let bytes = row
                .try_get_raw(0)
                .expect("a value")
                .as_bytes()
                .expect("bytes")
                .to_vec();
            let ours = pg_numeric(&bytes);
            let theirs = row.try_get::<Decimal, _>(0);
            if let Some(ours) = ours {
                let theirs = theirs.expect("sqlx reads what the fast path reads");
                assert_eq!(ours.to_string(), theirs.to_string(), "{value}");
                assert_eq!(ours.scale(), theirs.scale(), "{value}");
            }
            if fast.contains(&value) {
                assert!(ours.is_some(), "{value} takes the fast path");
            }
        }
        // Bytes that are no numeric are never read as one.
        assert_eq!(pg_numeric(&[0, 1, 0, 0]), None);
        assert_eq!(
            pg_numeric(&[0, 2, 0, 0, 0, 0, 0, 0, 0, 1]),
            None,
            "a digit missing"
        );
        assert_eq!(
            pg_numeric(&[0, 1, 0, 0, 0, 0, 0, 0, 0x27, 0x10]),
            None,
            "a digit of 10,000"
        );
        conn.close().await.expect("close");
    }

    /// A connection whose reader was dropped inside its transaction (an
    /// aborted period) is closed; the next period gets a new session, not
    /// the old snapshot. A committed one goes back to the pool and is
    /// reused.
    #[tokio::test]
    async fn a_connection_dropped_inside_a_transaction_is_never_reused() {
        let pool = Pool::new(&pg_url(), Path::new(""), 1).expect("a pool");
        let mut db = pool.acquire().await.expect("PostgreSQL test server");
        let aborted = backend(&mut db).await;
        db.begin().await.expect("begin");
        drop(db);
        // One connection at most: this waits for the old one to be closed.
        let mut db = pool.acquire().await.expect("a new connection");
        let fresh = backend(&mut db).await;
        assert_ne!(fresh, aborted, "the aborted session came back");
        db.begin().await.expect("begin");
        db.commit().await.expect("commit");
        drop(db);
        let mut db = pool.acquire().await.expect("the pooled connection");
        assert_eq!(backend(&mut db).await, fresh, "a clean session is reused");
        drop(db);
        pool.close().await;
    }

    /// A refused connection is answered with the server's own error after
    /// the pool's wait (transient), never the pool's bare timeout.
    #[tokio::test]
    async fn a_refused_connection_says_so_not_pool_timed_out() {
        let pool =
            Pool::new("postgres://postgres@127.0.0.1:1/none", Path::new(""), 1).expect("a pool");
        let Err(failure) = pool.acquire().await else {
            panic!("nothing listens on port 1");
        };
        assert_eq!(failure.kind, FailureKind::Transient, "{failure:?}");
        assert!(
            failure
                .message
                .starts_with("the server could not be reached")
                && failure.message.contains("refused"),
            "{failure:?}"
        );
    }

    #[test]
    fn postgres_states_are_classed() {
        use FailureKind::*;
        for (state, kind) in [
            ("40001", Transient),
            ("40P01", Transient),
            ("53300", Transient),
            ("57P01", Transient),
            ("08006", Transient),
            ("42P01", Drift),
            ("42703", Drift),
            ("42601", Config),
            ("42501", Config),
            ("28P01", Config),
            ("3D000", Config),
            ("25006", Config),
            ("22012", Permanent),
        ] {
            assert_eq!(pg_kind(state), kind, "{state}");
        }
    }

    #[test]
    fn mysql_numbers_are_classed() {
        use FailureKind::*;
        for (number, kind) in [
            (1040, Transient),
            (1213, Transient),
            (1205, Transient),
            (2013, Transient),
            (1053, Transient),
            (1146, Drift),
            (1054, Drift),
            (1064, Config),
            (1142, Config),
            (1045, Config),
            (1792, Config),
            (1365, Permanent),
        ] {
            assert_eq!(mysql_kind(number), kind, "{number}");
        }
    }

    #[test]
    fn sqlite_codes_are_classed() {
        use FailureKind::*;
        assert_eq!(sqlite_kind(Some("5"), "database is locked"), Transient);
        assert_eq!(sqlite_kind(Some("517"), "database is locked"), Transient);
        assert_eq!(sqlite_kind(Some("1"), "no such column: x"), Drift);
        assert_eq!(sqlite_kind(Some("1"), "no such table: t"), Drift);
        assert_eq!(
            sqlite_kind(Some("1"), "near \"selec\": syntax error"),
            Config
        );
        assert_eq!(
            sqlite_kind(Some("8"), "attempt to write a readonly database"),
            Config
        );
        assert_eq!(sqlite_kind(Some("19"), "constraint failed"), Permanent);
    }
}
