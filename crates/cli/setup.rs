//! What every command reads before it touches anything, and the small
//! translations between the command line and the engine (flags in errors).

use std::sync::Arc;

use tidemark_core::{Error, Period, Pipeline};
use tidemark_engine::{Catalog, Clock, Connections, Engine, Shutdown};
use tidemark_load::{Store, StoreOptions};

use crate::cli::Global;

/// What every command reads before it touches anything: the clock that
/// decides what is due (`TIDEMARK_NOW`, or the system's) and the folder
/// pipeline names are looked up in.
pub struct Setup<'a> {
    pub global: &'a Global,
    pub clock: Arc<dyn Clock>,
    pub catalog: Catalog,
}

impl Setup<'_> {
    /// Loads and checks a pipeline without its secrets (`status`,
    /// `cancel`, `backfill --enqueue`).
    pub fn load(&self, name: &str) -> Result<Pipeline, Error> {
        self.catalog.load(name, self.clock.now())
    }

    /// Loads a pipeline that is about to contact its sources: every
    /// `${ENV}` its templates read must be set.
    pub fn load_runnable(&self, name: &str) -> Result<Pipeline, Error> {
        self.catalog.load_runnable(name, self.clock.now())
    }

    /// Loads a pipeline for `run`, `backfill` or `sync`. A dry run contacts
    /// no source, so an unset `${NAME}` does not stop it; it is reported,
    /// because the real command would stop there (exit 2).
    pub fn load_for(&self, name: &str, dry_run: bool) -> Result<Pipeline, Error> {
        if !dry_run {
            return self.load_runnable(name);
        }
        let pipeline = self.load(name)?;
        if let Err(e) = pipeline.check_env() {
            tell!("warning: {e} (without --dry-run the command would stop here, with exit 2)");
        }
        Ok(pipeline)
    }

    /// Opens (creating, migrating) the database `--database-url` names,
    /// with a pool sized for `work` (ADR 0019).
    pub async fn connect(&self, work: Connections) -> Result<Store, Error> {
        Store::connect_with(&self.global.database_url, &self.store_options(work))
            .await
            .map_err(database_url)
    }

    /// Opens the database read-only; `None` when it holds no ledger yet.
    pub async fn open_read_only(&self) -> Result<Option<Store>, Error> {
        let options = self.store_options(Connections::runs(0));
        Store::open_read_only_with(&self.global.database_url, &options)
            .await
            .map_err(database_url)
    }

    /// How the store connects: `work`'s pool size, and `--pgbouncer`.
    fn store_options(&self, work: Connections) -> StoreOptions {
        StoreOptions {
            max_connections: Some(work.pool_size()),
            pgbouncer: self.global.pgbouncer,
        }
    }

    /// The engine over `store` for this command, stopping on `shutdown`.
    pub fn engine(&self, store: Store, shutdown: Shutdown) -> Engine {
        Engine::builder(store)
            .lease_ttl(self.global.lease_ttl)
            .clock(Arc::clone(&self.clock))
            .shutdown(shutdown)
            .build()
    }
}

/// The periods `--from` to `--to` name, both included; the flags are named
/// in the errors.
pub fn range(pipeline: &Pipeline, from: &str, to: &str) -> Result<(Period, Period), Error> {
    pipeline.period_range_named(("--from", from), ("--to", to))
}

/// The sources a command names (`--source`), or all; the flag is named in
/// the error.
pub fn source_ids(pipeline: &Pipeline, only: Option<&str>) -> Result<Vec<String>, Error> {
    tidemark_engine::source_ids(pipeline, only)
        .map_err(|e| crate::exit::flag(e, "source", "--source"))
}

/// The store's errors about the URL, named by the flag that passed it.
fn database_url(error: Error) -> Error {
    crate::exit::flag(error, "database URL", "--database-url")
}
