//! Shared helpers for the end-to-end tests.
//!
//! Every test gets an [`Env`]: a fresh temporary working directory holding
//! copies of the example pipelines and their sample data (so a test may
//! edit them freely), and a [`TestDb`]: a fresh destination database on the
//! chosen [`Backend`]. The real `tidemark` binary runs in that directory
//! with `--database-url` given explicitly and no `TIDEMARK_*` variables
//! inherited from the caller.
//!
//! Database reads go through sqlx and come back as text
//! (`Vec<Vec<Option<String>>>`, every selected expression cast to TEXT), so
//! assertions read the same on both backends; [`norm_decimal`] and
//! [`norm_timestamp`] turn the few values whose text differs (numeric
//! scale, timestamptz rendering) into one canonical form.
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

/// One `async fn scenario(backend: Backend)` becomes two `#[tokio::test]`s:
///
/// ```ignore
/// backend_tests! {
///     backfill_loads_january: backfill_loads_january_sqlite, backfill_loads_january_postgres;
/// }
/// ```
macro_rules! backend_tests {
    ($($scenario:ident: $sqlite:ident, $postgres:ident;)+) => {$(
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
