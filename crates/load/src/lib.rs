//! tidemark's load stage: destination tables, the run ledger, fenced batch
//! commits and reconciliation.
//!
//! The ledger lives in the destination database. Every batch is one
//! transaction that (1) re-checks that this attempt still holds the run
//! key (fencing), (2) upserts the batch's changed rows, (3) records the
//! batch's natural keys and rejects, and (4) advances the checkpoint. The
//! final reconciliation and the `done` status commit together. So whatever
//! happens between two statements, the database holds either the batch and
//! its checkpoint, or neither.

#![warn(missing_docs)]

mod db_error;
mod durable;
mod ledger;
mod postgres;
mod rate;
mod schema;
mod sqlite;
mod stored;
mod writer;

use std::time::Duration;

use tidemark_core::{Error, RunKey};

use ledger::driver::Driver as _;
use ledger::flow;

pub use durable::Durable;
pub use ledger::preview::{KeyRef, KeyRow, Preview};
pub use ledger::{
    notify_target, Delivered, LineageEvent, NewNotice, NoticeKind, NoticeTargets, NotifyTarget,
    OutboxNotice, LINEAGE_TARGET,
};
pub use ledger::{
    process_is_gone, stale_reason, AttemptEntry, AttemptStatus, Claim, ClaimRequest, ClaimedRun,
    Counts, Enqueue, EnqueuedBy, GridRow, HeldKey, History, Lease, LedgerEntry, Mark, MarkAs,
    Marked, NextClaim, QueueKey, QueuePipeline, QueuedRun, RejectEntry, RunStatus, StartRange,
    StoredClass, UnknownClass, UnknownState, WorkerId, FIRST_REJECTS,
};
pub use ledger::{
    AttemptGroup, Freshness, HeldRun, LedgerMetrics, Observed, PeriodCount, QueueDepth,
    WorkerEntry, WorkerInfo, WorkerKind, WorkerState, DURATION_BUCKETS, SETTLE_MARGIN_SECONDS,
    WAIT_BUCKETS,
};
pub use schema::TableSchema;

pub use writer::{Reconcile, Reject, RunWriter, WriterOptions};

/// How long a statement waits for a connection (PostgreSQL's pool).
pub(crate) const ACQUIRE_TIMEOUT_SECS: u64 = 60;

/// The most keys one [`Store::enqueue`] call (one transaction) should
/// carry: a page of a plan.
pub const ENQUEUE_CHUNK: usize = ledger::flow::ENQUEUE_CHUNK;

/// How a [`Store`] connects to PostgreSQL (SQLite ignores both: one
/// process owns the file).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StoreOptions {
    /// The most connections the store opens at once; `None`: 16. A
    /// program sizes it from the work it does at once (the binary uses
    /// `tidemark_engine::Connections`, ADR 0019): past it, a statement
    /// waits for a connection to come back.
    pub max_connections: Option<u32>,
    /// The database URL points at PgBouncer in transaction mode:
    /// statements are not kept prepared across transactions, session
    /// settings travel with each transaction (`SET LOCAL`), workers poll
    /// instead of `LISTEN`ing, and the ledger is not migrated through it
    /// (run `tidemark migrate` against the server directly).
    pub pgbouncer: bool,
}

/// A connection to the destination database, which also holds the ledger.
#[derive(Debug, Clone)]
pub struct Store {
    backend: Backend,
    /// Tables this process has created or checked, with the schema it
    /// checked them against: a backfill of 2,000 small periods checks its
    /// table once, not 2,000 times (each a write transaction on SQLite).
    checked: std::sync::Arc<std::sync::Mutex<Vec<TableSchema>>>,
}

#[derive(Debug, Clone)]
enum Backend {
    Sqlite(sqlite::SqliteStore),
    Postgres(postgres::PgStore),
}

/// Calls the same method on whichever backend the store uses.
macro_rules! dispatch {
    ($self:ident, $store:ident => $call:expr) => {
        match &$self.backend {
            Backend::Sqlite($store) => $call,
            Backend::Postgres($store) => $call,
        }
    };
}

/// How the database reads the work queue for a claim: one line per row of
/// `EXPLAIN` (PostgreSQL) or `EXPLAIN QUERY PLAN` (SQLite). A claim must
/// cost O(log n) in the backlog, so the tests check these plans: `next`
/// reads the queue index in rank order and sorts nothing; `takeover` reads
/// only running keys.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimPlan {
    /// The scan for running keys whose holder is gone.
    pub takeover: Vec<String>,
    /// The read of the first claimable pending key.
    pub next: Vec<String>,
}

impl Store {
    /// Connects to `url` (`sqlite://path` — created when missing — or
    /// `postgres://...`) and applies the ledger migrations.
    pub async fn connect(url: &str) -> Result<Store, Error> {
        Store::connect_with(url, &StoreOptions::default()).await
    }

    /// [`Store::connect`] with `options` (the pool's size, PgBouncer).
    pub async fn connect_with(url: &str, options: &StoreOptions) -> Result<Store, Error> {
        let backend = if url.starts_with("sqlite:") {
            Backend::Sqlite(sqlite::SqliteStore::connect(url).await?)
        } else if url.starts_with("postgres:") || url.starts_with("postgresql:") {
            Backend::Postgres(postgres::PgStore::connect(url, options).await?)
        } else {
            return Err(unsupported_url(url));
        };
        Ok(Store {
            backend,
            checked: Default::default(),
        })
    }

    /// Opens `url` read-only, for the commands that only read (`status`,
    /// every dry run): nothing is created, migrated or written (SQLite
    /// opens the file read-only, PostgreSQL runs every transaction
    /// read-only). `None` when there is no ledger yet (no SQLite file, or
    /// no ledger tables): every run key is new. A ledger at an older
    /// migration is a configuration error (exit 2) saying to run
    /// `tidemark migrate`: migrating it here would change the database
    /// under processes of the older build.
    pub async fn open_read_only(url: &str) -> Result<Option<Store>, Error> {
        Store::open_read_only_with(url, &StoreOptions::default()).await
    }

    /// [`Store::open_read_only`] with `options` (the pool's size, PgBouncer).
    pub async fn open_read_only_with(
        url: &str,
        options: &StoreOptions,
    ) -> Result<Option<Store>, Error> {
        let backend = if url.starts_with("sqlite:") {
            sqlite::SqliteStore::connect_read_only(url)
                .await?
                .map(Backend::Sqlite)
        } else if url.starts_with("postgres:") || url.starts_with("postgresql:") {
            postgres::PgStore::connect_read_only(url, options)
                .await?
                .map(Backend::Postgres)
        } else {
            return Err(unsupported_url(url));
        };
        Ok(backend.map(|backend| Store {
            backend,
            checked: Default::default(),
        }))
    }

    /// Closes every connection once the ones in use are returned.
    ///
    /// On SQLite it first checkpoints the WAL into the database file and
    /// empties it, so a finished command leaves its rows in that one file,
    /// not in a WAL of up to a few hundred MiB for the next opener to replay.
    /// Bounded: a connection still held after 10 s is left to the process
    /// exit (SQLite then replays the WAL on the next open, losing nothing).
    pub async fn close(&self) {
        let closing = async { dispatch!(self, s => s.close().await) };
        if tokio::time::timeout(Duration::from_secs(10), closing)
            .await
            .is_err()
        {
            tracing::warn!(
                "database connections still in use after 10 s; not waiting to close them"
            );
        }
    }

    /// After a storage failure (a full disk), frees what space the
    /// database can give back without losing anything, so the attempt's
    /// last ledger write fits: SQLite releases the space reserve kept
    /// beside its file. PostgreSQL manages its own space; nothing to do.
    pub fn make_room(&self) {
        if let Backend::Sqlite(s) = &self.backend {
            s.make_room();
        }
    }

    /// Refuses new claims while the space freed by [`Store::make_room`]
    /// is still needed for failure records (SQLite, until the disk has
    /// room again).
    fn room_to_claim(&self) -> Result<(), Error> {
        match &self.backend {
            Backend::Sqlite(s) => s.room_to_claim(),
            Backend::Postgres(_) => Ok(()),
        }
    }

    /// Applies pending ledger migrations (also done by [`Store::connect`]).
    /// Behind PgBouncer ([`StoreOptions::pgbouncer`]) a configuration
    /// error unless the ledger is current: migrate through a direct URL.
    pub async fn migrate(&self) -> Result<(), Error> {
        dispatch!(self, s => s.migrate().await)
    }

    /// Creates the destination table when missing, or checks that the
    /// existing one agrees with the pipeline (a contract error otherwise).
    ///
    /// Once a table passed for a schema, later calls with the same schema
    /// are answered from memory. A table changed behind the process's back
    /// then fails the write that meets it, as it would a moment after a
    /// check.
    pub async fn ensure_table(&self, schema: &TableSchema) -> Result<(), Error> {
        let known = |checked: &Vec<TableSchema>| checked.iter().any(|s| s == schema);
        if self.checked.lock().is_ok_and(|checked| known(&checked)) {
            return Ok(());
        }
        dispatch!(self, s => s.ensure_table(schema).await)?;
        if let Ok(mut checked) = self.checked.lock() {
            if !known(&checked) {
                checked.push(schema.clone());
            }
        }
        Ok(())
    }

    /// The rate gate of `source` of `pipeline` when other processes may
    /// read it too: on PostgreSQL, the source's bucket row in this
    /// database, shared by every process on every host (one gate per
    /// source in this process). `None` on SQLite, where one process owns
    /// the file and the in-process bucket is the whole truth (ADR 0010).
    pub fn rate_gate(
        &self,
        pipeline: &str,
        source: &str,
        limit: tidemark_core::spec::RateLimit,
    ) -> Option<std::sync::Arc<dyn tidemark_core::RateGate>> {
        match &self.backend {
            Backend::Postgres(s) => s.rate_gate(pipeline, source, limit),
            Backend::Sqlite(_) => None,
        }
    }

    /// Takes the run key for a new attempt, or explains why not.
    pub async fn claim(&self, key: &RunKey, request: &ClaimRequest) -> Result<Claim, Error> {
        self.room_to_claim()?;
        dispatch!(self, s => flow::claim(s, key, request).await)
    }

    /// Extends the lease. `Ok(false)` when the attempt no longer holds it.
    pub async fn heartbeat(&self, lease: &Lease, ttl: Duration) -> Result<bool, Error> {
        dispatch!(self, s => flow::heartbeat(s, lease, ttl).await)
    }

    /// Records a failed attempt (fenced: a superseded attempt changes
    /// nothing); the key may be re-queued by a schedule once its backoff,
    /// counted from the database's clock, has passed.
    pub async fn mark_failed(
        &self,
        lease: &Lease,
        counts: &Counts,
        error: &Error,
    ) -> Result<(), Error> {
        dispatch!(self, s => flow::mark_failed(s, lease, counts, error).await)
    }

    /// Ends an attempt stopped by a signal: the key goes back to `pending`
    /// with its checkpoint, for any worker to resume at once.
    pub async fn interrupt(&self, lease: &Lease, counts: &Counts, why: &str) -> Result<(), Error> {
        dispatch!(self, s => flow::interrupt(s, lease, counts, why).await)
    }

    /// Claims the next key of the work queue for a worker of `pipelines`.
    pub async fn claim_next(
        &self,
        pipelines: &[QueuePipeline],
        request: &ClaimRequest,
    ) -> Result<Option<QueuedRun>, Error> {
        self.room_to_claim()?;
        dispatch!(self, s => flow::claim_next(s, pipelines, request).await)
    }

    /// Whether anything is left in the queue for a draining worker.
    pub async fn work_left(
        &self,
        pipelines: &[QueuePipeline],
        me: &WorkerId,
    ) -> Result<bool, Error> {
        dispatch!(self, s => flow::work_left(s, pipelines, me).await)
    }

    /// The database's plans of a claim's reads of the work queue, for a
    /// worker of `pipelines`.
    pub async fn explain_claim(&self, pipelines: &[QueuePipeline]) -> Result<ClaimPlan, Error> {
        dispatch!(self, s => flow::explain_claim(s, pipelines).await)
    }

    /// Puts keys into the work queue, in one transaction; how many were
    /// newly queued. A plan of many keys calls it once per page of at most
    /// [`ENQUEUE_CHUNK`] keys, then [`Store::enqueued`] once.
    pub async fn enqueue(&self, batch: &Enqueue<'_>) -> Result<u64, Error> {
        dispatch!(self, s => flow::enqueue(s, batch).await)
    }

    /// Tells the store that one command queued `total` keys (in one or
    /// more [`Store::enqueue`] calls): after many, the planner's statistics
    /// are refreshed, once.
    pub async fn enqueued(&self, total: u64) {
        dispatch!(self, s => flow::enqueued(s, total).await)
    }

    /// A listener for queued keys (see [`QueueListener`]).
    pub async fn queue_listener(&self) -> Result<QueueListener, Error> {
        Ok(QueueListener {
            postgres: match &self.backend {
                Backend::Postgres(s) => s.listen().await?,
                Backend::Sqlite(_) => None,
            },
        })
    }

    /// Records keys `done` without running them (`tidemark mark`), in one
    /// transaction: a page of at most [`ENQUEUE_CHUNK`] keys per call.
    /// Running keys are left to their holder, done keys unless forced.
    pub async fn mark(&self, mark: &Mark<'_>) -> Result<Marked, Error> {
        dispatch!(self, s => ledger::mark::mark(s, mark).await)
    }

    /// Takes pending keys out of the queue; how many.
    pub async fn cancel(
        &self,
        pipeline: &str,
        source: Option<&str>,
        from: Option<&str>,
        to: Option<&str>,
    ) -> Result<u64, Error> {
        dispatch!(self, s => flow::cancel(s, pipeline, source, from, to).await)
    }

    /// Forgets a resumable checkpoint so the attempt starts the period over,
    /// under a new run id (returned): rows the run wrote before must not
    /// count as seen by the fresh start.
    pub async fn restart_fresh(&self, lease: &Lease) -> Result<String, Error> {
        dispatch!(self, s => flow::restart_fresh(s, lease).await)
    }

    /// The ledger rows of `keys` of `pipeline` and `export_type` that
    /// exist, read without locking or writing, each with what a claim
    /// would do with it ([`KeyRow::preview`]: the same claim rules a claim
    /// applies). One indexed lookup per key, in one read: planning asks a
    /// page of keys at a time, never the whole ledger.
    pub async fn key_rows(
        &self,
        pipeline: &str,
        export_type: &str,
        keys: &[KeyRef<'_>],
    ) -> Result<Vec<KeyRow>, Error> {
        dispatch!(self, s => ledger::preview::key_rows(s, pipeline, export_type, keys).await)
    }

    /// The period starts of `source`'s done rows, latest first, `limit`
    /// of them after the first `offset`.
    pub async fn done_starts(
        &self,
        pipeline: &str,
        export_type: &str,
        source: &str,
        limit: i64,
        offset: i64,
    ) -> Result<Vec<String>, Error> {
        dispatch!(self, s => ledger::preview::done_starts(s, pipeline, export_type, source, limit, offset).await)
    }

    /// Ledger rows of a pipeline, optionally for one period start.
    pub async fn status(
        &self,
        pipeline: &str,
        period_start: Option<&str>,
    ) -> Result<Vec<LedgerEntry>, Error> {
        dispatch!(self, s => flow::status(s, pipeline, period_start).await)
    }

    /// The ledger rows of a pipeline whose period starts lie in `range`,
    /// one entry at a time as the database returns them, ordered by period
    /// start (as an instant), source and export type.
    pub async fn status_each(
        &self,
        pipeline: &str,
        range: StartRange<'_>,
        each: impl FnMut(LedgerEntry) -> Result<(), Error> + Send,
    ) -> Result<(), Error> {
        dispatch!(self, s => flow::status_each(s, pipeline, range, each).await)
    }

    /// The state of every run key of `pipeline` whose period start lies in
    /// `range`, only the columns a cell of the page's grid needs, in one
    /// read and in no particular order.
    pub async fn grid_each(
        &self,
        pipeline: &str,
        range: StartRange<'_>,
        each: impl FnMut(GridRow) -> Result<(), Error> + Send,
    ) -> Result<(), Error> {
        dispatch!(self, s => ledger::grid::grid_each(s, pipeline, range, each).await)
    }

    /// `entry`'s story: every attempt the ledger holds, oldest first, and
    /// the current run's first rejected records (`status --period`).
    pub async fn history(&self, entry: &LedgerEntry) -> Result<History, Error> {
        dispatch!(self, s => ledger::history::history(s, entry).await)
    }

    /// Records this worker in `_tm_workers` (again, after a prune).
    pub async fn register_worker(&self, info: &WorkerInfo) -> Result<(), Error> {
        dispatch!(self, s => ledger::workers::register(s, info).await)
    }

    /// Renews the worker's `last_seen`; `false` when it has no live row
    /// (register again).
    pub async fn worker_heartbeat(&self, worker: &WorkerId) -> Result<bool, Error> {
        dispatch!(self, s => ledger::workers::heartbeat(s, worker).await)
    }

    /// Notes the worker's graceful end.
    pub async fn worker_stopped(&self, worker: &WorkerId) -> Result<(), Error> {
        dispatch!(self, s => ledger::workers::stopped(s, worker).await)
    }

    /// Every worker the ledger knows, live, dead or stopped (judged by the
    /// database's clock), with the run keys each holds.
    pub async fn workers(&self) -> Result<Vec<WorkerEntry>, Error> {
        dispatch!(self, s => ledger::workers::workers(s).await)
    }

    /// The state of the run keys for `/metrics` (one read transaction).
    pub async fn ledger_metrics(&self) -> Result<LedgerMetrics, Error> {
        dispatch!(self, s => ledger::metrics::ledger_metrics(s).await)
    }

    /// The attempts that ended after `after` and up to `until` (the
    /// ledger's time text, [`LedgerMetrics::settled`]; `None`: unbounded),
    /// grouped for `/metrics`.
    pub async fn attempt_metrics(
        &self,
        after: Option<&str>,
        until: Option<&str>,
    ) -> Result<Vec<AttemptGroup>, Error> {
        dispatch!(self, s => ledger::metrics::attempts_between(s, after, until).await)
    }

    /// Whether the database answers and holds every ledger migration this
    /// build expects (`/readyz`); the error says which is missing.
    pub async fn ready(&self) -> Result<(), Error> {
        let (migrator, applied) = match &self.backend {
            Backend::Sqlite(s) => (
                sqlite::SqliteStore::migrator(),
                s.applied_migrations().await?,
            ),
            Backend::Postgres(s) => (postgres::PgStore::migrator(), s.applied_migrations().await?),
        };
        match missing_migration(&migrator, &applied) {
            Some(error) => Err(error),
            None => Ok(()),
        }
    }

    /// Deletes attempt history and rejects older than `age`, and workers
    /// not seen for as long. Returns the number of attempt rows and reject
    /// rows removed.
    pub async fn prune(&self, age: Duration) -> Result<(u64, u64), Error> {
        dispatch!(self, s => flow::prune(s, age).await)
    }

    /// Claims the oldest deliverable notice of `pipelines` for `owner`,
    /// leased for `lease` (docs/ledger.md "Notices").
    pub async fn claim_notice(
        &self,
        owner: &str,
        pipelines: &[String],
        lease: Duration,
    ) -> Result<Option<OutboxNotice>, Error> {
        dispatch!(self, s => ledger::notices::claim(s, owner, pipelines, lease).await)
    }

    /// Records how a try of a claimed notice ended (only while `owner`
    /// still holds it).
    pub async fn record_notice(
        &self,
        id: &str,
        owner: &str,
        outcome: &Delivered<'_>,
    ) -> Result<(), Error> {
        dispatch!(self, s => ledger::notices::record(s, id, owner, outcome).await)
    }

    /// Queues a notice no run's change causes (`late`, `test`); `false`
    /// when the same one is queued already.
    pub async fn insert_notice(&self, notice: &NewNotice<'_>) -> Result<bool, Error> {
        dispatch!(self, s => ledger::notices::insert_new(s, notice).await)
    }

    /// The notices of `pipeline` (of one period start, if given), oldest
    /// first, with their delivery state.
    pub async fn notices(
        &self,
        pipeline: &str,
        period_start: Option<&str>,
    ) -> Result<Vec<OutboxNotice>, Error> {
        dispatch!(self, s => ledger::notices::list(s, pipeline, period_start).await)
    }

    /// Streams the run key's stored rows into `each` (see
    /// [`ledger::driver::Driver::stored_rows`]).
    pub(crate) async fn stored_rows(
        &self,
        schema: &TableSchema,
        lineage: &writer::Lineage,
        run_id: Option<&str>,
        each: impl FnMut(writer::StoredRow) -> Result<(), Error> + Send,
    ) -> Result<(), Error> {
        dispatch!(self, s => s.stored_rows(schema, lineage, run_id, each).await)
    }

    /// Commits one batch of a run (see [`flow::apply_batch`]).
    pub(crate) async fn apply_batch(
        &self,
        lease: &Lease,
        schema: &TableSchema,
        lineage: &writer::Lineage,
        batch: &writer::BatchWrite<'_>,
    ) -> Result<writer::BatchOutcome, Error> {
        dispatch!(self, s => flow::apply_batch(s, lease, schema, lineage, batch).await)
    }

    /// Commits the one batch of a period, reconciles and marks the run
    /// done, in one transaction (see [`flow::apply_and_finish`]), then
    /// claims `next` in it.
    #[allow(clippy::too_many_arguments)] // the batch's and the finish's inputs
    pub(crate) async fn apply_and_finish(
        &self,
        lease: &Lease,
        schema: &TableSchema,
        lineage: &writer::Lineage,
        batch: &writer::BatchWrite<'_>,
        existing: &stored::StoredHashes,
        reconcile: &Reconcile,
        next: Option<&NextClaim>,
        commit: durable::Commit,
    ) -> Result<flow::Finished, Error> {
        let next = self.piggy_back(next);
        dispatch!(self, s => flow::apply_and_finish(s, lease, schema, lineage, batch, existing, reconcile, next, commit).await)
    }

    /// Reconciles and marks the run done (see [`flow::finish`]), then
    /// claims `next` in the same transaction.
    #[allow(clippy::too_many_arguments)] // the run's identity and its end state
    pub(crate) async fn finish_run(
        &self,
        lease: &Lease,
        schema: &TableSchema,
        lineage: &writer::Lineage,
        existing: &stored::StoredHashes,
        reconcile: &Reconcile,
        counts: Counts,
        batches: i64,
        next: Option<&NextClaim>,
    ) -> Result<(serde_json::Value, Option<Claim>), Error> {
        let next = self.piggy_back(next);
        dispatch!(self, s => flow::finish(s, lease, schema, lineage, existing, reconcile, counts, batches, next).await)
    }

    /// The next key's claim a finishing transaction may carry: none while
    /// [`Store::claim`] would refuse to claim (the space
    /// [`Store::make_room`] freed is kept for failure records).
    fn piggy_back<'n>(&self, next: Option<&'n NextClaim>) -> Option<&'n NextClaim> {
        next.filter(|_| self.room_to_claim().is_ok())
    }

    /// Starts writing the batches of a claimed run.
    pub async fn writer(
        &self,
        schema: TableSchema,
        run: &ClaimedRun,
        key: &RunKey,
        options: WriterOptions,
    ) -> Result<RunWriter, Error> {
        RunWriter::start(self.clone(), schema, run, key, options).await
    }
}

/// Runs `op` until it succeeds, fails with an error `retryable` rejects, or
/// `deadline` has passed, sleeping with jittered exponential backoff
/// (10 ms doubling to 500 ms) in between. For start-up steps that race
/// other processes opening the same database, or a server that is
/// restarting.
pub(crate) async fn retry_while<T, E, Fut>(
    what: &str,
    deadline: Duration,
    retryable: impl Fn(&E) -> bool,
    mut op: impl FnMut() -> Fut,
) -> Result<T, E>
where
    E: std::fmt::Display,
    Fut: std::future::Future<Output = Result<T, E>>,
{
    // Bounded by the deadline, not by a count of tries.
    let backoff = tidemark_core::spec::RetryPolicy {
        max_attempts: u32::MAX,
        base_delay: Duration::from_millis(10),
        max_delay: Duration::from_millis(500),
    };
    let deadline = tokio::time::Instant::now() + deadline;
    let mut attempt = 0;
    loop {
        attempt += 1;
        match op().await {
            Err(e) if retryable(&e) && tokio::time::Instant::now() < deadline => {
                tracing::debug!(error = %e, attempt, "{what}: trying again");
                tokio::time::sleep(backoff.delay(attempt, None, rand::random::<f64>())).await;
            }
            other => return other,
        }
    }
}

/// Wakes idle queue workers when a key is queued by any process:
/// PostgreSQL's LISTEN/NOTIFY. On SQLite, and behind PgBouncer in
/// transaction mode, it never fires; workers poll.
pub struct QueueListener {
    postgres: Option<sqlx::postgres::PgListener>,
}

impl QueueListener {
    /// Waits for the next wake-up. A lost connection is re-established by
    /// the listener; an error is logged and waited out, never fatal.
    pub async fn recv(&mut self) {
        match &mut self.postgres {
            Some(listener) => {
                if let Err(e) = listener.recv().await {
                    tracing::debug!(error = %e, "queue listener: reconnecting");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
            None => std::future::pending().await,
        }
    }
}

fn unsupported_url(url: &str) -> Error {
    Error::config(
        "command line",
        "database URL",
        format!(
            "unsupported database URL {:?}: use sqlite://PATH or postgres://...",
            redact_url(url)
        ),
    )
}

/// How long a read-only open waits for a ledger's missing migrations to
/// appear before it calls the ledger old. Another process that is
/// migrating it right now (the first `run` on a new database, while
/// `status` polls) applies them one transaction at a time, within a few
/// hundred milliseconds on a small ledger; each one that lands restarts
/// the wait.
const MIGRATION_PATIENCE: Duration = Duration::from_secs(2);

/// Checks that the ledger has every migration of `migrator`, reading the
/// applied versions with `applied`. A read-only open may not migrate it:
/// a ledger still lacking one after [`MIGRATION_PATIENCE`] without
/// progress is a configuration error saying to run `tidemark migrate`.
pub(crate) async fn check_migrated<F, Fut>(
    migrator: &sqlx::migrate::Migrator,
    mut applied: F,
) -> Result<(), Error>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<Vec<i64>, Error>>,
{
    let mut seen = applied().await?;
    let mut deadline = tokio::time::Instant::now() + MIGRATION_PATIENCE;
    loop {
        let Some(error) = missing_migration(migrator, &seen) else {
            return Ok(());
        };
        if tokio::time::Instant::now() >= deadline {
            return Err(error);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        let now = applied().await?;
        if now.len() != seen.len() {
            deadline = tokio::time::Instant::now() + MIGRATION_PATIENCE;
        }
        seen = now;
    }
}

/// The first of `migrator`'s migrations that `applied` lacks, as the error
/// a read-only open reports.
fn missing_migration(migrator: &sqlx::migrate::Migrator, applied: &[i64]) -> Option<Error> {
    let missing = migrator.iter().find(|m| !applied.contains(&m.version))?;
    Some(Error::config(
        "database",
        "ledger",
        format!(
            "the ledger in this database is older than this tidemark (migration {} \"{}\" is not applied); this command only reads and changes nothing, so run `tidemark migrate` first (processes of the older build should be stopped by then; if another tidemark is migrating it right now, try again in a moment)",
            missing.version, missing.description
        ),
    ))
}

/// Hides a password in a database URL.
pub fn redact_url(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            let creds = &url[scheme + 3..at];
            match creds.split_once(':') {
                Some((user, _)) => format!("{}://{user}:***@{}", &url[..scheme], &url[at + 1..]),
                None => url.to_string(),
            }
        }
        _ => url.to_string(),
    }
}

/// The current time as SQLite stores it: RFC 3339, UTC, milliseconds.
/// Runs synchronous work (a SQLite statement, a wait for the stored-row
/// scan) without stalling the other tasks of a multi-threaded runtime (the
/// heartbeat, the reader one batch ahead).
pub(crate) fn blocking<R>(work: impl FnOnce() -> R) -> R {
    use tokio::runtime::{Handle, RuntimeFlavor};
    match Handle::try_current() {
        Ok(h) if h.runtime_flavor() == RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(work)
        }
        _ => work(),
    }
}

pub(crate) fn now_text() -> String {
    timestamp_text(chrono::Utc::now())
}

pub(crate) fn timestamp_text(at: chrono::DateTime<chrono::Utc>) -> String {
    at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_redacted() {
        assert_eq!(
            redact_url("postgres://u:secret@h:5432/db"),
            "postgres://u:***@h:5432/db"
        );
        assert_eq!(redact_url("postgres://u@h/db"), "postgres://u@h/db");
        assert_eq!(redact_url("sqlite://x.db"), "sqlite://x.db");
    }

    /// A read-only open waits for a ledger that another process is
    /// migrating (its versions grow), and names an old one (they do not)
    /// as a configuration error saying to run `tidemark migrate`.
    #[tokio::test]
    async fn a_read_only_open_waits_out_a_migration_and_names_an_old_ledger() {
        let migrator = sqlite::SqliteStore::migrator();
        let all: Vec<i64> = migrator.iter().map(|m| m.version).collect();
        let calls = std::sync::atomic::AtomicUsize::new(1);
        let growing = || {
            let n = calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let seen = all[..n.min(all.len())].to_vec();
            async move { Ok(seen) }
        };
        check_migrated(&migrator, growing).await.unwrap();

        let old = all[..all.len() - 1].to_vec();
        let started = std::time::Instant::now();
        let error = check_migrated(&migrator, || {
            let old = old.clone();
            async move { Ok(old) }
        })
        .await
        .unwrap_err();
        assert!(started.elapsed() >= MIGRATION_PATIENCE);
        assert_eq!(error.class(), tidemark_core::ErrorClass::Config);
        assert!(error.to_string().contains("tidemark migrate"), "{error}");
    }
}
