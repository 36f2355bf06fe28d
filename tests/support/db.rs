//! The destination database of one test, and reads of it that look the
//! same on both backends.
//!
//! Reads go through sqlx and come back as text (`Vec<Vec<Option<String>>>`,
//! every selected expression cast to TEXT), so assertions read the same on
//! SQLite and PostgreSQL; [`norm_decimal`] and [`norm_timestamp`] turn the
//! few values whose text differs (numeric scale, timestamptz rendering)
//! into one canonical form.

use std::path::{Path, PathBuf};
use std::thread;

use sqlx::postgres::PgConnection;
use sqlx::sqlite::{SqliteConnectOptions, SqliteConnection};
use sqlx::{Connection as _, Executor as _, Row as _};

pub use super::pg::{PgDatabase, DEFAULT_PG_URL};

/// The destination database kind a scenario runs against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
}

/// A fresh destination database for one test. A PostgreSQL database is
/// dropped (`WITH (FORCE)`) when this is dropped, a failed test's too
/// ([`PgDatabase`]); a SQLite file lives in the test's temporary folder
/// and goes with it.
#[derive(Debug)]
pub enum TestDb {
    Sqlite { path: PathBuf },
    Postgres(PgDatabase),
}

impl TestDb {
    /// A database for `backend`; SQLite files are created (by tidemark,
    /// not here) inside `dir`.
    pub async fn new(backend: Backend, dir: &Path) -> TestDb {
        match backend {
            Backend::Sqlite => TestDb::sqlite(dir),
            Backend::Postgres => TestDb::Postgres(PgDatabase::create("tm").await),
        }
    }

    /// A SQLite database at `dir/t.db` (created by tidemark, not here):
    /// needs no runtime, for tests that are not async.
    pub fn sqlite(dir: &Path) -> TestDb {
        TestDb::Sqlite {
            path: dir.join("t.db"),
        }
    }

    pub fn backend(&self) -> Backend {
        match self {
            TestDb::Sqlite { .. } => Backend::Sqlite,
            TestDb::Postgres(_) => Backend::Postgres,
        }
    }

    /// The `--database-url` for tidemark.
    pub fn url(&self) -> String {
        match self {
            TestDb::Sqlite { path } => format!("sqlite://{}", path.display()),
            TestDb::Postgres(pg) => pg.url.clone(),
        }
    }

    /// Runs a query; every column must be text (cast with `CAST(x AS TEXT)`,
    /// which both backends understand), or NULL.
    pub async fn rows(&self, sql: &str) -> Vec<Vec<Option<String>>> {
        match self {
            TestDb::Sqlite { path } => {
                assert!(
                    path.exists(),
                    "the SQLite database {} does not exist (query: {sql})",
                    path.display()
                );
                let options = SqliteConnectOptions::new()
                    .filename(path)
                    .create_if_missing(false);
                let mut conn = SqliteConnection::connect_with(&options)
                    .await
                    .unwrap_or_else(|e| panic!("cannot open {}: {e}", path.display()));
                let rows = sqlx::query(sql)
                    .fetch_all(&mut conn)
                    .await
                    .unwrap_or_else(|e| panic!("query failed: {sql}: {e}"));
                let out = rows
                    .iter()
                    .map(|r| (0..r.len()).map(|i| sqlite_text(r, i, sql)).collect())
                    .collect();
                let _ = conn.close().await;
                out
            }
            TestDb::Postgres(PgDatabase { url, .. }) => {
                let mut conn = PgConnection::connect(url)
                    .await
                    .unwrap_or_else(|e| panic!("cannot connect to {url}: {e}"));
                conn.execute("SET TIME ZONE 'UTC'")
                    .await
                    .expect("SET TIME ZONE");
                let rows = sqlx::query(sql)
                    .fetch_all(&mut conn)
                    .await
                    .unwrap_or_else(|e| panic!("query failed: {sql}: {e}"));
                let out = rows
                    .iter()
                    .map(|r| {
                        (0..r.len())
                            .map(|i| {
                                r.try_get::<Option<String>, _>(i).unwrap_or_else(|e| {
                                    panic!("column {i} of {sql} is not text (CAST it): {e}")
                                })
                            })
                            .collect()
                    })
                    .collect();
                let _ = conn.close().await;
                out
            }
        }
    }

    /// [`TestDb::rows`] for a test that is not async: on a runtime of its
    /// own, in a thread of its own (so a caller inside a runtime may use
    /// it too).
    pub fn rows_blocking(&self, sql: &str) -> Vec<Vec<Option<String>>> {
        thread::scope(|scope| {
            scope
                .spawn(|| {
                    tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                        .expect("a runtime for the query")
                        .block_on(self.rows(sql))
                })
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
        })
    }

    /// Every byte of a SQLite database's files (main file, WAL, shared
    /// memory, journal): what a secret must never be found in.
    pub fn sqlite_bytes(&self) -> Vec<u8> {
        let TestDb::Sqlite { path } = self else {
            panic!("sqlite_bytes of a PostgreSQL database");
        };
        let mut bytes = Vec::new();
        for suffix in ["", "-wal", "-shm", "-journal"] {
            let file = PathBuf::from(format!("{}{suffix}", path.display()));
            if let Ok(b) = std::fs::read(&file) {
                bytes.extend(b);
            }
        }
        bytes
    }

    /// Runs one statement that returns no rows (test set-up, fault injection).
    pub async fn execute(&self, sql: &str) {
        match self {
            TestDb::Sqlite { path } => {
                let url = format!("sqlite://{}", path.display());
                let mut conn = sqlx::SqliteConnection::connect(&url)
                    .await
                    .expect("connect");
                sqlx::query(sql)
                    .execute(&mut conn)
                    .await
                    .unwrap_or_else(|e| panic!("{sql}: {e}"));
            }
            TestDb::Postgres(PgDatabase { url, .. }) => {
                let mut conn = PgConnection::connect(url).await.expect("connect");
                sqlx::query(sql)
                    .execute(&mut conn)
                    .await
                    .unwrap_or_else(|e| panic!("{sql}: {e}"));
            }
        }
    }

    /// `SELECT CAST(c AS TEXT), ... <rest>`: `rest` is `FROM ... WHERE ...`.
    pub async fn select(&self, columns: &[&str], rest: &str) -> Vec<Vec<Option<String>>> {
        let list: Vec<String> = columns
            .iter()
            .map(|c| format!("CAST({c} AS TEXT)"))
            .collect();
        self.rows(&format!("SELECT {} {rest}", list.join(", ")))
            .await
    }

    /// `SELECT COUNT(*) <rest>`.
    pub async fn count(&self, rest: &str) -> i64 {
        let rows = self
            .rows(&format!("SELECT CAST(COUNT(*) AS TEXT) {rest}"))
            .await;
        let text = rows[0][0].clone().expect("COUNT(*) is never NULL");
        text.parse().expect("COUNT(*) is a number")
    }

    /// Whether a table exists (the database must exist).
    pub async fn table_exists(&self, table: &str) -> bool {
        let sql = match self {
            TestDb::Sqlite { .. } => {
                format!("SELECT CAST(COUNT(*) AS TEXT) FROM sqlite_master WHERE type = 'table' AND name = '{table}'")
            }
            TestDb::Postgres(_) => format!(
                "SELECT CAST(COUNT(*) AS TEXT) FROM information_schema.tables WHERE table_name = '{table}'"
            ),
        };
        self.rows(&sql).await[0][0].as_deref() != Some("0")
    }

    /// Whether nothing was ever written: no SQLite file, or a PostgreSQL
    /// database without a single table.
    pub async fn untouched(&self) -> bool {
        match self {
            TestDb::Sqlite { path } => !path.exists(),
            TestDb::Postgres(_) => {
                let rows = self
                    .rows(
                        "SELECT CAST(COUNT(*) AS TEXT) FROM information_schema.tables
                         WHERE table_schema NOT IN ('pg_catalog', 'information_schema')",
                    )
                    .await;
                rows[0][0].as_deref() == Some("0")
            }
        }
    }

    /// A SQL condition true when the timestamp-like column `column` holds
    /// the instant `rfc3339`, whether stored as RFC 3339 text (SQLite) or
    /// as `timestamptz` (PostgreSQL).
    pub fn instant_is(&self, column: &str, rfc3339: &str) -> String {
        match self {
            TestDb::Sqlite { .. } => format!("{column} = '{rfc3339}'"),
            TestDb::Postgres(_) => {
                format!("CAST({column} AS timestamptz) = CAST('{rfc3339}' AS timestamptz)")
            }
        }
    }
}

fn sqlite_text(row: &sqlx::sqlite::SqliteRow, i: usize, sql: &str) -> Option<String> {
    if let Ok(v) = row.try_get::<Option<String>, _>(i) {
        return v;
    }
    if let Ok(v) = row.try_get::<Option<i64>, _>(i) {
        return v.map(|v| v.to_string());
    }
    if let Ok(v) = row.try_get::<Option<f64>, _>(i) {
        return v.map(|v| v.to_string());
    }
    panic!("column {i} of {sql} is not text (CAST it)")
}

// ---------------------------------------------------------------------------
// Value normalisation (backend-neutral comparisons)
// ---------------------------------------------------------------------------

/// `10.50`, `10.5` and `10.500` → `10.5`; `12.00` → `12`.
pub fn norm_decimal(text: &str) -> String {
    let t = text.trim();
    if !t.contains('.') || t.contains(['e', 'E']) {
        return t.to_string();
    }
    t.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// Any rendering of an instant (RFC 3339 or PostgreSQL's
/// `2024-01-01 13:25:00+00`) → `2024-01-01T13:25:00Z`.
pub fn norm_timestamp(text: &str) -> String {
    use chrono::{DateTime, SecondsFormat, Utc};
    let parsed = DateTime::parse_from_rfc3339(text)
        .or_else(|_| DateTime::parse_from_str(text, "%Y-%m-%d %H:%M:%S%.f%#z"))
        .unwrap_or_else(|e| panic!("{text:?} is not a timestamp with an offset: {e}"));
    parsed
        .with_timezone(&Utc)
        .to_rfc3339_opts(SecondsFormat::AutoSi, true)
}
