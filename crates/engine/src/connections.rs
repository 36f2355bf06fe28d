//! How many database connections one process may hold at once, from the
//! work it does at once (ADR 0019). A PostgreSQL server has a fixed number
//! of slots (`max_connections`, 100 by default) shared by every client, so
//! a process opens no more than its work can use together:
//!
//! - **2 per run key at once** (`--workers` of `serve`, `--concurrency` of
//!   `backfill` and `sync`, 1 for `run`): the key's claim and batch
//!   transactions, one at a time, and its lease renewal, which must get a
//!   connection while a long batch holds the first (a renewal that waits
//!   past the lease loses the key);
//! - **2 for the process**: its presence in the ledger's workers (renewed
//!   on a ticker), the planner reading the next page while keys run, the
//!   shared rate buckets of the sources (one take at a time per source) and
//!   `--drain`'s look for work left;
//! - **1 for the scheduler** of `serve` (queuing a fire while workers
//!   run);
//! - **1 for `LISTEN`** (`serve` on PostgreSQL, not behind PgBouncer): held
//!   for the process's life;
//! - **1 for the HTTP endpoints** of `serve --listen` (`/metrics`, the
//!   pages, `/readyz`).
//!
//! Past the size a statement waits for a connection to come back (60 s at
//! most, then a transient error, retried); SQLite ignores it.

use crate::service::ServiceConfig;

/// What one process does at once, from which its connection pool is sized
/// ([`Connections::pool_size`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Connections {
    /// Run keys at once.
    pub keys: usize,
    /// A scheduler queues due periods while workers run.
    pub scheduler: bool,
    /// A connection `LISTEN`s for queued keys for the process's life.
    pub listen: bool,
    /// HTTP endpoints read the ledger.
    pub web: bool,
}

impl Connections {
    /// Connections per run key at once: its transaction and its lease
    /// renewal.
    pub const PER_KEY: u32 = 2;

    /// Connections of the process's own loops (presence, planner, rate
    /// buckets, drain).
    pub const PROCESS: u32 = 2;

    /// A command that runs `keys` run keys at once (`run`: 1; `backfill`,
    /// `sync`: `--concurrency`; a command that runs none: 0).
    pub fn runs(keys: usize) -> Connections {
        Connections {
            keys,
            ..Connections::default()
        }
    }

    /// A [`crate::Service`] of `config`, whose store `listen`s for queued
    /// keys (PostgreSQL, not behind PgBouncer), serving HTTP endpoints when
    /// `web`.
    pub fn service(config: &ServiceConfig, listen: bool, web: bool) -> Connections {
        Connections {
            keys: usize::from(config.workers),
            scheduler: config.schedule,
            listen,
            web,
        }
    }

    /// The most connections the process opens:
    /// `2 × keys + 2 (+1 scheduler) (+1 LISTEN) (+1 HTTP)`.
    pub fn pool_size(&self) -> u32 {
        let keys = u32::try_from(self.keys).unwrap_or(u32::MAX / 4);
        Self::PER_KEY
            .saturating_mul(keys)
            .saturating_add(Self::PROCESS)
            .saturating_add(u32::from(self.scheduler))
            .saturating_add(u32::from(self.listen))
            .saturating_add(u32::from(self.web))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pool_fits_the_work_at_once() {
        // `run`, and commands that run no key (mark, cancel, enqueue).
        assert_eq!(Connections::runs(1).pool_size(), 4);
        assert_eq!(Connections::runs(0).pool_size(), 2);
        // `backfill --concurrency 4`.
        assert_eq!(Connections::runs(4).pool_size(), 10);
        // `serve --workers 2`, scheduling and listening; with --listen; and
        // `--no-schedule` behind PgBouncer (no LISTEN).
        let serve = Connections {
            keys: 2,
            scheduler: true,
            listen: true,
            web: false,
        };
        assert_eq!(serve.pool_size(), 8);
        assert_eq!(Connections { web: true, ..serve }.pool_size(), 9);
        assert_eq!(
            Connections {
                scheduler: false,
                listen: false,
                ..serve
            }
            .pool_size(),
            6
        );
        // `serve --workers 64`, everything on.
        let most = Connections {
            keys: 64,
            scheduler: true,
            listen: true,
            web: true,
        };
        assert_eq!(most.pool_size(), 133);
    }
}
