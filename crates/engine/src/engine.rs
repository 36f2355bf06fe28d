//! [`Engine`]: what a program holds to run pipelines: the store (the
//! destination database, which holds the ledger), this worker's identity,
//! the lease length, the clock, the stop token and the sources it can
//! open. Every command of the `tidemark` binary is a few calls on it.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures_util::{Stream, StreamExt};
use tidemark_core::spec::SourceSpec;
use tidemark_core::{Error, Period, Pipeline, RunKey};
use tidemark_extract::{BuiltInSources, OpenSource};
use tidemark_load::{
    Claim, Durable, EnqueuedBy, Mark, MarkAs, Marked, QueueKey, RunStatus, Store, WorkerId,
    WorkerKind,
};

use crate::clock::{Clock, SystemClock};
use crate::plan::{self, Ask, Intent, PeriodRange, Planned, Planner};
use crate::presence::{Health, Presence};
use crate::run::{Context, Job, NextJob, Outcome, Relay, RunFlags};
use crate::shutdown::Shutdown;

/// The lease length when none is given: renewed every third of it, and
/// taken over by another worker once it has run out without renewal.
pub const DEFAULT_LEASE_TTL: Duration = Duration::from_secs(30);

/// Runs pipelines against one store. Cheap to clone; clones share the
/// store, the stop token and the sources.
#[derive(Clone)]
pub struct Engine {
    store: Store,
    worker: WorkerId,
    ctx: Context,
    sources: Arc<HashMap<String, Arc<dyn OpenSource>>>,
}

/// Builds an [`Engine`]; every setting has a default.
pub struct EngineBuilder {
    store: Store,
    worker: Option<WorkerId>,
    lease_ttl: Duration,
    clock: Arc<dyn Clock>,
    shutdown: Shutdown,
    sources: HashMap<String, Arc<dyn OpenSource>>,
}

impl EngineBuilder {
    /// This process as a lease holder (default: [`Engine::this_process`]).
    pub fn worker(mut self, worker: WorkerId) -> Self {
        self.worker = Some(worker);
        self
    }

    /// The lease length (default 30 s).
    pub fn lease_ttl(mut self, ttl: Duration) -> Self {
        self.lease_ttl = ttl;
        self
    }

    /// The clock that decides what is due (default: the system's).
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// The token that stops the engine's runs and services gracefully.
    pub fn shutdown(mut self, shutdown: Shutdown) -> Self {
        self.shutdown = shutdown;
        self
    }

    /// Reads the pipeline sources with id `source_id` and `transport =
    /// "custom"` through `opener`. The engine commits each batch with the
    /// checkpoint `opener`'s batches return, and hands the last committed
    /// one back on resume.
    pub fn source(mut self, source_id: impl Into<String>, opener: Arc<dyn OpenSource>) -> Self {
        self.sources.insert(source_id.into(), opener);
        self
    }

    /// The engine.
    pub fn build(self) -> Engine {
        let worker = self.worker.unwrap_or_else(Engine::this_process);
        let health = Health::default();
        let presence = Presence::new(
            self.store.clone(),
            worker.clone(),
            self.lease_ttl,
            health.clone(),
        );
        Engine {
            store: self.store,
            worker,
            ctx: Context {
                shutdown: self.shutdown,
                lease_ttl: self.lease_ttl,
                clock: self.clock,
                presence,
                health,
            },
            sources: Arc::new(self.sources),
        }
    }
}

/// One run key and what happened to it.
#[derive(Debug)]
pub struct KeyOutcome {
    /// The run key.
    pub key: RunKey,
    /// What happened.
    pub outcome: Outcome,
}

/// What [`Engine::run_many`] reports as it goes.
#[derive(Debug)]
pub enum RunEvent {
    /// A page of the plans was planned: `keys` run keys, `jobs` of which
    /// will be claimed (the rest are left alone, e.g. done).
    Planned {
        /// Run keys planned.
        keys: usize,
        /// Run keys to claim.
        jobs: usize,
    },
    /// A run key's run ended.
    Ran(KeyOutcome),
    /// Reading the ledger for the next page failed after its retries: no
    /// further page is planned.
    PlanFailed(Error),
}

/// The events of [`Engine::run_many`]'s workers, each with when what it
/// reports is on disk.
type Events = tokio::sync::mpsc::UnboundedSender<(RunEvent, Durable)>;

/// `event` once what it reports is on disk: a period whose commit is
/// shared with the next ones (SQLite, ADR 0022) is reported done only
/// after that commit, and failed if the commit was never made (nothing of
/// it was kept, and it runs again next time).
async fn once_durable(event: RunEvent, durable: Durable) -> RunEvent {
    if !durable.is_pending() {
        return event;
    }
    match (durable.wait().await, event) {
        (Err(error), RunEvent::Ran(KeyOutcome { key, .. })) => {
            tracing::error!(%key, error = %error, "the period's shared commit was not made");
            RunEvent::Ran(KeyOutcome {
                key,
                outcome: Outcome::Failed(error),
            })
        }
        (_, event) => event,
    }
}

/// How [`Engine::run_many`] runs its keys.
#[derive(Debug, Clone, Copy)]
pub struct RunMany {
    /// Keys run at once.
    pub concurrency: usize,
    /// Reconcile deletes past `load.max_delete_fraction`.
    pub force_deletes: bool,
    /// Wait for keys other live runs hold.
    pub wait: bool,
}

impl Engine {
    /// An engine over `store`, to be configured.
    pub fn builder(store: Store) -> EngineBuilder {
        EngineBuilder {
            store,
            worker: None,
            lease_ttl: DEFAULT_LEASE_TTL,
            clock: Arc::new(SystemClock),
            shutdown: Shutdown::new(),
            sources: HashMap::new(),
        }
    }

    /// This process as a lease holder: host, pid and an id of this start,
    /// the same for every engine of the process.
    pub fn this_process() -> WorkerId {
        static WORKER: std::sync::OnceLock<WorkerId> = std::sync::OnceLock::new();
        WORKER
            .get_or_init(|| WorkerId {
                host: gethostname::gethostname().to_string_lossy().into_owned(),
                pid: std::process::id(),
                instance: uuid::Uuid::new_v4().simple().to_string()[..8].to_string(),
            })
            .clone()
    }

    /// The store.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// The clock's "now".
    pub fn now(&self) -> chrono::DateTime<chrono::Utc> {
        self.ctx.clock.now()
    }

    /// The clock.
    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.ctx.clock
    }

    /// The stop token.
    pub fn shutdown(&self) -> &Shutdown {
        &self.ctx.shutdown
    }

    /// This engine's worker identity.
    pub fn worker(&self) -> &WorkerId {
        &self.worker
    }

    /// The ticks of this engine's loops, as `/healthz` judges them.
    pub fn health(&self) -> &Health {
        &self.ctx.health
    }

    /// Records this process in the ledger's workers (once) and keeps it
    /// seen while it runs: a `serve` calls it at start.
    pub async fn register_worker(&self, kind: WorkerKind, slots: u32) {
        self.ctx.presence.ensure(kind, slots).await;
    }

    pub(crate) fn context(&self) -> &Context {
        &self.ctx
    }

    /// A plan of `ask` for `sources` of `pipeline` at the clock's now, made
    /// a page at a time ([`Planner::next_page`]).
    pub fn plan(
        &self,
        pipeline: Arc<Pipeline>,
        sources: Vec<String>,
        ask: Ask,
    ) -> Result<Planner, Error> {
        Planner::new(
            Some(self.store.clone()),
            pipeline,
            sources,
            ask,
            self.now(),
            false,
        )
    }

    /// Runs one run key (claims it, reads, loads, records), whatever the
    /// ledger says (the claim decides: a done key is skipped unless
    /// `flags.force`).
    pub async fn run(&self, pipeline: &Arc<Pipeline>, key: RunKey, flags: RunFlags) -> Outcome {
        self.job(pipeline, key, flags, 1).run(&self.ctx).await
    }

    /// Runs every source's key of `period` of `pipeline`, one after the
    /// other, as `tidemark run` does (a done key is skipped).
    pub async fn run_period(
        &self,
        pipeline: &Arc<Pipeline>,
        period: Period,
    ) -> Result<Vec<KeyOutcome>, Error> {
        let sources = crate::catalog::source_ids(pipeline, None)?;
        let ask = Ask::Periods {
            range: PeriodRange::one(period),
            only: None,
            force: false,
        };
        let mut planner = self.plan(Arc::clone(pipeline), sources, ask)?;
        let mut outcomes = Vec::new();
        while let Some(page) = planner.next_page().await? {
            for job in self.jobs(pipeline, &page, false, false, 1) {
                let key = job.key.clone();
                let outcome = job.run(&self.ctx).await;
                outcomes.push(KeyOutcome { key, outcome });
            }
        }
        Ok(outcomes)
    }

    /// Runs what `planners` plan (one after the other), `how.concurrency`
    /// keys at a time, as a stream of events: each page as it is planned
    /// (the next page is planned when the runs need it, so a backfill of a
    /// million periods holds a page, ADR 0014) and each key's outcome as
    /// its run ends.
    ///
    /// `how.concurrency` workers take the planned jobs from one queue, in
    /// order. A worker takes its next job as its current period finishes,
    /// so that the transaction finishing the period also claims the next
    /// key (the claim piggy-back, ADR 0022): one commit per small period
    /// instead of two. On SQLite the finishing transactions of one-batch
    /// periods also share their commit (up to 64 periods, or 20 ms): each
    /// period's outcome is yielded once its commit is made, never before,
    /// so whatever reads this stream reports only what is on disk.
    ///
    /// A run that finds the database unable to store anything more stops
    /// the stream from claiming further keys: they end
    /// [`Outcome::NotRun`], since every other period would fail the same
    /// way (or wait on locks).
    pub fn run_many(
        &self,
        planners: Vec<Planner>,
        how: RunMany,
    ) -> impl Stream<Item = RunEvent> + '_ {
        let feed = Arc::new(Feed {
            pages: tokio::sync::Mutex::new(Pages {
                planners: planners.into(),
                jobs: std::collections::VecDeque::new(),
            }),
            stopped: std::sync::Mutex::new(None),
        });
        let (events, mut received) = tokio::sync::mpsc::unbounded_channel::<(RunEvent, Durable)>();
        let workers: futures_util::stream::FuturesUnordered<_> = (0..how.concurrency.max(1))
            .map(|_| self.work(Arc::clone(&feed), how, events.clone()))
            .collect();
        // The stream ends when every worker has ended (and dropped its
        // sender) and their events are read.
        drop(events);
        let events = futures_util::stream::poll_fn(move |cx| received.poll_recv(cx))
            .then(|(event, durable)| once_durable(event, durable));
        let working = workers.filter_map(|()| std::future::ready(None::<RunEvent>));
        futures_util::stream::select(events, working)
    }

    /// One worker of [`Engine::run_many`]: runs jobs of `feed` until none
    /// is left, the next one first if its previous period's transaction
    /// took it.
    async fn work(&self, feed: Arc<Feed>, how: RunMany, events: Events) {
        let mut relay = Relay::new(&*feed, &self.ctx);
        loop {
            let (job, claim) = match relay.take() {
                Some(next) => next,
                None => match feed.next(self, &how, &events).await {
                    Some(job) => (job, None),
                    None => return,
                },
            };
            let ran = self.run_or_not(job, claim, &feed, &mut relay).await;
            let durable = relay.take_durable();
            if events.send((RunEvent::Ran(ran), durable)).is_err() {
                // Nobody reads the events any more: the stream was dropped.
                return;
            }
        }
    }

    async fn run_or_not(
        &self,
        job: Job,
        claim: Option<Claim>,
        feed: &Feed,
        relay: &mut Relay<'_>,
    ) -> KeyOutcome {
        let key = job.key.clone();
        let outcome = match feed.stopped() {
            Some(reason) => job.give_back(claim, Outcome::NotRun { reason }).await,
            None => job.run_relayed(&self.ctx, claim, Some(relay)).await,
        };
        if let Outcome::Failed(error @ Error::Storage { .. }) = &outcome {
            feed.stop(format!("stopped claiming work after {key} failed: {error}"));
        }
        KeyOutcome { key, outcome }
    }

    /// Puts what `plan` plans into the work queue at `priority`, a page per
    /// transaction: keys it claims as usual go in fresh (new, or again if
    /// failed or cancelled); keys it forces go in even when done. Returns
    /// (queued, keys planned).
    pub async fn enqueue(&self, mut plan: Planner, priority: i64) -> Result<(u64, u64), Error> {
        let how = plan::QueueAs {
            priority,
            by: EnqueuedBy::Backfill,
            fresh_from: &[RunStatus::Failed, RunStatus::Cancelled],
            forced_from: &[RunStatus::Done, RunStatus::Failed, RunStatus::Cancelled],
            respect_backoff: false,
        };
        plan::enqueue_plan(&self.store, &mut plan, &how, |_| {}).await
    }

    /// Records the periods of `range` of `sources` of `pipeline` as done
    /// without running them (`tidemark mark`): loaded by another tool
    /// ([`MarkAs::Done`]) or deliberately empty ([`MarkAs::Skipped`]), with
    /// the operator's `note`. Keys that are running are left to their
    /// holder (listed in [`Marked::held`]); keys already done are left as
    /// they are unless `force`. A transaction per page of keys. The
    /// attempts name the operator ([`Engine::operator`]).
    pub async fn mark(
        &self,
        pipeline: &Pipeline,
        sources: &[String],
        range: PeriodRange,
        marked: MarkAs,
        note: &str,
        force: bool,
    ) -> Result<Marked, Error> {
        let spec = &pipeline.spec;
        let fingerprint = pipeline.fields_fingerprint();
        let worker = Engine::operator();
        let mut total = Marked::default();
        let mut page: Vec<QueueKey> = Vec::new();
        let mut periods = range.periods().peekable();
        while let Some(period) = periods.next() {
            let (start, end) = (period.start_rfc3339(), period.end_rfc3339());
            page.extend(sources.iter().map(|source| QueueKey {
                source: source.clone(),
                period_start: start.clone(),
                period_end: end.clone(),
            }));
            if page.len() < plan::PAGE_KEYS && periods.peek().is_some() {
                continue;
            }
            let done = self
                .store
                .mark(&Mark {
                    pipeline: &spec.name,
                    export_type: &spec.export_type,
                    keys: &page,
                    marked,
                    note,
                    force,
                    handler_version: &spec.version,
                    fields_fingerprint: fingerprint.as_str(),
                    worker: &worker,
                })
                .await?;
            total.marked += done.marked;
            total.already_done += done.already_done;
            total.held.extend(done.held);
            page.clear();
        }
        Ok(total)
    }

    /// The operator a mark's attempts name: `mark:$USER@host:pid`.
    pub fn operator() -> String {
        let user = std::env::var("USER")
            .or_else(|_| std::env::var("LOGNAME"))
            .unwrap_or_else(|_| "unknown".to_string());
        let me = Engine::this_process();
        format!("mark:{user}@{}:{}", me.host, me.pid)
    }

    /// Delivers what is deliverable now of the outbox's notices of
    /// `pipelines`, for at most [`crate::notices::COMMAND_DELIVERY`]: what a
    /// command (`run`, `backfill`, `sync`) does before it exits. What it
    /// could not deliver stays queued for the next command or `serve`;
    /// nothing here fails.
    pub async fn deliver_notices(&self, pipelines: &[Arc<Pipeline>]) -> crate::DeliveryTally {
        // After a stop request the process is ending: its notices wait.
        if self.shutdown().requested()
            || pipelines
                .iter()
                .all(|p| crate::notices::notice_targets(p).is_empty())
        {
            return crate::DeliveryTally::default();
        }
        match crate::Deliverer::new(self.store().clone(), self.worker().owner()) {
            Ok(deliverer) => {
                deliverer
                    .deliver_for(pipelines, crate::notices::COMMAND_DELIVERY)
                    .await
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot deliver notices; they stay queued");
                crate::DeliveryTally::default()
            }
        }
    }

    /// Notes this worker's graceful end in the ledger (when it worked) and
    /// closes the store's connections (SQLite: checkpoints its WAL) and the
    /// SQL sources' pools.
    pub async fn close(&self) {
        self.ctx.presence.stop().await;
        tidemark_extract::close_sql_pools().await;
        self.store.close().await;
    }

    /// What opens `source_id` of `pipeline`: the program's own source for
    /// a `transport = "custom"` one, else the built-in readers.
    pub(crate) fn opener(&self, pipeline: &Pipeline, source_id: &str) -> Arc<dyn OpenSource> {
        match (self.sources.get(source_id), pipeline.source(source_id)) {
            (Some(opener), Some(SourceSpec::Custom(_))) => Arc::clone(opener),
            _ => Arc::new(BuiltInSources),
        }
    }

    /// The job of one run key.
    /// The job of `key`, run with `at_once - 1` others at a time.
    pub(crate) fn job(
        &self,
        pipeline: &Arc<Pipeline>,
        key: RunKey,
        flags: RunFlags,
        at_once: usize,
    ) -> Job {
        Job {
            store: self.store.clone(),
            pipeline: Arc::clone(pipeline),
            source_id: key.source.clone(),
            opener: self.opener(pipeline, &key.source),
            key,
            worker: self.worker.clone(),
            flags,
            at_once,
        }
    }

    /// The jobs of a page of a plan: one per run key it claims.
    fn jobs(
        &self,
        pipeline: &Arc<Pipeline>,
        planned: &[Planned],
        force_deletes: bool,
        wait: bool,
        at_once: usize,
    ) -> Vec<Job> {
        planned
            .iter()
            .filter(|p| matches!(p.intent, Intent::Claim(_)))
            .map(|p| {
                self.job(
                    pipeline,
                    p.key.clone(),
                    RunFlags::of(p, force_deletes, wait),
                    at_once,
                )
            })
            .collect()
    }
}

/// The jobs of [`Engine::run_many`]: the plans, a page of them at a time,
/// shared by its workers.
struct Feed {
    pages: tokio::sync::Mutex<Pages>,
    /// Why the workers stopped claiming work, once a run found the
    /// database unable to store more.
    stopped: std::sync::Mutex<Option<String>>,
}

/// The plans not yet paged, and the jobs of the pages planned.
struct Pages {
    planners: std::collections::VecDeque<Planner>,
    jobs: std::collections::VecDeque<Job>,
}

impl Feed {
    /// The next job, planning the next page (and telling `events`) when
    /// the planned ones are taken; `None` once every plan is run, or a
    /// plan's ledger read failed (no further page is planned).
    async fn next(&self, engine: &Engine, how: &RunMany, events: &Events) -> Option<Job> {
        let mut pages = self.pages.lock().await;
        loop {
            if let Some(job) = pages.jobs.pop_front() {
                return Some(job);
            }
            let planner = pages.planners.front_mut()?;
            match planner.next_page().await {
                Ok(Some(page)) => {
                    let pipeline = Arc::clone(planner.pipeline());
                    let jobs = engine.jobs(
                        &pipeline,
                        &page,
                        how.force_deletes,
                        how.wait,
                        how.concurrency.max(1),
                    );
                    let planned = RunEvent::Planned {
                        keys: page.len(),
                        jobs: jobs.len(),
                    };
                    // The reader of the events may be gone; the jobs still
                    // end as the stream is dropped.
                    let _ = events.send((planned, Durable::now()));
                    pages.jobs.extend(jobs);
                }
                Ok(None) => {
                    pages.planners.pop_front();
                }
                Err(e) => {
                    let _ = events.send((RunEvent::PlanFailed(e), Durable::now()));
                    pages.planners.clear();
                }
            }
        }
    }

    /// Why no more work is claimed, if so.
    fn stopped(&self) -> Option<String> {
        self.stopped.lock().ok().and_then(|s| s.clone())
    }

    /// Stops claiming work, for `reason` (the first one stays).
    fn stop(&self, reason: String) {
        if let Ok(mut stopped) = self.stopped.lock() {
            stopped.get_or_insert(reason);
        }
    }
}

impl NextJob for Feed {
    /// A planned job, unless the workers stopped claiming work, the
    /// planned ones are taken (the next page is planned by the worker's
    /// loop, not inside a finishing period), or another worker is planning.
    fn ready(&self) -> Option<Job> {
        if self.stopped().is_some() {
            return None;
        }
        self.pages.try_lock().ok()?.jobs.pop_front()
    }
}
