//! The gate every request of a rate-limited source passes through.
//!
//! Extract sends requests; it does not know who else sends them. On SQLite
//! one process owns the database, and the gate is an in-process bucket
//! (`tidemark_extract::local_gate`). On PostgreSQL any number of processes
//! on any hosts read the same source, so the gate is a bucket row in the
//! ledger database (`tidemark_load`). The binary picks one per source and
//! hands it to the reader; this trait is all the two sides share, so
//! extract never depends on load.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use crate::Error;

/// A boxed future borrowed from the gate (the trait stays object safe
/// without an `async-trait` dependency).
pub type GateFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// One source's rate limit, shared by every reader that holds it.
pub trait RateGate: Send + Sync {
    /// Waits until one more request may be sent now, and counts it.
    ///
    /// A gate that must ask a database fails with that database's error
    /// (transient for I/O and time-outs), never by letting the request
    /// through unlimited.
    fn acquire(&self) -> GateFuture<'_, Result<(), Error>>;

    /// The source asked to be left alone for `delay` (`429`/`503` with
    /// `Retry-After`): no reader of the source sends anything until then.
    /// Pauses only lengthen; an earlier end never shortens a later one.
    fn pause_for(&self, delay: Duration) -> GateFuture<'_, Result<(), Error>>;
}
