//! The long-running service (`tidemark serve`). The ledger is the work
//! queue, shared by any number of services on any hosts through one
//! database; there is no broker.
//!
//! - The **scheduler** (unless configured off) queues, at each fire of a
//!   pipeline's `[schedule]`, what is due (the same decision as `sync`,
//!   [`crate::plan`]). Queuing is idempotent, so N schedulers firing together
//!   queue each key once.
//! - **Workers** (`workers` slots for the whole process) claim queued
//!   keys, highest rank first (priority as a head start, so waiting ages a
//!   key), and run each exactly as `run` would. On PostgreSQL a claim skips
//!   keys other claims hold and idle workers wake on LISTEN/NOTIFY; a key
//!   whose holder died is claimed again at once (same host, process gone) or
//!   once its lease has run out.
//! - **Stopping**: the engine's [`crate::Shutdown`] stops claiming and
//!   hands the keys in flight back after their current batch;
//!   [`Reloader::reload`] (the binary's SIGHUP) re-reads the pipeline files
//!   (a broken one is logged and its old definition kept).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use chrono::{DateTime, Utc};
use tidemark_core::{Error, Period, Pipeline, RunKey};
use tidemark_load::{ClaimRequest, EnqueuedBy, QueuePipeline, QueuedRun, RunStatus, WorkerKind};
use tokio::sync::Notify;
use tokio::task::JoinSet;

use crate::catalog::Catalog;
use crate::engine::Engine;
use crate::plan::{self, Ask, Planner};
use crate::run::{Job, Outcome, RunFlags};

/// The priority of scheduled keys: a day of head start over backfills
/// queued at the same time (each point is a minute).
pub const SCHEDULE_PRIORITY: i64 = 1440;

/// The longest the scheduler sleeps before looking at the clock again.
const SCHEDULER_TICK: Duration = Duration::from_secs(60);

/// The scheduler's loop in [`crate::Health`].
pub const SCHEDULER_LOOP: &str = "scheduler";

/// How long past its poll interval an idle worker slot may stay silent
/// (a claim waiting on a busy database) before `/healthz` calls it wedged.
const WORKER_PATIENCE: Duration = Duration::from_secs(30);

/// How a [`Service`] works.
#[derive(Debug, Clone)]
pub struct ServiceConfig {
    /// The pipelines it serves: every file of the folder.
    pub catalog: Catalog,
    /// Worker slots: keys run at once by this process.
    pub workers: u16,
    /// How often an idle worker looks at the queue without a wake-up.
    pub poll: Duration,
    /// End once nothing is left that this process can claim.
    pub drain: bool,
    /// Queue what is due at each fire of the pipelines' `[schedule]`s.
    pub schedule: bool,
    /// Where people reach this service's pages (`serve --public-url`):
    /// notices link to their period's page under it.
    pub public_url: Option<String>,
}

impl ServiceConfig {
    /// Loads and checks every pipeline file of the folder at `now`, as
    /// [`Service::new`] will: a configuration error found before any
    /// database is opened touches nothing. Returns how many there are.
    pub fn check(&self, now: DateTime<Utc>) -> Result<usize, Error> {
        let pipelines = Pipelines::load(&self.catalog, now)?;
        if pipelines.by_name.is_empty() {
            return Err(no_pipelines(&self.catalog));
        }
        Ok(pipelines.by_name.len())
    }
}

fn no_pipelines(catalog: &Catalog) -> Error {
    Error::config(
        catalog.dir().display().to_string(),
        "pipelines folder",
        "no pipeline files (NAME.toml) in this folder",
    )
}

/// How a [`Service::run`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServiceEnd {
    /// Some attempt of this service lost its lease to another worker.
    pub lease_lost: bool,
}

/// The long-running service over an [`Engine`]: a scheduler and worker
/// slots sharing the ledger as their queue with any number of other
/// services on any hosts.
pub struct Service {
    shared: Arc<Shared>,
}

/// Re-reads a [`Service`]'s pipeline files (the binary calls it on SIGHUP).
#[derive(Clone)]
pub struct Reloader {
    shared: Arc<Shared>,
}

impl Reloader {
    /// Re-reads the folder: a changed file replaces its pipeline, a new one
    /// is added, a removed one dropped; a broken one is logged (file and
    /// key) and its previous definition kept. Returns the number of
    /// pipelines now served.
    pub fn reload(&self) -> usize {
        let shared = &self.shared;
        let next = shared
            .pipelines()
            .reload(&shared.config.catalog, shared.engine.now());
        let count = next.by_name.len();
        match shared.pipelines.write() {
            Ok(mut current) => *current = Arc::new(next),
            Err(poisoned) => *poisoned.into_inner() = Arc::new(next),
        }
        shared.reloaded.notify_waiters();
        shared.wake.notify_waiters();
        count
    }
}

impl Service {
    /// Loads every pipeline file of `config.catalog` (any error is a
    /// configuration error, as for every command; so is an empty folder).
    pub fn new(engine: Engine, config: ServiceConfig) -> Result<Service, Error> {
        let pipelines = Pipelines::load(&config.catalog, engine.now())?;
        if pipelines.by_name.is_empty() {
            return Err(no_pipelines(&config.catalog));
        }
        Ok(Service {
            shared: Arc::new(Shared {
                pipelines: RwLock::new(Arc::new(pipelines)),
                engine,
                config,
                wake: Notify::new(),
                reloaded: Notify::new(),
                lease_lost: AtomicBool::new(false),
                next_fires: Mutex::new(HashMap::new()),
                delivery_stop: AtomicBool::new(false),
                delivery_wake: Notify::new(),
            }),
        })
    }

    /// The handle that re-reads the pipeline files.
    pub fn reloader(&self) -> Reloader {
        Reloader {
            shared: Arc::clone(&self.shared),
        }
    }

    /// A read-only view of this service for the HTTP endpoints
    /// ([`crate::web`]): its engine and the pipelines it serves now.
    pub fn view(&self) -> ServiceView {
        ServiceView {
            shared: Arc::clone(&self.shared),
        }
    }

    /// Records this service in the ledger's workers (once; [`Service::run`]
    /// does it too) and keeps it seen until [`Engine::close`]: a program
    /// that serves endpoints calls it first, so they never show the
    /// service missing from its own workers.
    pub async fn announce(&self) {
        let slots = u32::from(self.shared.config.workers);
        self.shared
            .engine
            .register_worker(WorkerKind::Serve, slots)
            .await;
    }

    /// The names of the pipelines served now.
    pub fn pipeline_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.shared.pipelines().by_name.keys().cloned().collect();
        names.sort();
        names
    }

    /// Runs the scheduler (unless configured off) and the worker slots
    /// until the engine's shutdown fires, or, with `drain`, until nothing
    /// is left for this process.
    pub async fn run(&self) -> ServiceEnd {
        let shared = &self.shared;
        let config = &shared.config;
        let mut background = JoinSet::new();
        tracing::info!(
            workers = config.workers,
            schedule = config.schedule,
            drain = config.drain,
            pipelines = shared.pipelines().by_name.len(),
            "serving"
        );
        self.announce().await;
        background.spawn(listen_for_work(Arc::clone(shared)));
        if config.schedule {
            // The first fire of every schedule comes before any worker looks
            // at the queue, so `drain` never finds it empty before it is
            // filled.
            self.fire_due().await;
            background.spawn(schedule(Arc::clone(shared)));
        }
        let delivering = tokio::spawn(deliver(Arc::clone(shared)));
        let mut workers = JoinSet::new();
        for slot in 0..config.workers {
            workers.spawn(work(Arc::clone(shared), slot));
        }
        while workers.join_next().await.is_some() {}
        background.abort_all();
        // The deliverer ends between two deliveries, never inside one (a
        // notice abandoned mid-claim would stay leased to nobody).
        shared.delivery_stop.store(true, Ordering::SeqCst);
        shared.delivery_wake.notify_waiters();
        let _ = delivering.await;
        // A draining service tells what its last runs changed before it
        // ends, as a command does (bounded; the rest stays queued).
        if !shared.engine.shutdown().requested() {
            let pipelines: Vec<Arc<Pipeline>> =
                shared.pipelines().by_name.values().cloned().collect();
            shared.engine.deliver_notices(&pipelines).await;
        }
        tracing::info!("stopped");
        ServiceEnd {
            lease_lost: shared.lease_lost.load(Ordering::SeqCst),
        }
    }

    /// One scheduler step: fires every scheduled pipeline whose next fire
    /// has come at the engine's clock (none yet: now) and queues what is
    /// due. Returns the earliest next fire.
    pub async fn fire_due(&self) -> Option<DateTime<Utc>> {
        fire_due(&self.shared).await
    }

    /// One worker step: claims the next key this service may run and runs
    /// it to its end; `None` when nothing is claimable now.
    pub async fn work_once(&self) -> Result<Option<Worked>, Error> {
        let shared = &self.shared;
        let pipelines = shared.pipelines();
        let queue = pipelines.queue(shared.engine.now());
        let Some(queued) = shared
            .engine
            .store()
            .claim_next(&queue, &shared.claim_request())
            .await?
        else {
            return Ok(None);
        };
        Ok(Some(run_queued(shared, &pipelines, queued).await))
    }
}

/// What the HTTP endpoints may see of a running [`Service`]: they read,
/// never steer.
#[derive(Clone)]
pub struct ServiceView {
    shared: Arc<Shared>,
}

impl ServiceView {
    /// The service's engine (store, clock, worker identity).
    pub fn engine(&self) -> &Engine {
        &self.shared.engine
    }

    /// The pipelines served now (after the latest reload), by name.
    pub fn pipelines(&self) -> Vec<Arc<Pipeline>> {
        let pipelines = self.shared.pipelines();
        let mut all: Vec<Arc<Pipeline>> = pipelines.by_name.values().cloned().collect();
        all.sort_by(|a, b| a.spec.name.cmp(&b.spec.name));
        all
    }

    /// The service's configuration.
    pub fn config(&self) -> &ServiceConfig {
        &self.shared.config
    }
}

/// A key a worker claimed from the queue, as it was queued, and what
/// happened to it.
#[derive(Debug)]
pub struct Worked {
    /// The pipeline's name.
    pub pipeline: String,
    /// The source.
    pub source: String,
    /// The export type it was queued with.
    pub export_type: String,
    /// Its period's start (RFC 3339, as stored).
    pub period_start: String,
    /// What happened.
    pub outcome: Outcome,
}

impl Worked {
    fn of(queued: &QueuedRun, outcome: Outcome) -> Worked {
        Worked {
            pipeline: queued.pipeline.clone(),
            source: queued.source.clone(),
            export_type: queued.export_type.clone(),
            period_start: queued.period_start.clone(),
            outcome,
        }
    }
}

/// What every task of the service shares.
struct Shared {
    pipelines: RwLock<Arc<Pipelines>>,
    engine: Engine,
    config: ServiceConfig,
    /// Wakes idle workers: a key was queued (by this process, or by any on
    /// PostgreSQL).
    wake: Notify,
    /// Wakes the scheduler: the pipeline files were re-read.
    reloaded: Notify,
    /// Some attempt of this process lost its lease to another (exit 75).
    lease_lost: AtomicBool,
    /// Each scheduled pipeline's next fire.
    next_fires: Mutex<HashMap<String, DateTime<Utc>>>,
    /// The deliverer's stop: set once the workers have ended.
    delivery_stop: AtomicBool,
    /// Wakes the deliverer from its poll to see `delivery_stop`.
    delivery_wake: Notify,
}

impl Shared {
    fn pipelines(&self) -> Arc<Pipelines> {
        match self.pipelines.read() {
            Ok(p) => Arc::clone(&p),
            Err(poisoned) => Arc::clone(&poisoned.into_inner()),
        }
    }

    /// A queue claim: the key's own identity decides the rest.
    fn claim_request(&self) -> ClaimRequest {
        ClaimRequest {
            force: false,
            handler_version: String::new(),
            fields_fingerprint: String::new(),
            provisional: false,
            worker: self.engine.worker().clone(),
            lease_ttl: self.engine.context().lease_ttl,
            // Each queued key's pipeline says who is told (`QueuePipeline`).
            notices: Default::default(),
        }
    }
}

/// The pipelines of the folder, by name, with the file each came from.
#[derive(Default)]
struct Pipelines {
    by_name: HashMap<String, Arc<Pipeline>>,
    files: HashMap<PathBuf, String>,
}

impl Pipelines {
    /// Loads every file; any error is a configuration error (exit 2), as
    /// for every command.
    fn load(catalog: &Catalog, now: DateTime<Utc>) -> Result<Pipelines, Error> {
        let mut pipelines = Pipelines::default();
        for path in catalog.files()? {
            let pipeline = catalog.load_runnable(&path.display().to_string(), now)?;
            pipelines.insert(path, pipeline)?;
        }
        Ok(pipelines)
    }

    /// Re-reads the folder: a changed file replaces its pipeline, a new one
    /// is added, a removed one dropped; a broken one is logged (file and
    /// key) and its previous definition kept.
    fn reload(&self, catalog: &Catalog, now: DateTime<Utc>) -> Pipelines {
        let mut next = Pipelines::default();
        let paths = match catalog.files() {
            Ok(paths) => paths,
            Err(e) => {
                tracing::error!(error = %e, "cannot re-read the pipelines; keeping every definition");
                return self.clone_all();
            }
        };
        for path in paths {
            let loaded = catalog
                .load_runnable(&path.display().to_string(), now)
                .and_then(|p| next.check_unique(&path, &p).map(|()| p));
            match loaded {
                Ok(pipeline) => {
                    let _ = next.insert(path, pipeline);
                }
                Err(e) => {
                    let old = self.files.get(&path).and_then(|n| self.by_name.get(n));
                    tracing::error!(
                        file = %path.display(),
                        error = %e,
                        kept = old.is_some(),
                        "pipeline file is broken; keeping its previous definition"
                    );
                    if let Some(old) = old {
                        let _ = next.insert(path, (**old).clone());
                    }
                }
            }
        }
        next
    }

    fn clone_all(&self) -> Pipelines {
        Pipelines {
            by_name: self.by_name.clone(),
            files: self.files.clone(),
        }
    }

    fn check_unique(&self, path: &std::path::Path, pipeline: &Pipeline) -> Result<(), Error> {
        match self.by_name.get(&pipeline.spec.name) {
            Some(other) => Err(Error::config(
                path.display().to_string(),
                "name",
                format!(
                    "pipeline name {:?} is also used by {}",
                    pipeline.spec.name,
                    other.file_name()
                ),
            )),
            None => Ok(()),
        }
    }

    fn insert(&mut self, path: PathBuf, pipeline: Pipeline) -> Result<(), Error> {
        self.check_unique(&path, &pipeline)?;
        self.files.insert(path, pipeline.spec.name.clone());
        self.by_name
            .insert(pipeline.spec.name.clone(), Arc::new(pipeline));
        Ok(())
    }

    /// What a claim may take at `now` (the clock that decides what is due):
    /// every pipeline, with its handler version and its due cut-off (`now`
    /// minus `period.lag`).
    fn queue(&self, now: DateTime<Utc>) -> Vec<QueuePipeline> {
        let mut queue: Vec<QueuePipeline> = self
            .by_name
            .values()
            .map(|p| QueuePipeline {
                name: p.spec.name.clone(),
                handler_version: p.spec.version.clone(),
                fields_fingerprint: p.fields_fingerprint().as_str().to_string(),
                due_before: chrono::Duration::from_std(p.lag)
                    .ok()
                    .and_then(|lag| now.checked_sub_signed(lag))
                    .unwrap_or(DateTime::<Utc>::MIN_UTC),
                notices: crate::notices::notice_targets(p),
            })
            .collect();
        queue.sort_by(|a, b| a.name.cmp(&b.name));
        queue
    }
}

// ---------------------------------------------------------------------------
// Workers
// ---------------------------------------------------------------------------

/// One worker slot: claim, run, repeat; idle, wait for a wake-up or the
/// poll interval. Ends on a stop request, or with `--drain` once nothing is
/// left for this process.
async fn work(shared: Arc<Shared>, slot: u16) {
    let shutdown = shared.engine.shutdown();
    let health = shared.engine.health();
    let name = format!("worker {slot}");
    // An idle slot looks at the queue at least every poll interval; a
    // claim is a few statements. Silent far longer, it is wedged.
    let bound = shared.config.poll * 3 + WORKER_PATIENCE;
    loop {
        health.tick(&name, bound);
        if shutdown.requested() {
            health.done(&name);
            return;
        }
        let pipelines = shared.pipelines();
        let queue = pipelines.queue(shared.engine.now());
        let request = shared.claim_request();
        match shared.engine.store().claim_next(&queue, &request).await {
            Ok(Some(queued)) => {
                health.busy(&name, bound);
                run_queued(&shared, &pipelines, queued).await;
            }
            Ok(None) => {
                if shared.config.drain && !work_left(&shared, &queue).await {
                    tracing::info!(slot, "nothing left to do: worker done (--drain)");
                    health.done(&name);
                    return;
                }
                idle(&shared).await;
            }
            Err(e) => {
                tracing::warn!(slot, error = %e, "claiming from the queue failed; trying again");
                idle(&shared).await;
            }
        }
    }
}

async fn work_left(shared: &Shared, queue: &[QueuePipeline]) -> bool {
    match shared
        .engine
        .store()
        .work_left(queue, shared.engine.worker())
        .await
    {
        Ok(left) => left,
        Err(e) => {
            tracing::warn!(error = %e, "cannot tell whether work is left; looking again");
            true
        }
    }
}

/// Waits for a wake-up, a stop request, or the poll interval (with up to a
/// tenth of jitter, so idle workers of many processes do not poll in step).
async fn idle(shared: &Shared) {
    let poll = shared.config.poll;
    let jitter = poll.mul_f64(rand::random::<f64>() / 10.0);
    tokio::select! {
        () = shared.wake.notified() => {}
        () = shared.engine.shutdown().wait() => {}
        () = tokio::time::sleep(poll + jitter) => {}
    }
}

/// Runs a claimed key as `run` would.
///
/// A key the pipeline as loaded now cannot run under the identity it was
/// queued with (its source removed, its export type or period changed)
/// fails, class `config`, the reason named, with the failure back-off: it
/// leaves the queue, and the worker takes the next. Handing it back would
/// have it claimed again at once, by this worker or by any other running
/// the same files, in a loop. (Keys of a pipeline this process has not
/// loaded are never claimed by it: another `serve` may run them.)
async fn run_queued(shared: &Shared, pipelines: &Pipelines, queued: QueuedRun) -> Worked {
    let job = match job_of(shared, pipelines, &queued) {
        Ok(job) => job,
        Err(error) => {
            tracing::error!(pipeline = %queued.pipeline, source = %queued.source,
                export_type = %queued.export_type, period = %queued.period_start, error = %error,
                "claimed a key the pipeline cannot run as queued; failing it");
            // The pipeline is loaded (the claim took only keys of loaded
            // pipelines); its retries then record the failure.
            let policy = pipelines.by_name.get(&queued.pipeline).map_or(
                tidemark_core::RetryPolicy {
                    max_attempts: 3,
                    base_delay: Duration::from_millis(100),
                    max_delay: Duration::from_secs(2),
                },
                |p| p.retry,
            );
            let run = &queued.run;
            // Its attempt ends here: the run's one summary line, in the
            // span a run logs in.
            tracing::info_span!(
                "run",
                pipeline = %queued.pipeline,
                source = %queued.source,
                export_type = %queued.export_type,
                period = %queued.period_start,
                run_id = %run.lease.run_id,
                attempt = run.lease.attempt,
            )
            .in_scope(|| crate::run::Summary::unstarted(run).failed(&error));
            let store = shared.engine.store();
            crate::run::record_failure(store, &policy, &run.lease, &run.counts, &error).await;
            return Worked::of(&queued, Outcome::Failed(error));
        }
    };
    let key = job.key.clone();
    let worked = Worked::of(&queued, Outcome::Stopped);
    let outcome = job.run_claimed(queued.run, shared.engine.context()).await;
    match &outcome {
        Outcome::Done(_) => tracing::info!(%key, "period done"),
        Outcome::Interrupted => tracing::info!(%key, "interrupted; handed back to the queue"),
        Outcome::Failed(Error::LeaseLost(why)) => {
            shared.lease_lost.store(true, Ordering::SeqCst);
            tracing::error!(%key, %why, "lease lost: another worker took the key over; this attempt committed nothing more");
        }
        Outcome::Failed(e) => {
            tracing::warn!(%key, class = %e.class(), error = %e, "period failed")
        }
        other => tracing::debug!(%key, outcome = ?other, "not run"),
    }
    Worked { outcome, ..worked }
}

/// The job of a claimed key: its pipeline as loaded now, and its period
/// rebuilt from the stored start.
fn job_of(shared: &Shared, pipelines: &Pipelines, queued: &QueuedRun) -> Result<Job, Error> {
    let pipeline = pipelines.by_name.get(&queued.pipeline).ok_or_else(|| {
        Error::config(
            shared.config.catalog.dir().display().to_string(),
            "pipelines folder",
            format!("no pipeline named {:?} is loaded", queued.pipeline),
        )
    })?;
    let key = queued_key(pipeline, queued)?;
    // The claim decided it: provisional exactly while the period is open,
    // continuing a provisional attempt.
    let flags = RunFlags {
        provisional: queued.provisional,
        ..RunFlags::default()
    };
    let at_once = usize::from(shared.config.workers);
    Ok(shared.engine.job(pipeline, key, flags, at_once))
}

/// The run key a queued (or crashed) key was queued with, rebuilt from the
/// pipeline as loaded now: every part of it must still be what the
/// pipeline runs, or it is a configuration error naming what changed. One
/// run id then never owns rows of two run keys.
fn queued_key(pipeline: &Pipeline, queued: &QueuedRun) -> Result<RunKey, Error> {
    let mismatch = |why: String| Error::config(pipeline.file_name(), "period", why);
    if pipeline.source(&queued.source).is_none() {
        return Err(Error::config(
            pipeline.file_name(),
            "sources",
            format!(
                "no source {:?} any more (the key of period {} was queued for it); cancel its keys or restore the source",
                queued.source, queued.period_start
            ),
        ));
    }
    if pipeline.spec.export_type != queued.export_type {
        return Err(Error::config(
            pipeline.file_name(),
            "export_type",
            format!(
                "the key of source {:?}, period {} was queued for export type {:?}, the pipeline now has {:?}: \
                 its rows would be loaded under the old key; queue the new export type's periods instead",
                queued.source, queued.period_start, queued.export_type, pipeline.spec.export_type
            ),
        ));
    }
    let start = DateTime::parse_from_rfc3339(&queued.period_start)
        .map_err(|e| {
            mismatch(format!(
                "queued period start {:?}: {e}",
                queued.period_start
            ))
        })?
        .with_timezone(&Utc);
    let spec = &pipeline.spec.period;
    let period = Period::from_start(spec.granularity, spec.timezone, start);
    if period.start_rfc3339() != queued.period_start || period.end_rfc3339() != queued.period_end {
        return Err(mismatch(format!(
            "the queued period {} to {} is not a {} period in {} (did the granularity or timezone change?)",
            queued.period_start, queued.period_end, spec.granularity, spec.timezone
        )));
    }
    Ok(RunKey::new(
        &pipeline.spec.name,
        &queued.source,
        &pipeline.spec.export_type,
        period,
    ))
}

/// How often the deliverer looks for notices when it found none.
const DELIVERY_POLL: Duration = Duration::from_secs(1);

/// Delivers the outbox's notices of the pipelines served (ADR 0024) until
/// the shutdown: one at a time, as long as there are any, then a poll.
/// A delivery that fails is the notice's business (it backs off); a
/// database error is logged and tried again.
async fn deliver(shared: Arc<Shared>) {
    let engine = &shared.engine;
    let deliverer =
        match crate::notices::Deliverer::new(engine.store().clone(), engine.worker().owner()) {
            Ok(deliverer) => deliverer.public_url(shared.config.public_url.clone()),
            Err(e) => {
                tracing::error!(error = %e, "cannot deliver notices");
                return;
            }
        };
    loop {
        if engine.shutdown().requested() || shared.delivery_stop.load(Ordering::SeqCst) {
            return;
        }
        let pipelines: Vec<Arc<Pipeline>> = shared.pipelines().by_name.values().cloned().collect();
        let found = match deliverer.deliver_next(&pipelines).await {
            Ok(found) => found.is_some(),
            Err(e) => {
                tracing::warn!(error = %e, "delivering notices failed; trying again");
                false
            }
        };
        if !found {
            tokio::select! {
                () = engine.shutdown().wait() => return,
                () = shared.delivery_wake.notified() => {}
                () = tokio::time::sleep(DELIVERY_POLL) => {}
            }
        }
    }
}

/// Relays queue notifications of every process (PostgreSQL) to the idle
/// workers of this one.
async fn listen_for_work(shared: Arc<Shared>) {
    let mut listener = match shared.engine.store().queue_listener().await {
        Ok(listener) => listener,
        Err(e) => {
            tracing::warn!(error = %e, "cannot listen for queued keys; workers poll");
            return;
        }
    };
    loop {
        listener.recv().await;
        shared.wake.notify_waiters();
    }
}

// ---------------------------------------------------------------------------
// Scheduler
// ---------------------------------------------------------------------------

/// Fires each scheduled pipeline on its schedule (the first fire, at
/// start-up, has happened) and queues what is due.
async fn schedule(shared: Arc<Shared>) {
    let health = shared.engine.health();
    // It sleeps at most a tick between two looks at the clock.
    let bound = SCHEDULER_TICK * 2;
    loop {
        health.tick(SCHEDULER_LOOP, bound);
        let now = shared.engine.now();
        let tick = now + chrono::Duration::from_std(SCHEDULER_TICK).unwrap_or_default();
        let next = next_fire(&shared).unwrap_or(tick);
        let sleep = (next.min(tick) - now).to_std().unwrap_or_default();
        tokio::select! {
            () = tokio::time::sleep(sleep) => {}
            () = shared.reloaded.notified() => {}
            () = shared.engine.shutdown().wait() => {
                health.done(SCHEDULER_LOOP);
                return;
            }
        }
        // Queuing a first fire over many periods takes as long as it takes.
        health.busy(SCHEDULER_LOOP, bound);
        fire_due(&shared).await;
    }
}

/// The earliest next fire of any schedule.
fn next_fire(shared: &Shared) -> Option<DateTime<Utc>> {
    let fires = shared.next_fires.lock().ok()?;
    fires.values().copied().min()
}

/// Fires every scheduled pipeline whose next fire (none yet: now) has
/// come; records the next fires and returns the earliest.
async fn fire_due(shared: &Shared) -> Option<DateTime<Utc>> {
    let now = shared.engine.now();
    let next = shared
        .next_fires
        .lock()
        .map(|fires| fires.clone())
        .unwrap_or_default();
    let mut following = HashMap::new();
    for pipeline in shared.pipelines().by_name.values() {
        let (Some(schedule), Some(_)) = (&pipeline.schedule, pipeline.first_period) else {
            continue;
        };
        let name = &pipeline.spec.name;
        let at = match next.get(name) {
            Some(at) if *at > now => *at,
            _ => {
                if let Err(e) = queue_due(shared, pipeline, now).await {
                    tracing::warn!(pipeline = %name, error = %e, "scheduling failed; trying at the next fire");
                }
                tell_late(shared, pipeline, now).await;
                schedule
                    .next_after(now)
                    .unwrap_or(now + chrono::Duration::from_std(SCHEDULER_TICK).unwrap_or_default())
            }
        };
        following.insert(name.clone(), at);
    }
    let earliest = following.values().copied().min();
    if let Ok(mut fires) = shared.next_fires.lock() {
        *fires = following;
    }
    earliest
}

/// Queues the `late` and `stale` notices of `pipeline` at `now` (see
/// [`crate::notices::queue_late`], [`crate::notices::queue_stale`]); a
/// failure is logged and the next fire looks again.
async fn tell_late(shared: &Shared, pipeline: &Pipeline, now: DateTime<Utc>) {
    let store = shared.engine.store();
    match crate::notices::queue_late(store, pipeline, now).await {
        Ok(0) => {}
        Ok(late) => tracing::info!(pipeline = %pipeline.spec.name, late, "run keys late: told"),
        Err(e) => {
            tracing::warn!(pipeline = %pipeline.spec.name, error = %e, "could not look for late run keys; looking at the next fire");
        }
    }
    match crate::notices::queue_stale(store, pipeline, now).await {
        Ok(0) => {}
        Ok(stale) => tracing::info!(pipeline = %pipeline.spec.name, stale, "run keys stale: told"),
        Err(e) => {
            tracing::warn!(pipeline = %pipeline.spec.name, error = %e, "could not look for stale run keys; looking at the next fire");
        }
    }
}

/// Queues what is due for `pipeline` at `now`, as `sync` would run it (the
/// same plan): never-run periods and failed ones past their backoff fresh,
/// the forced re-runs (lookback, provisional now due) even though done.
/// The plan streams a page at a time and each page is queued in its own
/// transaction (ADR 0014): a first fire over a million due periods holds
/// one page, and workers start on the first page while the rest is queued.
async fn queue_due(
    shared: &Shared,
    pipeline: &Arc<Pipeline>,
    now: DateTime<Utc>,
) -> Result<(), Error> {
    let store = shared.engine.store();
    let sources = crate::catalog::source_ids(pipeline, None)?;
    let mut plan = Planner::new(
        Some(store.clone()),
        Arc::clone(pipeline),
        sources,
        Ask::Sync {
            force: false,
            now: false,
        },
        now,
        false,
    )?;
    let how = plan::QueueAs {
        priority: SCHEDULE_PRIORITY,
        by: EnqueuedBy::Schedule,
        fresh_from: &[RunStatus::Failed],
        forced_from: &[RunStatus::Done],
        respect_backoff: true,
    };
    // Workers start on each page as it is queued.
    let result = plan::enqueue_plan(store, &mut plan, &how, |page_queued| {
        if page_queued > 0 {
            shared.wake.notify_waiters();
        }
    })
    .await;
    let queued = result.as_ref().map_or(0, |(queued, _)| *queued);
    if queued > 0 {
        tracing::info!(pipeline = %pipeline.spec.name, queued, "queued due periods");
    } else if result.is_ok() {
        tracing::debug!(pipeline = %pipeline.spec.name, "nothing due");
    }
    result.map(|_| ())
}
