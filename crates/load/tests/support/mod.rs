//! What the tidemark-load test binaries (`ledger`, `rate_bucket`) share:
//! a fresh database per test that is dropped with its value, also when the
//! test panics, and [`both_backends!`], which runs one scenario on SQLite
//! and on PostgreSQL.
//!
//! The PostgreSQL part is the end-to-end suite's own file
//! (`tests/support/pg.rs`), included by path: these tests are another
//! crate and cannot import from the root package's tests, and that file
//! needs nothing but sqlx, tokio and uuid. The rest of the end-to-end
//! support (the binary, the working directory, text reads through
//! `TestDb`) is of no use to tests that drive the library through a
//! database URL, so it is not shared.

#![allow(dead_code)] // not every test binary uses every helper

#[path = "../../../../tests/support/pg.rs"]
mod pg;

#[allow(unused_imports)] // `admin_url`: only the ledger tests end sessions
pub use pg::{admin_url, PgDatabase};

/// A fresh database for one test: a SQLite file in a temporary folder, or
/// a PostgreSQL database created on the test server. Both go when this is
/// dropped.
pub struct TestDb {
    /// The database URL to give `Store::connect`.
    pub url: String,
    /// Dropped before the folder (fields drop in order).
    pg: Option<PgDatabase>,
    _dir: tempfile::TempDir,
}

impl TestDb {
    /// A PostgreSQL database if `postgres`, else a SQLite file.
    pub async fn new(postgres: bool) -> TestDb {
        let dir = tempfile::tempdir().expect("temp dir");
        if !postgres {
            return TestDb {
                url: format!("sqlite://{}", dir.path().join("t.db").display()),
                pg: None,
                _dir: dir,
            };
        }
        let pg = PgDatabase::create("tm_load").await;
        TestDb {
            url: pg.url.clone(),
            pg: Some(pg),
            _dir: dir,
        }
    }
}

/// One `async fn scenario(postgres: bool)` per name becomes two tests,
/// `sqlite::scenario` and `postgres::scenario` (the names CI logs cite), on
/// a two-thread runtime: the ledger's concurrency is what they test.
#[allow(unused_macros)] // rate_bucket is PostgreSQL only
macro_rules! both_backends {
    ($($name:ident),* $(,)?) => {
        mod sqlite { $( #[tokio::test(flavor = "multi_thread", worker_threads = 2)] async fn $name() { super::$name(false).await } )* }
        mod postgres { $( #[tokio::test(flavor = "multi_thread", worker_threads = 2)] async fn $name() { super::$name(true).await } )* }
    };
}
#[allow(unused_imports)]
pub(crate) use both_backends;
