//! The one support module of the end-to-end tests.
//!
//! Every test gets an [`Env`] ([`proc`]): a fresh temporary working
//! directory holding copies of the example pipelines and their sample data
//! (so a test may edit them freely), and a [`TestDb`] ([`db`]): a fresh
//! destination database on the chosen [`Backend`], dropped with the `Env`,
//! also when the test panics ([`pg`]). The real `tidemark` binary runs in
//! that directory with `--database-url` given explicitly and no
//! `TIDEMARK_*` variables inherited from the caller.
//!
//! Database reads go through sqlx and come back as text
//! (`Vec<Vec<Option<String>>>`, every selected expression cast to TEXT), so
//! assertions read the same on both backends; [`norm_decimal`] and
//! [`norm_timestamp`] turn the few values whose text differs (numeric
//! scale, timestamptz rendering) into one canonical form.
//!
//! A test that needs an HTTP source starts the one fake server,
//! [`http::Server`], with a handler; [`files`] reads and edits CSV and
//! pipeline files.
//!
//! [`backend_tests!`] turns one `async fn scenario(backend: Backend)` into a
//! `#[tokio::test]` per backend.

#![allow(dead_code)] // not every test module uses every helper

pub mod db;
pub mod files;
pub mod http;
pub mod pg;
pub mod proc;

use std::path::PathBuf;

pub use db::{norm_decimal, norm_timestamp, Backend, TestDb, DEFAULT_PG_URL};
pub use files::Csv;
pub use proc::{Env, FifoWriter, Out, Running, BIN};

/// The repository root, where the example pipelines live.
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The suite's one way to run a scenario on both databases: one
/// `async fn scenario(backend: Backend)` becomes two `#[tokio::test]`s,
/// `scenario_sqlite` and `scenario_postgres`:
///
/// ```ignore
/// backend_tests! {
///     backfill_loads_january: backfill_loads_january_sqlite, backfill_loads_january_postgres;
/// }
/// ```
///
/// The two names are spelled out because `macro_rules!` cannot build an
/// identifier (that takes a proc macro or the `paste` crate, neither a
/// dependency of the suite); a check at compile time holds them to
/// `SCENARIO_sqlite` and `SCENARIO_postgres`, the names CI logs and issue
/// notes cite. The scenario stays an ordinary function outside the macro,
/// so rustfmt formats it and its doc comment documents both tests.
macro_rules! backend_tests {
    ($($scenario:ident: $sqlite:ident, $postgres:ident;)+) => {$(
        const _: () = assert!(
            $crate::support::same_name(stringify!($sqlite), concat!(stringify!($scenario), "_sqlite"))
                && $crate::support::same_name(stringify!($postgres), concat!(stringify!($scenario), "_postgres")),
            "backend_tests!: the tests of SCENARIO are SCENARIO_sqlite and SCENARIO_postgres"
        );

        #[tokio::test]
        async fn $sqlite() {
            $scenario($crate::support::Backend::Sqlite).await;
        }

        #[tokio::test]
        async fn $postgres() {
            $scenario($crate::support::Backend::Postgres).await;
        }
    )+};
}
pub(crate) use backend_tests;

/// Whether two names are the same, at compile time (for [`backend_tests!`]).
pub const fn same_name(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}
