//! tidemark's engine: runs a pipeline's periods so that one period run is
//! one effect, however often it runs: it claims the period's run key in
//! the ledger (a lease, fenced), reads the source in batches, types and
//! deduplicates them, commits each batch with its checkpoint, reconciles,
//! and records the outcome; it plans which periods are due, previews a
//! command (dry run), reports what happened (status) and works the ledger
//! as a queue ([`Service`]). It has no command line: the `tidemark` binary
//! is a thin shell over it, and your program can be one too.
//!
//! # Run one period from your tokio main
//!
//! ```no_run
//! use std::sync::Arc;
//! use tidemark_engine::{Engine, Pipeline, Store};
//!
//! #[tokio::main]
//! async fn main() -> Result<(), tidemark_engine::Error> {
//!     let pipeline = Arc::new(Pipeline::load("pipelines/orders.toml".as_ref())?);
//!     let store = Store::connect("sqlite://tidemark.db").await?;
//!     let engine = Engine::builder(store).build();
//!     let period = pipeline.period("2024-01-02")?;
//!     for outcome in engine.run_period(&pipeline, period).await? {
//!         println!("{}: {:?}", outcome.key, outcome.outcome);
//!     }
//!     engine.close().await;
//!     Ok(())
//! }
//! ```
//!
//! A source tidemark does not ship is a pipeline source with
//! `transport = "custom"` and an [`OpenSource`] you register for its id
//! ([`EngineBuilder::source`]); its checkpoints are yours, and a run
//! resumes after a crash from the last one committed, exactly as for the
//! built-in readers (`examples/custom_source.rs`).
//!
//! # What is public
//!
//! [`Engine`], [`Service`], the source traits, [`Clock`], [`Shutdown`], the
//! planning and status types they return, and the pipeline and store types
//! re-exported from the stage crates. Everything else may change; see
//! docs/adr/0017 for what is promised.

#![warn(missing_docs)]

mod catalog;
mod clock;
mod connections;
mod dry_run;
mod engine;
pub mod lineage;
pub mod notices;
pub mod plan;
mod prepare;
mod presence;
mod rate_stats;
mod run;
mod service;
mod shutdown;
pub mod status;
pub mod story;
pub mod web;

pub use catalog::{source_ids, Catalog};
pub use clock::{Clock, ManualClock, ShiftedClock, SystemClock};
pub use connections::Connections;
pub use dry_run::{dry_run, DryLine, Target, ACTIONS};
pub use engine::{Engine, EngineBuilder, KeyOutcome, RunEvent, RunMany, DEFAULT_LEASE_TTL};
pub use notices::{notice_targets, Deliverer, DeliveryOutcome, DeliveryReport, DeliveryTally};
pub use prepare::ABSENT_NOTE;
pub use presence::{Health, Wedged, HEARTBEAT_LOOP};
pub use rate_stats::{rate_stats, RateStat};
pub use run::{Backoff, Outcome, RunFlags};
pub use service::{
    Reloader, Service, ServiceConfig, ServiceEnd, ServiceView, Worked, SCHEDULE_PRIORITY,
};
pub use shutdown::Shutdown;

pub use tidemark_core::{Error, ErrorClass, Period, Pipeline, RunKey};
pub use tidemark_extract::{Batch, BatchSource, Checkpoint, OpenRequest, OpenSource};
pub use tidemark_load::{
    AttemptEntry, HeldKey, History, LedgerEntry, MarkAs, Marked, NoticeKind, OutboxNotice,
    RejectEntry, Store, StoreOptions, WorkerEntry, WorkerId, WorkerKind, WorkerState,
};
