//! One function per command. Pipelines are loaded and checked before any
//! database is opened, so a configuration error touches nothing.

use std::sync::Arc;

use tidemark_core::{Error, ErrorClass, Period, Pipeline, RawRecord};
use tidemark_engine::plan::{self, Ask, PeriodRange, Planner};
use tidemark_engine::{
    Catalog, Connections, Engine, MarkAs, Outcome, RunEvent, RunMany, Shutdown, Target, ABSENT_NOTE,
};

use crate::cli::{
    BackfillArgs, CancelArgs, Cli, Command, MarkArgs, MarkAsArg, NotifyAction, NotifyArgs,
    PruneArgs, RunArgs, SyncArgs, ValidateArgs,
};
use crate::exit::Exit;
use crate::setup::{range, source_ids, Setup};
use crate::{output, preview, signals};

/// Runs the command; `Ok(exit)` once something ran. Commands that run
/// periods stop gracefully on a first SIGTERM/SIGINT.
pub async fn dispatch(cli: Cli) -> Result<Exit, Error> {
    let global = &cli.global;
    let setup = Setup {
        global,
        clock: crate::clock::from_env()?,
        catalog: Catalog::new(&global.pipelines),
    };
    let signals = || signals::on_signals(signals::DEFAULT_TIMEOUT);
    match cli.command {
        Command::Run(args) => run(&setup, args, signals).await,
        Command::Backfill(args) if args.enqueue => enqueue(&setup, args).await,
        Command::Backfill(args) => backfill(&setup, args, signals).await,
        Command::Sync(args) => sync(&setup, args, signals).await,
        Command::Serve(args) => crate::serve::serve(&setup, args).await,
        Command::Cancel(args) => cancel(&setup, args).await,
        Command::Mark(args) => mark(&setup, args).await,
        Command::Status(args) => crate::status::status(&setup, args).await,
        Command::Validate(args) => validate(&setup, &args).await,
        Command::Prune(args) => prune(&setup, args).await,
        Command::Notify(args) => notify(&setup, args).await,
        Command::Migrate => {
            setup.connect(Connections::runs(0)).await?.migrate().await?;
            tell!("ledger migrations applied");
            Ok(Exit::Success)
        }
        Command::Completions(args) => Ok(crate::tools::completions(args.shell)),
        Command::Schema => Ok(crate::tools::schema()),
    }
}

async fn run(
    setup: &Setup<'_>,
    args: RunArgs,
    signals: impl FnOnce() -> Shutdown,
) -> Result<Exit, Error> {
    let pipeline = Arc::new(setup.load_for(&args.pipeline, args.dry_run)?);
    let period = PeriodRange::one(pipeline.period_arg("--period", &args.period)?);
    let sources = source_ids(&pipeline, args.options.source.as_deref())?;
    let now = setup.clock.now();
    plan::refuse_open(&pipeline, period, "--period", now, args.allow_open)?;
    // `--now`: a run claims a failed key whatever its back-off (only `sync`
    // and the schedule wait for it), so there is nothing more to lift.
    let _ = args.now;
    let ask = Ask::Periods {
        range: period,
        only: None,
        force: args.options.force,
    };
    let target = Target {
        pipeline,
        sources,
        ask,
    };
    if args.dry_run {
        return preview::show(setup, vec![target], &args.options).await;
    }
    let store = setup.connect(Connections::runs(1)).await?;
    let engine = setup.engine(store, signals());
    let told = [Arc::clone(&target.pipeline)];
    let planner = engine.plan(target.pipeline, target.sources, target.ask);
    let how = RunMany {
        concurrency: 1,
        force_deletes: args.options.force_deletes,
        wait: args.wait,
    };
    let mut exits = Vec::new();
    let fed = run_planned(
        &engine,
        planner.map(|p| vec![p]),
        how,
        false,
        |key, outcome| {
            output::print_outcome(key, outcome);
            exits.push(Exit::of_outcome(outcome));
        },
    )
    .await;
    engine.deliver_notices(&told).await;
    engine.close().await;
    match fed.error {
        Some(error) => Err(error),
        None => Ok(Exit::worst(exits)),
    }
}

/// How far a streamed plan got: the keys it planned, the jobs it made of
/// them, and the ledger read that stopped it, if one did.
#[derive(Default)]
struct Fed {
    keys: usize,
    jobs: usize,
    error: Option<Error>,
}

/// Runs what `planners` plan with [`Engine::run_many`] (with a progress
/// bar when `progress` and stderr is a terminal), handing each outcome to
/// `each` as its run finishes instead of keeping them all: a backfill's
/// summary streams. A ledger read that stops the plan is kept in
/// [`Fed::error`], after the runs of the pages before it.
async fn run_planned(
    engine: &Engine,
    planners: Result<Vec<Planner>, Error>,
    how: RunMany,
    progress: bool,
    mut each: impl FnMut(&tidemark_core::RunKey, &Outcome),
) -> Fed {
    let planners = match planners {
        Ok(planners) => planners,
        Err(error) => {
            return Fed {
                error: Some(error),
                ..Fed::default()
            }
        }
    };
    use futures_util::StreamExt;

    let progress = if progress {
        output::progress_bar(0, "run keys")
    } else {
        indicatif::ProgressBar::hidden()
    };
    let mut fed = Fed::default();
    let events = engine.run_many(planners, how);
    let mut events = std::pin::pin!(events);
    while let Some(event) = events.next().await {
        match event {
            RunEvent::Planned { keys, jobs } => {
                fed.keys += keys;
                fed.jobs += jobs;
                progress.inc_length(jobs as u64);
            }
            RunEvent::Ran(ran) => {
                progress.inc(1);
                progress.suspend(|| each(&ran.key, &ran.outcome));
            }
            RunEvent::PlanFailed(e) => fed.error = Some(e),
        }
    }
    progress.finish_and_clear();
    fed
}

/// The periods `--from` to `--to` name, both included.
fn backfill_periods(pipeline: &Pipeline, args: &BackfillArgs) -> Result<PeriodRange, Error> {
    let (from, to) = range(pipeline, &args.from, &args.to)?;
    Ok(PeriodRange { from, to })
}

async fn backfill(
    setup: &Setup<'_>,
    args: BackfillArgs,
    signals: impl FnOnce() -> Shutdown,
) -> Result<Exit, Error> {
    let global = setup.global;
    let pipeline = Arc::new(setup.load_for(&args.pipeline, args.dry_run)?);
    let range = backfill_periods(&pipeline, &args)?;
    let sources = source_ids(&pipeline, args.options.source.as_deref())?;
    let now = setup.clock.now();
    plan::refuse_open(&pipeline, range, "--to", now, args.allow_open)?;
    let ask = Ask::Periods {
        range,
        only: args.only.map(crate::cli::Only::selection),
        force: args.options.force,
    };
    if args.dry_run {
        let target = Target {
            pipeline,
            sources,
            ask,
        };
        return preview::show(setup, vec![target], &args.options).await;
    }
    let concurrency = crate::cli::concurrency(args.concurrency, &global.database_url);
    let store = setup.connect(Connections::runs(concurrency)).await?;
    let engine = setup.engine(store, signals());
    let told = [Arc::clone(&pipeline)];
    let planner = engine.plan(pipeline, sources, ask);
    let how = RunMany {
        concurrency,
        force_deletes: args.options.force_deletes,
        wait: false,
    };
    let mut summary = output::Summary::default();
    let fed = run_planned(
        &engine,
        planner.map(|p| vec![p]),
        how,
        true,
        |key, outcome| {
            summary.add(key, outcome);
        },
    )
    .await;
    engine.deliver_notices(&told).await;
    engine.close().await;
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
/// dry run without requiring their secrets).
fn pipelines_in_folder(setup: &Setup<'_>, dry_run: bool) -> Result<Vec<Pipeline>, Error> {
    setup
        .catalog
        .files()
        .map_err(|e| crate::exit::flag(e, "pipelines folder", "--pipelines"))?
        .iter()
        .map(|p| setup.load_for(&p.display().to_string(), dry_run))
        .collect()
}

async fn sync(
    setup: &Setup<'_>,
    args: SyncArgs,
    signals: impl FnOnce() -> Shutdown,
) -> Result<Exit, Error> {
    let global = setup.global;
    let pipelines = if args.all {
        pipelines_in_folder(setup, args.dry_run)?
    } else {
        args.names
            .iter()
            .map(|n| setup.load_for(n, args.dry_run))
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
    let ask = Ask::Sync {
        force: args.options.force,
        now: args.now,
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
        return preview::show(setup, targets, &args.options).await;
    }
    let concurrency = crate::cli::concurrency(args.concurrency, &global.database_url);
    let store = setup.connect(Connections::runs(concurrency)).await?;
    let engine = setup.engine(store, signals());
    // The due periods not done yet, plus forced re-runs of the last
    // `lookback` done ones and of provisional ones now due (see `plan`).
    let told: Vec<Arc<Pipeline>> = targets.iter().map(|t| Arc::clone(&t.pipeline)).collect();
    let planners = targets
        .into_iter()
        .map(|t| engine.plan(t.pipeline, t.sources, t.ask))
        .collect::<Result<Vec<_>, Error>>();
    let how = RunMany {
        concurrency,
        force_deletes: args.options.force_deletes,
        wait: false,
    };
    let mut summary = output::Summary::default();
    let fed = run_planned(&engine, planners, how, true, |key, outcome| {
        summary.add(key, outcome);
    })
    .await;
    engine.deliver_notices(&told).await;
    engine.close().await;
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
async fn enqueue(setup: &Setup<'_>, args: BackfillArgs) -> Result<Exit, Error> {
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
    let pipeline = Arc::new(setup.load(&args.pipeline)?);
    let range = backfill_periods(&pipeline, &args)?;
    let sources = source_ids(&pipeline, args.options.source.as_deref())?;
    // A worker runs a queued key as due: an open period is not queued.
    plan::refuse_open(&pipeline, range, "--to", setup.clock.now(), false)?;
    let ask = Ask::Periods {
        range,
        only: args.only.map(crate::cli::Only::selection),
        force: args.options.force,
    };
    let store = setup.connect(Connections::runs(0)).await?;
    let engine = setup.engine(store, Shutdown::new());
    let queued = match engine.plan(Arc::clone(&pipeline), sources, ask) {
        Ok(plan) => engine.enqueue(plan, args.priority).await,
        Err(e) => Err(e),
    };
    engine.close().await;
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

/// `cancel`: pending keys leave the queue; running ones finish.
async fn cancel(setup: &Setup<'_>, args: CancelArgs) -> Result<Exit, Error> {
    let pipeline = setup.load(&args.pipeline)?;
    let range = match (&args.from, &args.to) {
        (Some(from), Some(to)) => {
            let (from, to) = range(&pipeline, from, to)?;
            Some((from.start_rfc3339(), to.start_rfc3339()))
        }
        _ => None,
    };
    if let Some(source) = &args.source {
        source_ids(&pipeline, Some(source))?;
    }
    let store = setup.connect(Connections::runs(0)).await?;
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

/// `mark`: periods recorded as done (or skipped) without running them.
async fn mark(setup: &Setup<'_>, args: MarkArgs) -> Result<Exit, Error> {
    let pipeline = setup.load(&args.pipeline)?;
    let periods = match (&args.period, &args.from, &args.to) {
        (Some(period), _, _) => PeriodRange::one(pipeline.period_arg("--period", period)?),
        (None, Some(from), Some(to)) => {
            let (from, to) = range(&pipeline, from, to)?;
            PeriodRange { from, to }
        }
        _ => {
            return Err(Error::Config {
                file: "command line".to_string(),
                key: "--from".to_string(),
                message: "mark needs --period P, or --from P1 --to P2".to_string(),
            })
        }
    };
    let sources = source_ids(&pipeline, args.source.as_deref())?;
    let marked = match args.mark_as {
        MarkAsArg::Done => MarkAs::Done,
        MarkAsArg::Skipped => MarkAs::Skipped,
    };
    let store = setup.connect(Connections::runs(0)).await?;
    let engine = setup.engine(store, Shutdown::new());
    let outcome = engine
        .mark(&pipeline, &sources, periods, marked, &args.note, args.force)
        .await;
    engine.close().await;
    let outcome = outcome?;
    for held in &outcome.held {
        tell!(
            "held: {} {} of pipeline {} is being run by {}; not marked",
            held.period_start,
            held.source,
            pipeline.spec.name,
            held.owner
        );
    }
    say!(
        "marked {} run key(s) of pipeline {} as {}; {} already done; {} held",
        outcome.marked,
        pipeline.spec.name,
        marked.as_str(),
        outcome.already_done,
        outcome.held.len(),
    );
    Ok(if outcome.held.is_empty() {
        Exit::Success
    } else {
        Exit::Held
    })
}

async fn validate(setup: &Setup<'_>, args: &ValidateArgs) -> Result<Exit, Error> {
    let mut exits = Vec::new();
    for name in &args.names {
        match setup
            .load_runnable(name)
            .and_then(|p| check_fields(&p).map(|()| p))
        {
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
        Some(text) => match pipeline.period_arg("--period", text) {
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
                // A SQL source's first look is its first keyset chunk.
                let first = match source {
                    tidemark_core::spec::SourceSpec::Sql(_) => "chunk",
                    _ => "page",
                };
                say!(
                    "  source {}: {} record(s) on the first {first} of {} ({})",
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

async fn prune(setup: &Setup<'_>, args: PruneArgs) -> Result<Exit, Error> {
    let store = setup.connect(Connections::runs(0)).await?;
    let pruned = store.prune(args.older_than).await;
    store.close().await;
    let (attempts, rejects) =
        pruned.map_err(|e| crate::exit::flag(e, "older than", "--older-than"))?;
    say!("pruned {attempts} attempt record(s) and {rejects} rejected record(s)");
    Ok(Exit::Success)
}

/// `notify test PIPELINE`: one `test` notice per `[[notify]]` target,
/// queued in the outbox and delivered at once like any other; exit 1
/// unless every receiver took it (the reason is logged).
async fn notify(setup: &Setup<'_>, args: NotifyArgs) -> Result<Exit, Error> {
    let NotifyAction::Test { pipeline } = args.action;
    let pipeline = Arc::new(setup.load(&pipeline)?);
    if pipeline.spec.notify.is_empty() {
        return Err(Error::config(
            pipeline.file_name(),
            "notify",
            "the pipeline has no [[notify]] target to test",
        ));
    }
    let store = setup.connect(Connections::runs(0)).await?;
    let engine = setup.engine(store, Shutdown::new());
    let queued =
        tidemark_engine::notices::queue_test(engine.store(), &pipeline, setup.clock.now()).await;
    let tally = match queued {
        Ok(_) => Ok(engine.deliver_notices(&[Arc::clone(&pipeline)]).await),
        Err(e) => Err(e),
    };
    engine.close().await;
    let tally = tally?;
    say!(
        "test notices: {} sent, {} to try again later, {} refused (dead)",
        tally.sent,
        tally.retried,
        tally.dead
    );
    Ok(if tally.retried == 0 && tally.dead == 0 {
        Exit::Success
    } else {
        Exit::Failed
    })
}
