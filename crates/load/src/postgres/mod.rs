//! The PostgreSQL backend: production, and the coordinator many workers on
//! many hosts share.
//!
//! Claims lock the run key's ledger row (`INSERT … ON CONFLICT DO NOTHING`,
//! then `SELECT … FOR UPDATE`), so two workers can never both take it.
//! Every batch transaction starts with the fencing `UPDATE` of that row,
//! which also holds its lock until commit: a claim racing a batch waits for
//! the batch, then supersedes the attempt, and the old attempt's next batch
//! finds `attempt` changed and rolls back. Lease times use the database's
//! clock, so hosts with skewed clocks agree.
//!
//! - `driver`: the ledger's type mapping and the data plane behind
//!   [`crate::ledger::driver::Driver`];
//! - `table`, `copy_binary`, `stored_copy`: destination tables, binary
//!   `COPY` of batches, and reading a run key's stored hashes.

mod copy_binary;
pub(crate) mod driver;
mod stored_copy;
mod table;

use std::time::Duration;

use sqlx::postgres::{PgPool, PgPoolOptions};
use tidemark_core::Error;

/// A pool of connections to one PostgreSQL database.
#[derive(Debug, Clone)]
pub(crate) struct PgStore {
    pool: PgPool,
}

impl PgStore {
    pub(crate) async fn connect(url: &str) -> Result<Self, Error> {
        let pool = PgPoolOptions::new()
            .max_connections(16)
            .acquire_timeout(Duration::from_secs(60))
            .connect(url)
            .await
            .map_err(|e| Error::Database {
                message: format!("cannot connect to {}: {e}", crate::redact_url(url)),
                transient: false,
            })?;
        let store = PgStore { pool };
        store.migrate().await?;
        Ok(store)
    }

    pub(crate) async fn close(&self) {
        self.pool.close().await;
    }

    pub(crate) async fn migrate(&self) -> Result<(), Error> {
        sqlx::migrate!("../../migrations/postgres")
            .run(&self.pool)
            .await
            .map_err(|e| Error::Database {
                message: format!("ledger migration failed: {e}"),
                transient: false,
            })
    }
}
