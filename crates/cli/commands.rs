//! One function per command. Pipelines are loaded and checked before any
//! database is opened, so a configuration error touches nothing.

use std::path::PathBuf;
use std::sync::Arc;

use tidemark_core::{Error, ErrorClass, Period, Pipeline, RawRecord, RunKey};
use tidemark_load::{EnqueuedBy, RunStatus, Store, WorkerId};

use crate::cli::{
    BackfillArgs, CancelArgs, Cli, Command, Global, PruneArgs, RunArgs, RunOptions, SyncArgs,
    ValidateArgs,
};
use crate::dry_run::{self, Target};
use crate::engine::{Context, Job, Outcome, RunFlags};
use crate::exit::Exit;
use crate::output;
use crate::plan::{self, Ask, Intent, PeriodRange, Planned, Planner};
use crate::prepare::ABSENT_NOTE;
use crate::shutdown;

/// Runs the command; `Ok(exit)` once something ran. Commands that run
/// periods stop gracefully on a first SIGTERM/SIGINT.
pub async fn dispatch(cli: Cli) -> Result<Exit, Error> {
    let global = &cli.global;
    let ctx = |timeout| Context {
        shutdown: shutdown::on_signals(timeout),
        lease_ttl: global.lease_ttl,
    };
    match cli.command {
        Command::Run(args) => run(global, args, &ctx(shutdown::DEFAULT_TIMEOUT)).await,
        Command::Backfill(args) if args.enqueue => enqueue(global, args).await,
        Command::Backfill(args) => backfill(global, args, &ctx(shutdown::DEFAULT_TIMEOUT)).await,
        Command::Sync(args) => sync(global, args, &ctx(shutdown::DEFAULT_TIMEOUT)).await,
        Command::Serve(args) => {
            let ctx = ctx(args.shutdown_timeout);
            crate::serve::serve(global, args, ctx).await
        }
        Command::Cancel(args) => cancel(global, args).await,
        Command::Status(args) => crate::status::status(&cli.global, args).await,
        Command::Validate(args) => validate(&cli.global, &args).await,
        Command::Prune(args) => prune(&cli.global, args).await,
        Command::Migrate => {
            Store::connect(&cli.global.database_url)
                .await?
                .migrate()
                .await?;
            tell!("ledger migrations applied");
            Ok(Exit::Success)
        }
    }
}

/// `NAME` → `DIR/NAME.toml`; anything ending in `.toml` is a path.
pub fn pipeline_path(global: &Global, name: &str) -> PathBuf {
    if name.ends_with(".toml") || name.contains('/') {
        PathBuf::from(name)
    } else {
        global.pipelines.join(format!("{name}.toml"))
    }
}

/// Loads and checks a pipeline, without its secrets: what commands that
/// only read or tidy the ledger need (`status`). An unset `${NAME}`
/// matters only to commands that contact the source.
///
/// The clock is part of the configuration every command loads: a
/// `TIDEMARK_NOW` that is no time, or a schedule that does not fire after
/// it, stops the command here (exit 2) before any database is opened, and
/// keeps `serve`'s previous definition on a SIGHUP.
pub fn load_pipeline(global: &Global, name: &str) -> Result<Pipeline, Error> {
    let pipeline = read_pipeline(global, name)?;
    pipeline.check_schedule(crate::clock::now()?)?;
    Ok(pipeline)
}

fn read_pipeline(global: &Global, name: &str) -> Result<Pipeline, Error> {
    let path = pipeline_path(global, name);
    if !path.exists() {
        return Err(Error::config(
            path.display().to_string(),
            "(file)",
            format!(
                "no pipeline file (looked for {}; pass a name from {} or a path to a .toml file)",
                path.display(),
                global.pipelines.display()
            ),
        ));
    }
    Pipeline::load(&path)
}

/// Loads a pipeline that is about to contact its sources: every `${ENV}`
/// its templates read must be set.
pub fn load_runnable(global: &Global, name: &str) -> Result<Pipeline, Error> {
    let pipeline = load_pipeline(global, name)?;
    pipeline.check_env()?;
    Ok(pipeline)
}

/// Loads a pipeline for `run`, `backfill` or `sync`. A dry run contacts no
/// source, so an unset `${NAME}` does not stop it; it is reported, because
/// the real command would stop there (exit 2).
fn load_for(global: &Global, name: &str, dry_run: bool) -> Result<Pipeline, Error> {
    if !dry_run {
        return load_runnable(global, name);
    }
    let pipeline = load_pipeline(global, name)?;
    if let Err(e) = pipeline.check_env() {
        tell!("warning: {e} (without --dry-run the command would stop here, with exit 2)");
    }
    Ok(pipeline)
}

pub(crate) fn source_ids(pipeline: &Pipeline, only: Option<&str>) -> Result<Vec<String>, Error> {
    match only {
        None => Ok(pipeline
            .spec
            .sources
            .iter()
            .map(|s| s.id().to_string())
            .collect()),
        Some(id) if pipeline.source(id).is_some() => Ok(vec![id.to_string()]),
        Some(id) => Err(Error::config(
            pipeline.file_name(),
            "--source",
            format!(
                "no source with id {id:?} (sources: {})",
                source_ids(pipeline, None)?.join(", ")
            ),
        )),
    }
}

/// This process as a lease holder: host, pid and an id of this start, the
/// same for every run of the process.
pub(crate) fn worker() -> WorkerId {
    static WORKER: std::sync::OnceLock<WorkerId> = std::sync::OnceLock::new();
    WORKER
        .get_or_init(|| WorkerId {
            host: gethostname::gethostname().to_string_lossy().into_owned(),
            pid: std::process::id(),
            instance: uuid::Uuid::new_v4().simple().to_string()[..8].to_string(),
        })
        .clone()
}

/// The flags a planned run key's job runs with.
pub(crate) fn flags_of(planned: &Planned, options: &RunOptions, wait: bool) -> RunFlags {
    RunFlags {
        force: matches!(planned.intent, Intent::Claim(Some(_))),
        force_deletes: options.force_deletes,
        wait,
        provisional: planned.provisional,
    }
}

/// The jobs of a page of a plan: one per run key it claims.
fn jobs(
    store: &Store,
    pipeline: &Arc<Pipeline>,
    planned: &[Planned],
    options: &RunOptions,
    wait: bool,
) -> Vec<Job> {
    let worker = worker();
    planned
        .iter()
        .filter(|p| matches!(p.intent, Intent::Claim(_)))
        .map(|p| Job {
            store: store.clone(),
            pipeline: Arc::clone(pipeline),
            source_id: p.source.clone(),
            key: p.key.clone(),
            worker: worker.clone(),
            flags: flags_of(p, options, wait),
        })
        .collect()
}

/// How far a streamed plan got: the keys it planned, the jobs it made of
/// them, and the ledger read that stopped it, if one did.
#[derive(Default)]
struct Fed {
    keys: usize,
    jobs: usize,
    error: Option<Error>,
}

/// The jobs of `planners`' plans (one after the other), a page at a time as
/// the runs take them: a backfill or `sync` of a million periods holds a
/// page of jobs, not a million (ADR 0014). A page whose ledger read fails
/// (after the retries) ends the stream; `fed` keeps the error.
fn job_pages<'a>(
    store: &'a Store,
    planners: Vec<Planner>,
    options: &'a RunOptions,
    wait: bool,
    fed: &'a std::sync::Mutex<Fed>,
) -> impl futures_util::Stream<Item = Vec<Job>> + 'a {
    let planners: std::collections::VecDeque<Planner> = planners.into();
    futures_util::stream::unfold(planners, move |mut planners| async move {
        loop {
            let planner = planners.front_mut()?;
            match planner.next_page().await {
                Ok(Some(page)) => {
                    let jobs = jobs(store, planner.pipeline(), &page, options, wait);
                    if let Ok(mut fed) = fed.lock() {
                        fed.keys += page.len();
                        fed.jobs += jobs.len();
                    }
                    return Some((jobs, planners));
                }
                Ok(None) => {
                    planners.pop_front();
                }
                Err(e) => {
                    if let Ok(mut fed) = fed.lock() {
                        fed.error = Some(e);
                    }
                    return None;
                }
            }
        }
    })
}

async fn run(global: &Global, args: RunArgs, ctx: &Context) -> Result<Exit, Error> {
    let pipeline = Arc::new(load_for(global, &args.pipeline, args.dry_run)?);
    let period = PeriodRange::one(pipeline.period(&args.period)?);
    let sources = source_ids(&pipeline, args.options.source.as_deref())?;
    let now = crate::clock::now()?;
    plan::refuse_open(&pipeline, period, "--period", now, args.allow_open)?;
    let ask = Ask::Periods {
        range: period,
        only: None,
        force: args.options.force,
    };
    if args.dry_run {
        let target = Target {
            pipeline,
            sources,
            ask,
        };
        return dry_run::show(global, vec![target], &args.options, now).await;
    }
    let store = Store::connect(&global.database_url).await?;
    // One period: its plan is one page.
    let planned = async {
        let mut planner = Planner::new(
            Some(store.clone()),
            Arc::clone(&pipeline),
            sources,
            ask,
            now,
            false,
        )?;
        let mut planned = Vec::new();
        while let Some(page) = planner.next_page().await? {
            planned.extend(page);
        }
        Ok::<_, Error>(planned)
    }
    .await;
    let mut exits = Vec::new();
    let planned = match planned {
        Ok(planned) => planned,
        Err(e) => {
            store.close().await;
            return Err(e);
        }
    };
    for job in jobs(&store, &pipeline, &planned, &args.options, args.wait) {
        let key = job.key.clone();
        let outcome = job.run(ctx).await;
        output::print_outcome(&key, &outcome);
        exits.push(Exit::of_outcome(&outcome));
    }
    store.close().await;
    Ok(Exit::worst(exits))
}

/// Runs jobs `concurrency` at a time (with a progress bar when `progress`
/// and stderr is a terminal), handing each outcome to `each` as its run
/// finishes instead of keeping them all: a backfill's summary streams. The
/// jobs come a page at a time (see [`job_pages`]): the next page is planned
/// when the runs need it.
pub async fn run_jobs(
    pages: impl futures_util::Stream<Item = Vec<Job>>,
    concurrency: usize,
    progress: bool,
    ctx: &Context,
    mut each: impl FnMut(RunKey, Outcome),
) {
    use futures_util::StreamExt;

    let progress = if progress {
        output::progress_bar(0, "run keys")
    } else {
        indicatif::ProgressBar::hidden()
    };
    // A run that finds the database unable to store anything more stops
    // the command from claiming further work: every other period would fail
    // the same way (or wait on locks), and nothing is gained by trying.
    let stopped: std::sync::Mutex<Option<String>> = std::sync::Mutex::new(None);
    let stopped = &stopped;
    let bar = progress.clone();
    let jobs = pages.flat_map(move |page| {
        bar.inc_length(page.len() as u64);
        futures_util::stream::iter(page)
    });
    let outcomes = jobs
        .map(|job| {
            let progress = progress.clone();
            async move {
                let key = job.key.clone();
                let reason = stopped.lock().ok().and_then(|s| s.clone());
                let outcome = match reason {
                    Some(reason) => Outcome::NotRun { reason },
                    None => job.run(ctx).await,
                };
                if let Outcome::Failed(error @ Error::Storage { .. }) = &outcome {
                    if let Ok(mut stop) = stopped.lock() {
                        stop.get_or_insert_with(|| {
                            format!("stopped claiming work after {key} failed: {error}")
                        });
                    }
                }
                progress.inc(1);
                (key, outcome)
            }
        })
        .buffer_unordered(concurrency.max(1));
    let mut outcomes = std::pin::pin!(outcomes);
    while let Some((key, outcome)) = outcomes.next().await {
        progress.suspend(|| each(key, outcome));
    }
    progress.finish_and_clear();
}

/// The periods `--from` to `--to` name, both included.
fn backfill_periods(pipeline: &Pipeline, args: &BackfillArgs) -> Result<PeriodRange, Error> {
    let (from, to) = pipeline.period_range(&args.from, &args.to)?;
    Ok(PeriodRange { from, to })
}

async fn backfill(global: &Global, args: BackfillArgs, ctx: &Context) -> Result<Exit, Error> {
    let pipeline = Arc::new(load_for(global, &args.pipeline, args.dry_run)?);
    let range = backfill_periods(&pipeline, &args)?;
    let sources = source_ids(&pipeline, args.options.source.as_deref())?;
    let now = crate::clock::now()?;
    plan::refuse_open(&pipeline, range, "--to", now, args.allow_open)?;
    let ask = Ask::Periods {
        range,
        only: args.only,
        force: args.options.force,
    };
    if args.dry_run {
        let target = Target {
            pipeline,
            sources,
            ask,
        };
        return dry_run::show(global, vec![target], &args.options, now).await;
    }
    let store = Store::connect(&global.database_url).await?;
    let planner = Planner::new(Some(store.clone()), pipeline, sources, ask, now, false)?;
    let concurrency = crate::cli::concurrency(args.concurrency, &global.database_url);
    let mut summary = output::Summary::default();
    let fed = std::sync::Mutex::new(Fed::default());
    let pages = job_pages(&store, vec![planner], &args.options, false, &fed);
    run_jobs(pages, concurrency, true, ctx, |key, outcome| {
        summary.add(&key, &outcome);
    })
    .await;
    store.close().await;
    let fed = fed.into_inner().unwrap_or_default();
    let exit = summary.finish();
    if let Some(error) = fed.error {
        return Err(error);
    }
    if let Some(only) = args.only {
        say!(
            "{} run key(s) of the range left alone (not {})",
            fed.keys - fed.jobs,
            only.name()
        );
    }
    Ok(exit)
}

/// Every pipeline file in the pipelines folder, loaded and checked (for a
/// dry run without requiring their secrets: see [`load_for`]).
fn pipelines_in_folder(global: &Global, dry_run: bool) -> Result<Vec<Pipeline>, Error> {
    pipeline_files(&global.pipelines)?
        .iter()
        .map(|p| load_for(global, &p.display().to_string(), dry_run))
        .collect()
}

/// The pipeline files (`*.toml`) of a folder, sorted.
pub fn pipeline_files(dir: &std::path::Path) -> Result<Vec<PathBuf>, Error> {
    let entries = std::fs::read_dir(dir).map_err(|e| {
        Error::config(
            dir.display().to_string(),
            "--pipelines",
            format!("cannot list pipelines: {e}"),
        )
    })?;
    let mut paths: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "toml"))
        .collect();
    paths.sort();
    Ok(paths)
}

async fn sync(global: &Global, args: SyncArgs, ctx: &Context) -> Result<Exit, Error> {
    let pipelines = if args.all {
        pipelines_in_folder(global, args.dry_run)?
    } else {
        args.names
            .iter()
            .map(|n| load_for(global, n, args.dry_run))
            .collect::<Result<Vec<_>, _>>()?
    };
    for pipeline in &pipelines {
        if pipeline.first_period.is_none() {
            return Err(Error::config(
                pipeline.file_name(),
                "period.start",
                "sync needs the first period: set period.start",
            ));
        }
        source_ids(pipeline, args.options.source.as_deref())?;
    }
    let now = crate::clock::now()?;
    let ask = Ask::Sync {
        force: args.options.force,
    };
    let targets = pipelines
        .into_iter()
        .map(|pipeline| {
            Ok(Target {
                sources: source_ids(&pipeline, args.options.source.as_deref())?,
                pipeline: Arc::new(pipeline),
                ask: ask.clone(),
            })
        })
        .collect::<Result<Vec<_>, Error>>()?;
    if args.dry_run {
        return dry_run::show(global, targets, &args.options, now).await;
    }
    let store = Store::connect(&global.database_url).await?;
    // The due periods not done yet, plus forced re-runs of the last
    // `lookback` done ones and of provisional ones now due (see `plan`).
    let planners = targets
        .into_iter()
        .map(|t| {
            Planner::new(
                Some(store.clone()),
                t.pipeline,
                t.sources,
                t.ask,
                now,
                false,
            )
        })
        .collect::<Result<Vec<_>, Error>>();
    let planners = match planners {
        Ok(planners) => planners,
        Err(e) => {
            store.close().await;
            return Err(e);
        }
    };
    let concurrency = crate::cli::concurrency(args.concurrency, &global.database_url);
    let mut summary = output::Summary::default();
    let fed = std::sync::Mutex::new(Fed::default());
    let pages = job_pages(&store, planners, &args.options, false, &fed);
    run_jobs(pages, concurrency, true, ctx, |key, outcome| {
        summary.add(&key, &outcome);
    })
    .await;
    store.close().await;
    let fed = fed.into_inner().unwrap_or_default();
    if fed.jobs == 0 {
        if let Some(error) = fed.error {
            return Err(error);
        }
        say!("nothing due: every period up to now is done");
        return Ok(Exit::Success);
    }
    let exit = summary.finish();
    match fed.error {
        Some(error) => Err(error),
        None => Ok(exit),
    }
}

/// `backfill --enqueue`: the keys the backfill would take (its plan: the
/// range, `--only`, `--force`) go into the work queue, one statement per
/// chunk of keys, and the command returns at once.
async fn enqueue(global: &Global, args: BackfillArgs) -> Result<Exit, Error> {
    if args.dry_run || args.allow_open {
        let flag = if args.dry_run {
            "--dry-run"
        } else {
            "--allow-open"
        };
        return Err(Error::config(
            "command line",
            flag,
            format!(
                "{flag} does not go with --enqueue: run the periods directly (without --enqueue)"
            ),
        ));
    }
    // Whoever works the queue needs the source's secrets; queuing does not.
    let pipeline = Arc::new(load_pipeline(global, &args.pipeline)?);
    let range = backfill_periods(&pipeline, &args)?;
    let sources = source_ids(&pipeline, args.options.source.as_deref())?;
    let now = crate::clock::now()?;
    // A worker runs a queued key as due: an open period is not queued.
    plan::refuse_open(&pipeline, range, "--to", now, false)?;
    let ask = Ask::Periods {
        range,
        only: args.only,
        force: args.options.force,
    };
    let store = Store::connect(&global.database_url).await?;
    let plan = Planner::new(
        Some(store.clone()),
        Arc::clone(&pipeline),
        sources,
        ask,
        now,
        false,
    );
    let queued = match plan {
        Ok(plan) => queue_plan(&store, plan, args.priority).await,
        Err(e) => Err(e),
    };
    store.close().await;
    let (queued, considered) = queued?;
    say!(
        "queued {queued} run key(s) of pipeline {} at priority {}; {} left as they were (already queued, running{})",
        pipeline.spec.name,
        args.priority,
        considered.saturating_sub(queued),
        if args.options.force || args.only.is_some() { "" } else { " or done" },
    );
    Ok(Exit::Success)
}

/// Queues what `plan` plans ([`plan::enqueue_plan`]): keys it claims as
/// usual go in fresh (new, or again if failed or cancelled); keys it forces
/// (`--force`, `--only all`, `--only stale`) go in even when done. Returns
/// (queued, keys planned).
async fn queue_plan(store: &Store, mut plan: Planner, priority: i64) -> Result<(u64, u64), Error> {
    let how = plan::QueueAs {
        priority,
        by: EnqueuedBy::Backfill,
        fresh_from: &[RunStatus::Failed, RunStatus::Cancelled],
        forced_from: &[RunStatus::Done, RunStatus::Failed, RunStatus::Cancelled],
        respect_backoff: false,
    };
    plan::enqueue_plan(store, &mut plan, &how, |_| {}).await
}

/// `cancel`: pending keys leave the queue; running ones finish.
async fn cancel(global: &Global, args: CancelArgs) -> Result<Exit, Error> {
    let pipeline = load_pipeline(global, &args.pipeline)?;
    let range = match (&args.from, &args.to) {
        (Some(from), Some(to)) => {
            let (from, to) = pipeline.period_range(from, to)?;
            Some((from.start_rfc3339(), to.start_rfc3339()))
        }
        _ => None,
    };
    if let Some(source) = &args.source {
        source_ids(&pipeline, Some(source))?;
    }
    let store = Store::connect(&global.database_url).await?;
    let cancelled = store
        .cancel(
            &pipeline.spec.name,
            args.source.as_deref(),
            range.as_ref().map(|(from, _)| from.as_str()),
            range.as_ref().map(|(_, to)| to.as_str()),
        )
        .await;
    store.close().await;
    say!(
        "cancelled {} pending run key(s) of pipeline {}",
        cancelled?,
        pipeline.spec.name
    );
    Ok(Exit::Success)
}

async fn validate(global: &Global, args: &ValidateArgs) -> Result<Exit, Error> {
    let mut exits = Vec::new();
    for name in &args.names {
        match load_runnable(global, name).and_then(|p| check_fields(&p).map(|()| p)) {
            Ok(p) => {
                say!(
                    "ok: {} (pipeline {}, {} source(s), {} field(s), table {})",
                    p.file_name(),
                    p.spec.name,
                    p.spec.sources.len(),
                    p.spec.fields.len(),
                    p.spec.load.table
                );
                if args.check_source {
                    exits.push(check_sources(&p, args.period.as_deref()).await);
                }
            }
            Err(e) => {
                tell!("error: {e}");
                exits.push(Exit::Usage);
            }
        }
    }
    Ok(Exit::worst(exits))
}

/// Compiles `[fields]` for every source, as a run would: a `default` that
/// does not fit its type, or a `value` that does not, is a configuration
/// error now rather than a failed run later.
fn check_fields(pipeline: &Pipeline) -> Result<(), Error> {
    let period = pipeline.first_period.unwrap_or_else(|| {
        Period::containing_instant(
            pipeline.spec.period.granularity,
            pipeline.spec.period.timezone,
            chrono::Utc::now(),
        )
    });
    for source in &pipeline.spec.sources {
        tidemark_transform::Transformer::new(pipeline, source.id(), &period)?;
    }
    Ok(())
}

/// `validate --check-source`: the first page of each source, and how its
/// first record maps to the fields. Nothing is written.
async fn check_sources(pipeline: &Pipeline, period: Option<&str>) -> Exit {
    let period = match period {
        Some(text) => match pipeline.period(text) {
            Ok(p) => p,
            Err(e) => {
                tell!("error: {e}");
                return Exit::Usage;
            }
        },
        None => Period::containing_instant(
            pipeline.spec.period.granularity,
            pipeline.spec.period.timezone,
            chrono::Utc::now(),
        ),
    };
    let mut exits = Vec::new();
    for source in &pipeline.spec.sources {
        let checked = async {
            let page =
                tidemark_extract::SourceReader::first_page(pipeline, source, &period).await?;
            let transformer = tidemark_transform::Transformer::new(pipeline, source.id(), &period)?;
            Ok::<_, Error>((page, transformer))
        }
        .await;
        match checked {
            Ok((page, transformer)) => {
                say!(
                    "  source {}: {} record(s) on the first page of {} ({})",
                    source.id(),
                    page.records,
                    period.label(),
                    page.resource
                );
                if let Some(record) = &page.first {
                    show_first_record(&transformer, record);
                }
            }
            Err(e) => {
                tell!("error: source {}: {e}", source.id());
                exits.push(if e.class() == ErrorClass::Config {
                    Exit::Usage
                } else {
                    Exit::Failed
                });
            }
        }
    }
    Exit::worst(exits)
}

/// How the first record maps to the fields, each value as it would load.
/// A field the (JSON) record lacks carries the note a run logs for it, so
/// a NULL there reads as what it is: possibly renamed or removed upstream.
fn show_first_record(transformer: &tidemark_transform::Transformer, record: &RawRecord) {
    let mut presence = transformer.presence();
    match transformer.transform_noting(record, &mut presence) {
        Ok(row) => {
            let absent = transformer.absent_fields(&presence);
            for (name, value) in transformer.names().iter().zip(&row.values) {
                let shown = value.canonical_text().unwrap_or_else(|| "NULL".into());
                if absent.contains(&name.as_str()) {
                    say!("    {name} = {shown}  (absent from the record: {ABSENT_NOTE})");
                } else {
                    say!("    {name} = {shown}");
                }
            }
        }
        Err(e) => say!("    the first record does not map: {e}"),
    }
}

async fn prune(global: &Global, args: PruneArgs) -> Result<Exit, Error> {
    let store = Store::connect(&global.database_url).await?;
    let (attempts, rejects) = store.prune(args.older_than).await?;
    store.close().await;
    say!("pruned {attempts} attempt record(s) and {rejects} rejected record(s)");
    Ok(Exit::Success)
}
