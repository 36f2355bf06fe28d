//! What differs between the databases a SQL source reads, and nothing
//! else: how to connect read-only, the placeholder and identifier quoting,
//! how a read-only (snapshot) transaction begins, how a column's type maps
//! to a [`Cell`], and which errors are worth retrying. The reader
//! (`super`) is one flow over these.

use std::path::Path;
use std::str::FromStr;

use chrono::{DateTime, NaiveDate, NaiveDateTime, Utc};
use futures_util::stream::{BoxStream, StreamExt};
use rust_decimal::Decimal;
use sqlx::mysql::{MySqlConnectOptions, MySqlConnection, MySqlDatabaseError, MySqlRow};
use sqlx::postgres::{PgConnectOptions, PgConnection, PgRow};
use sqlx::sqlite::{SqliteConnectOptions, SqliteConnection, SqliteRow};
use sqlx::{Column, ConnectOptions, Connection, Executor, Row, TypeInfo, ValueRef};

use super::cell::Cell;

/// An open connection to the source database.
pub(crate) enum Db {
    Postgres(PgConnection),
    MySql(MySqlConnection),
    Sqlite(SqliteConnection),
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

/// A row of cells and the result's column names (shared by every row of
/// a statement).
pub(crate) struct SqlRow {
    pub(crate) columns: std::sync::Arc<[String]>,
    pub(crate) cells: Vec<Cell>,
}

impl Db {
    /// Connects to `url`, read-only where the database can say so for the
    /// whole session. A relative SQLite path is read against `base`.
    pub(crate) async fn connect(url: &str, base: &Path) -> Result<Db, Failure> {
        let scheme = url.split(':').next().unwrap_or_default();
        match scheme {
            "postgres" | "postgresql" => {
                let options = PgConnectOptions::from_str(url)
                    .map_err(|e| classify(Dialect::Postgres, e))?
                    .options([("default_transaction_read_only", "on")]);
                let conn = options.connect().await;
                Ok(Db::Postgres(
                    conn.map_err(|e| classify(Dialect::Postgres, e))?,
                ))
            }
            "mysql" | "mariadb" => {
                let url = url.replacen("mariadb:", "mysql:", 1);
                let options =
                    MySqlConnectOptions::from_str(&url).map_err(|e| classify(Dialect::MySql, e))?;
                let conn = options
                    .connect()
                    .await
                    .map_err(|e| classify(Dialect::MySql, e))?;
                let mut db = Db::MySql(conn);
                db.execute("SET SESSION TRANSACTION READ ONLY").await?;
                Ok(db)
            }
            "sqlite" => {
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
                let conn = options.connect().await;
                Ok(Db::Sqlite(conn.map_err(|e| classify(Dialect::Sqlite, e))?))
            }
            _ => Err(Failure::new(
                FailureKind::Config,
                "the URL must start with postgres://, mysql:// (MariaDB too) or sqlite://",
            )),
        }
    }

    fn dialect(&self) -> Dialect {
        match self {
            Db::Postgres(_) => Dialect::Postgres,
            Db::MySql(_) => Dialect::MySql,
            Db::Sqlite(_) => Dialect::Sqlite,
        }
    }

    /// The `n`th (1-based) placeholder of a statement.
    pub(crate) fn placeholder(&self, n: usize) -> String {
        match self {
            Db::Postgres(_) => format!("${n}"),
            Db::MySql(_) | Db::Sqlite(_) => "?".to_string(),
        }
    }

    /// A column name as an identifier.
    pub(crate) fn quote(&self, name: &str) -> String {
        match self {
            Db::MySql(_) => format!("`{}`", name.replace('`', "``")),
            Db::Postgres(_) | Db::Sqlite(_) => format!("\"{}\"", name.replace('"', "\"\"")),
        }
    }

    /// Begins a read-only transaction; a consistent snapshot when the
    /// whole period is read by one statement stream.
    pub(crate) async fn begin(&mut self) -> Result<(), Failure> {
        let statements: &[&str] = match self {
            Db::Postgres(_) => &["BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"],
            Db::MySql(_) => &[
                "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ",
                "START TRANSACTION READ ONLY, WITH CONSISTENT SNAPSHOT",
            ],
            // A deferred transaction reads one snapshot of the file (WAL)
            // from its first read on; the connection is read-only.
            Db::Sqlite(_) => &["BEGIN"],
        };
        for statement in statements {
            self.execute(statement).await?;
        }
        Ok(())
    }

    /// Ends the read-only transaction.
    pub(crate) async fn commit(&mut self) -> Result<(), Failure> {
        self.execute("COMMIT").await
    }

    /// A statement without parameters, sent as text (`Executor::execute`
    /// rather than `raw_sql`, whose future a spawned task cannot prove
    /// `Send` for every lifetime).
    async fn execute(&mut self, statement: &str) -> Result<(), Failure> {
        let dialect = self.dialect();
        let done = match self {
            Db::Postgres(c) => c.execute(statement).await.map(drop),
            Db::MySql(c) => c.execute(statement).await.map(drop),
            Db::Sqlite(c) => c.execute(statement).await.map(drop),
        };
        done.map_err(|e| classify(dialect, e))
    }

    /// The rows of `sql` with `binds`, decoded, as the database streams
    /// them.
    pub(crate) fn fetch<'a>(
        &'a mut self,
        sql: &'a str,
        binds: &'a [Cell],
    ) -> BoxStream<'a, Result<SqlRow, Failure>> {
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
            ($conn:expr, $decode:path, $decimal:tt) => {{
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
                let mut columns: Option<std::sync::Arc<[String]>> = None;
                query
                    .fetch($conn)
                    .map(move |row| {
                        let row = row.map_err(|e| classify(dialect, e))?;
                        let columns = columns
                            .get_or_insert_with(|| {
                                row.columns().iter().map(|c| c.name().to_string()).collect()
                            })
                            .clone();
                        let cells = (0..columns.len())
                            .map(|i| $decode(&row, i))
                            .collect::<Result<Vec<Cell>, Failure>>()?;
                        Ok(SqlRow { columns, cells })
                    })
                    .boxed()
            }};
        }
        match self {
            Db::Postgres(c) => bound!(c, decode_pg, native),
            Db::MySql(c) => bound!(c, decode_mysql, native),
            Db::Sqlite(c) => bound!(c, decode_sqlite, text),
        }
    }

    /// Closes the connection politely (an error here changes nothing).
    pub(crate) async fn close(self) {
        let _ = match self {
            Db::Postgres(c) => c.close().await,
            Db::MySql(c) => c.close().await,
            Db::Sqlite(c) => c.close().await,
        };
    }
}

#[derive(Debug, Clone, Copy)]
enum Dialect {
    Postgres,
    MySql,
    Sqlite,
}

/// A value of a type tidemark does not read.
fn unreadable(column: &str, ty: &str, cast: &str) -> Failure {
    Failure::new(
        FailureKind::Drift,
        format!(
            "column `{column}` has type {ty}, which tidemark does not read (bytes and other \
             types have no [fields] type); cast it in the query, e.g. `{cast}`"
        ),
    )
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

fn decode_pg(row: &PgRow, i: usize) -> Result<Cell, Failure> {
    let column = row.columns()[i].name();
    let ty = row.columns()[i].type_info().name().to_string();
    match ty.as_str() {
        "BOOL" => decoded(column, row.try_get(i), Cell::Bool),
        "INT2" => decoded(column, row.try_get::<Option<i16>, _>(i), |v| {
            Cell::Int(v.into())
        }),
        "INT4" => decoded(column, row.try_get::<Option<i32>, _>(i), |v| {
            Cell::Int(v.into())
        }),
        "INT8" => decoded(column, row.try_get(i), Cell::Int),
        "FLOAT4" => decoded(column, row.try_get::<Option<f32>, _>(i), |v| {
            Cell::Float(v.into())
        }),
        "FLOAT8" => decoded(column, row.try_get(i), Cell::Float),
        "NUMERIC" => decoded(column, row.try_get::<Option<Decimal>, _>(i), Cell::Decimal),
        "TEXT" | "VARCHAR" | "BPCHAR" | "CHAR" | "NAME" => {
            decoded(column, row.try_get(i), Cell::Text)
        }
        "DATE" => decoded(column, row.try_get::<Option<NaiveDate>, _>(i), Cell::Date),
        "TIMESTAMP" => decoded(
            column,
            row.try_get::<Option<NaiveDateTime>, _>(i),
            Cell::Timestamp,
        ),
        "TIMESTAMPTZ" => decoded(
            column,
            row.try_get::<Option<DateTime<Utc>>, _>(i),
            Cell::Timestamptz,
        ),
        "JSON" | "JSONB" => decoded(column, row.try_get(i), Cell::Json),
        _ => Err(unreadable(column, &ty, &format!("{column}::text"))),
    }
}

fn decode_mysql(row: &MySqlRow, i: usize) -> Result<Cell, Failure> {
    let column = row.columns()[i].name();
    let ty = row.columns()[i].type_info().name().to_string();
    match ty.as_str() {
        "BOOLEAN" => decoded(column, row.try_get(i), Cell::Bool),
        "TINYINT" | "SMALLINT" | "INT" | "MEDIUMINT" | "BIGINT" | "YEAR" => {
            decoded(column, row.try_get(i), Cell::Int)
        }
        "TINYINT UNSIGNED" | "SMALLINT UNSIGNED" | "INT UNSIGNED" | "MEDIUMINT UNSIGNED"
        | "BIGINT UNSIGNED" => match row.try_get::<Option<u64>, _>(i) {
            Ok(Some(v)) => i64::try_from(v).map(Cell::Int).map_err(|_| {
                Failure::new(
                    FailureKind::Drift,
                    format!("column `{column}`: {v} does not fit a 64-bit signed int"),
                )
            }),
            other => decoded(column, other.map(|_| None), Cell::Int),
        },
        "FLOAT" => decoded(column, row.try_get::<Option<f32>, _>(i), |v| {
            Cell::Float(v.into())
        }),
        "DOUBLE" => decoded(column, row.try_get(i), Cell::Float),
        "DECIMAL" => decoded(column, row.try_get::<Option<Decimal>, _>(i), Cell::Decimal),
        "DATE" => decoded(column, row.try_get::<Option<NaiveDate>, _>(i), Cell::Date),
        "DATETIME" => decoded(
            column,
            row.try_get::<Option<NaiveDateTime>, _>(i),
            Cell::Timestamp,
        ),
        "TIMESTAMP" => decoded(
            column,
            row.try_get::<Option<DateTime<Utc>>, _>(i),
            Cell::Timestamptz,
        ),
        "JSON" => decoded(column, row.try_get(i), Cell::Json),
        "VARCHAR" | "CHAR" | "TEXT" | "TINYTEXT" | "MEDIUMTEXT" | "LONGTEXT" | "ENUM" | "SET" => {
            decoded(column, row.try_get(i), Cell::Text)
        }
        // Text with a binary collation (MariaDB's JSON is LONGTEXT with
        // utf8mb4_bin) carries the same BINARY flag as bytes, and sqlx does
        // not expose the character set that tells them apart: UTF-8 is read
        // as text, anything else is bytes.
        "BINARY" | "VARBINARY" | "TINYBLOB" | "BLOB" | "MEDIUMBLOB" | "LONGBLOB" => {
            match row.try_get::<Option<Vec<u8>>, _>(i) {
                Ok(Some(bytes)) => String::from_utf8(bytes)
                    .map(Cell::Text)
                    .map_err(|_| unreadable(column, &ty, &format!("HEX({column})"))),
                other => decoded(column, other.map(|_| None), Cell::Text),
            }
        }
        _ => Err(unreadable(column, &ty, &format!("CAST({column} AS CHAR)"))),
    }
}

/// SQLite types values, not columns: each value is read by its own
/// storage class.
fn decode_sqlite(row: &SqliteRow, i: usize) -> Result<Cell, Failure> {
    let column = row.columns()[i].name();
    let ty = match row.try_get_raw(i) {
        Ok(raw) if raw.is_null() => return Ok(Cell::Null),
        Ok(raw) => raw.type_info().name().to_string(),
        Err(e) => return decoded::<i64>(column, Err(e), Cell::Int),
    };
    match ty.as_str() {
        "INTEGER" => decoded(column, row.try_get(i), Cell::Int),
        "REAL" => decoded(column, row.try_get(i), Cell::Float),
        "TEXT" => decoded(column, row.try_get(i), Cell::Text),
        _ => Err(unreadable(column, &ty, &format!("CAST({column} AS TEXT)"))),
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
                Dialect::Postgres | Dialect::MySql => pg_kind(db.code().as_deref().unwrap_or("")),
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
