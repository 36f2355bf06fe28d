//! `tidemark serve`: the long-running service. The ledger is the work
//! queue, shared by any number of `serve` processes on any hosts through
//! one database; there is no broker.
//!
//! - The **scheduler** (unless `--no-schedule`) queues, at each fire of a
//!   pipeline's `[schedule]`, what is due (the same decision as `sync`,
//!   [`crate::due`]). Queuing is idempotent, so N schedulers firing together
//!   queue each key once.
//! - **Workers** (`--workers N` slots for the whole process) claim queued
//!   keys, highest rank first (priority as a head start, so waiting ages a
//!   key), and run each exactly as `run` would. On PostgreSQL a claim skips
//!   keys other claims hold and idle workers wake on LISTEN/NOTIFY; a key
//!   whose holder died is claimed again at once (same host, process gone) or
//!   once its lease has run out.
//! - **Signals**: the first SIGTERM/SIGINT stops claiming and hands the
//!   keys in flight back after their current batch; SIGHUP re-reads the
//!   pipeline files (a broken one is logged and its old definition kept).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use chrono::{DateTime, Utc};
use tidemark_core::{Error, Period, Pipeline, RunKey};
use tidemark_load::{
    ClaimRequest, EnqueuedBy, QueuePipeline, QueuedRun, RunStatus, Store, WorkerId,
};
use tokio::sync::Notify;
use tokio::task::JoinSet;

use crate::cli::{Global, ServeArgs};
use crate::commands::{load_runnable, pipeline_files, worker};
use crate::engine::{Context, Job, Outcome, RunFlags};
use crate::exit::Exit;
use crate::plan::{self, Ask, Planner};

/// The priority of scheduled keys: a day of head start over backfills
/// queued at the same time (each point is a minute).
pub const SCHEDULE_PRIORITY: i64 = 1440;

/// The longest the scheduler sleeps before looking at the clock again.
const SCHEDULER_TICK: Duration = Duration::from_secs(60);

pub async fn serve(global: &Global, args: ServeArgs, ctx: Context) -> Result<Exit, Error> {
    let pipelines = Pipelines::load(global)?;
    if pipelines.by_name.is_empty() {
        return Err(Error::config(
            global.pipelines.display().to_string(),
            "--pipelines",
            "no pipeline files (NAME.toml) in this folder",
        ));
    }
    let store = Store::connect(&global.database_url).await?;
    let shared = Arc::new(Shared {
        pipelines: RwLock::new(Arc::new(pipelines)),
        store,
        worker: worker(),
        ctx,
        poll: args.poll_interval,
        drain: args.drain,
        wake: Notify::new(),
        reloaded: Notify::new(),
        lease_lost: AtomicBool::new(false),
        global: global.clone(),
    });
    let mut background = JoinSet::new();
    // Listening before anything is logged, so a SIGHUP sent once `serving`
    // shows is never missed (nor takes the default action: exit).
    background.spawn(reload_on_sighup(Arc::clone(&shared), hangups()));
    tracing::info!(
        workers = args.workers,
        schedule = !args.no_schedule,
        drain = args.drain,
        pipelines = shared.pipelines().by_name.len(),
        "serving"
    );
    background.spawn(listen_for_work(Arc::clone(&shared)));
    if !args.no_schedule {
        // The first fire of every schedule comes before any worker looks at
        // the queue, so `--drain` never finds it empty before it is filled.
        let next = fire_due(&shared, &HashMap::new()).await;
        background.spawn(schedule(Arc::clone(&shared), next));
    }
    let mut workers = JoinSet::new();
    for slot in 0..args.workers {
        workers.spawn(work(Arc::clone(&shared), slot));
    }
    while workers.join_next().await.is_some() {}
    background.abort_all();
    shared.store.close().await;
    tracing::info!("stopped");
    Ok(if shared.lease_lost.load(Ordering::SeqCst) {
        Exit::Held
    } else {
        Exit::Success
    })
}

/// What every task of the service shares.
struct Shared {
    pipelines: RwLock<Arc<Pipelines>>,
    store: Store,
    worker: WorkerId,
    ctx: Context,
    poll: Duration,
    drain: bool,
    /// Wakes idle workers: a key was queued (by this process, or by any on
    /// PostgreSQL).
    wake: Notify,
    /// Wakes the scheduler: the pipeline files were re-read.
    reloaded: Notify,
    /// Some attempt of this process lost its lease to another (exit 75).
    lease_lost: AtomicBool,
    /// The command line, for re-reading the pipeline files.
    global: Global,
}

impl Shared {
    fn pipelines(&self) -> Arc<Pipelines> {
        match self.pipelines.read() {
            Ok(p) => Arc::clone(&p),
            Err(poisoned) => Arc::clone(&poisoned.into_inner()),
        }
    }
}

/// The pipelines of the `--pipelines` folder, by name, with the file each
/// came from.
#[derive(Default)]
struct Pipelines {
    by_name: HashMap<String, Arc<Pipeline>>,
    files: HashMap<PathBuf, String>,
}

impl Pipelines {
    /// Loads every file; any error is a configuration error (exit 2), as
    /// for every command.
    fn load(global: &Global) -> Result<Pipelines, Error> {
        let mut pipelines = Pipelines::default();
        for path in pipeline_files(&global.pipelines)? {
            let pipeline = load_runnable(global, &path.display().to_string())?;
            pipelines.insert(path, pipeline)?;
        }
        Ok(pipelines)
    }

    /// Re-reads the folder: a changed file replaces its pipeline, a new one
    /// is added, a removed one dropped; a broken one is logged (file and
    /// key) and its previous definition kept.
    fn reload(&self, global: &Global) -> Pipelines {
        let mut next = Pipelines::default();
        let paths = match pipeline_files(&global.pipelines) {
            Ok(paths) => paths,
            Err(e) => {
                tracing::error!(error = %e, "cannot re-read the pipelines; keeping every definition");
                return self.clone_all();
            }
        };
        for path in paths {
            let loaded = load_runnable(global, &path.display().to_string())
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
    let shutdown = &shared.ctx.shutdown;
    loop {
        if shutdown.requested() {
            return;
        }
        let pipelines = shared.pipelines();
        let now = crate::clock::now().unwrap_or_else(|_| Utc::now());
        let queue = pipelines.queue(now);
        let request = ClaimRequest {
            force: false,
            handler_version: String::new(),
            fields_fingerprint: String::new(),
            provisional: false,
            worker: shared.worker.clone(),
            lease_ttl: shared.ctx.lease_ttl,
        };
        match shared.store.claim_next(&queue, &request).await {
            Ok(Some(queued)) => run_queued(&shared, &pipelines, queued).await,
            Ok(None) => {
                if shared.drain && !work_left(&shared, &queue).await {
                    tracing::info!(slot, "nothing left to do: worker done (--drain)");
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
    match shared.store.work_left(queue, &shared.worker).await {
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
    let jitter = shared.poll.mul_f64(rand::random::<f64>() / 10.0);
    tokio::select! {
        () = shared.wake.notified() => {}
        () = shared.ctx.shutdown.wait() => {}
        () = tokio::time::sleep(shared.poll + jitter) => {}
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
async fn run_queued(shared: &Shared, pipelines: &Pipelines, queued: QueuedRun) {
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
            crate::engine::record_failure(&shared.store, &policy, &run.lease, &run.counts, &error)
                .await;
            return;
        }
    };
    let key = job.key.clone();
    match job.run_claimed(queued.run, &shared.ctx).await {
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
}

/// The job of a claimed key: its pipeline as loaded now, and its period
/// rebuilt from the stored start.
fn job_of(shared: &Shared, pipelines: &Pipelines, queued: &QueuedRun) -> Result<Job, Error> {
    let pipeline = pipelines.by_name.get(&queued.pipeline).ok_or_else(|| {
        Error::config(
            shared.global.pipelines.display().to_string(),
            "--pipelines",
            format!("no pipeline named {:?} is loaded", queued.pipeline),
        )
    })?;
    let key = queued_key(pipeline, queued)?;
    Ok(Job {
        store: shared.store.clone(),
        pipeline: Arc::clone(pipeline),
        source_id: queued.source.clone(),
        key,
        worker: shared.worker.clone(),
        // The claim decided it: provisional exactly while the period is
        // open, continuing a provisional attempt.
        flags: RunFlags {
            provisional: queued.provisional,
            ..RunFlags::default()
        },
    })
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

/// Relays queue notifications of every process (PostgreSQL) to the idle
/// workers of this one.
async fn listen_for_work(shared: Arc<Shared>) {
    let mut listener = match shared.store.queue_listener().await {
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
async fn schedule(shared: Arc<Shared>, mut next: HashMap<String, DateTime<Utc>>) {
    loop {
        let now = crate::clock::now().unwrap_or_else(|_| Utc::now());
        let tick = now + chrono::Duration::from_std(SCHEDULER_TICK).unwrap_or_default();
        let wake_at = next.values().copied().min().unwrap_or(tick).min(tick);
        let sleep = (wake_at - now).to_std().unwrap_or_default();
        tokio::select! {
            () = tokio::time::sleep(sleep) => {}
            () = shared.reloaded.notified() => {}
            () = shared.ctx.shutdown.wait() => return,
        }
        next = fire_due(&shared, &next).await;
    }
}

/// Fires every scheduled pipeline whose next fire (`next`; none yet: now)
/// has come; returns the next fires.
async fn fire_due(
    shared: &Shared,
    next: &HashMap<String, DateTime<Utc>>,
) -> HashMap<String, DateTime<Utc>> {
    let now = match crate::clock::now() {
        Ok(now) => now,
        Err(e) => {
            tracing::error!(error = %e, "no clock: not scheduling");
            return next.clone();
        }
    };
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
                schedule
                    .next_after(now)
                    .unwrap_or(now + chrono::Duration::from_std(SCHEDULER_TICK).unwrap_or_default())
            }
        };
        following.insert(name.clone(), at);
    }
    following
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
    let store = &shared.store;
    let sources = crate::commands::source_ids(pipeline, None)?;
    let mut plan = Planner::new(
        Some(store.clone()),
        Arc::clone(pipeline),
        sources,
        Ask::Sync { force: false },
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

// ---------------------------------------------------------------------------
// SIGHUP
// ---------------------------------------------------------------------------

/// The stream of SIGHUPs, registered now.
#[cfg(unix)]
fn hangups() -> Option<tokio::signal::unix::Signal> {
    use tokio::signal::unix::{signal, SignalKind};
    let hangups = signal(SignalKind::hangup()).ok();
    if hangups.is_none() {
        tracing::warn!("cannot listen for SIGHUP; pipeline files are read once");
    }
    hangups
}

#[cfg(not(unix))]
fn hangups() -> Option<()> {
    None
}

/// Re-reads the pipeline files on every SIGHUP.
#[cfg(unix)]
async fn reload_on_sighup(shared: Arc<Shared>, hangups: Option<tokio::signal::unix::Signal>) {
    {
        let Some(mut hangup) = hangups else {
            return;
        };
        while hangup.recv().await.is_some() {
            let next = shared.pipelines().reload(&shared.global);
            tracing::info!(
                pipelines = next.by_name.len(),
                "SIGHUP: pipeline files re-read"
            );
            match shared.pipelines.write() {
                Ok(mut current) => *current = Arc::new(next),
                Err(poisoned) => *poisoned.into_inner() = Arc::new(next),
            }
            shared.reloaded.notify_waiters();
            shared.wake.notify_waiters();
        }
    }
}

#[cfg(not(unix))]
async fn reload_on_sighup(_shared: Arc<Shared>, _hangups: Option<()>) {}
