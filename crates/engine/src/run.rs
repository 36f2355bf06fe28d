//! Runs one run key: claim it, read, type and load its batches, reconcile,
//! and record the outcome. This is the glue between the stages; each stage
//! owns its own rules.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tidemark_core::spec::DuplicateKeyPolicy;
use tidemark_core::{Error, KeyMap, Origin, Pipeline, RetryPolicy, Row, RunKey};
use tidemark_extract::Checkpoint;
use tidemark_load::{
    Claim, ClaimRequest, ClaimedRun, Counts, Durable, Lease, NextClaim, Reconcile, Reject,
    RunWriter, Store, TableSchema, WorkerId, WorkerKind, WriterOptions,
};
use tidemark_transform::Transformer;

use crate::clock::Clock;
use crate::prepare::{self, Batches};
use crate::presence::{Health, Presence};
use crate::shutdown::Shutdown;
use tidemark_extract::OpenSource;
use tracing::Instrument;

/// What every run of one engine shares: its stop request, its lease
/// length and the clock that decides what is due.
#[derive(Debug, Clone)]
pub(crate) struct Context {
    pub shutdown: Shutdown,
    pub lease_ttl: Duration,
    pub clock: Arc<dyn Clock>,
    /// This process as a worker in the ledger.
    pub presence: Presence,
    /// The ticks of this process's loops (`/healthz`).
    pub health: Health,
}

/// How often `--wait` asks the ledger again.
const WAIT_POLL: Duration = Duration::from_millis(500);

/// What happened to one run key.
#[derive(Debug)]
pub enum Outcome {
    /// Ran to `done` now; the canonical result.
    Done(serde_json::Value),
    /// Was done already; the stored result. Nothing was read or written.
    AlreadyDone(serde_json::Value),
    /// Another live run holds it.
    Held {
        /// The live run's worker.
        owner: String,
    },
    /// Failed; recorded in the ledger.
    Failed(Error),
    /// Not started: the command stopped claiming work (the database cannot
    /// store anything more).
    NotRun {
        /// Why.
        reason: String,
    },
    /// Stopped by a signal: the batch in flight was committed and the key
    /// handed back to the queue (`pending`) for any worker to resume.
    Interrupted,
    /// Not started, because a signal asked the command to stop.
    Stopped,
}

/// How an attempt that did not fail ended.
enum Ended {
    Done(serde_json::Value),
    Interrupted,
}

/// What a run has committed so far: its counts and batches, as the ledger
/// holds them (a resumed attempt starts from those of the attempts before
/// it; a restart from scratch sets them back to 0).
#[derive(Debug, Clone, Copy, Default)]
struct Tally {
    counts: Counts,
    batches: i64,
}

impl Tally {
    /// The writer's committed counts and batches.
    fn take(&mut self, writer: &RunWriter) {
        self.counts = writer.counts();
        self.batches = writer.batches();
    }
}

/// The one summary line an attempt logs as it ends (`run done`, `run
/// failed`, or `run interrupted; ...`): every count of the run and the
/// attempt's duration as separate fields, so `--log-format json` gives a
/// machine-readable record (README "Watching it"). Inside the run's span,
/// which names the run key, run id and attempt.
pub(crate) struct Summary {
    tally: Tally,
    duration: Duration,
    resumed: bool,
}

/// Logs a [`Summary`] at `$level` with `$message`, plus any more fields.
macro_rules! summary {
    ($level:ident, $summary:expr, $outcome:expr, $message:expr $(, $($extra:tt)+)?) => {{
        let s: &Summary = $summary;
        let c = &s.tally.counts;
        tracing::$level!(
            outcome = $outcome,
            rows_read = c.rows_read,
            rows_inserted = c.rows_inserted,
            rows_updated = c.rows_updated,
            rows_unchanged = c.rows_unchanged,
            rows_deleted = c.rows_deleted,
            rows_rejected = c.rows_rejected,
            rows_superseded = c.rows_superseded,
            rows_expected = c.rows_expected,
            batches = s.tally.batches,
            resumed = s.resumed,
            duration_ms = u64::try_from(s.duration.as_millis()).unwrap_or(u64::MAX),
            $($($extra)+,)?
            $message
        )
    }};
}

impl Summary {
    /// An attempt that ended before it read anything: the counts the
    /// claim found, no time spent.
    pub(crate) fn unstarted(run: &ClaimedRun) -> Summary {
        Summary {
            tally: Tally {
                counts: run.counts,
                batches: run.batches,
            },
            duration: Duration::ZERO,
            resumed: run.resume.is_some(),
        }
    }

    /// `run done`.
    fn done(&self) {
        summary!(info, self, "done", "run done");
    }

    /// `run failed`, with the error's class and message.
    pub(crate) fn failed(&self, error: &Error) {
        summary!(error, self, "failed", "run failed", error_class = %error.class(), error = %error);
    }

    /// The key was handed back to the queue after a signal.
    fn interrupted(&self) {
        summary!(
            info,
            self,
            "interrupted",
            "run interrupted; key handed back to the queue"
        );
    }
}

/// How one run key is run.
#[derive(Debug, Clone, Copy, Default)]
pub struct RunFlags {
    /// Run it even when done (`--force`).
    pub force: bool,
    /// Reconcile deletes past `load.max_delete_fraction`.
    pub force_deletes: bool,
    /// Wait for a key another live run holds instead of answering held.
    pub wait: bool,
    /// The period is still open (`--allow-open`): recorded as provisional.
    pub provisional: bool,
}

impl RunFlags {
    /// The flags a planned run key runs with: forced when the plan forces
    /// it, provisional when its period is open.
    pub fn of(planned: &crate::plan::Planned, force_deletes: bool, wait: bool) -> RunFlags {
        RunFlags {
            force: matches!(planned.intent, crate::plan::Intent::Claim(Some(_))),
            force_deletes,
            wait,
            provisional: planned.provisional,
        }
    }
}

/// The claim a run key's job makes: what a real run sends to the ledger
/// and what a dry run previews, built in this one place.
pub(crate) fn claim_request(
    pipeline: &Pipeline,
    flags: &RunFlags,
    worker: &WorkerId,
    lease_ttl: Duration,
) -> ClaimRequest {
    ClaimRequest {
        force: flags.force,
        handler_version: pipeline.spec.version.clone(),
        fields_fingerprint: pipeline.fields_fingerprint().as_str().to_string(),
        provisional: flags.provisional,
        worker: worker.clone(),
        lease_ttl,
        notices: crate::notices::notice_targets(pipeline),
    }
}

/// Where a worker's next job comes from, when one is ready at once.
pub(crate) trait NextJob: Send + Sync {
    /// The next job if it can be had without waiting (no page to plan, no
    /// lock held by another worker), and the worker may start one.
    fn ready(&self) -> Option<Job>;
}

/// A worker's next job, taken from its [`NextJob`] as the current period
/// finishes, so that the transaction finishing it also claims the next key
/// (the claim piggy-back, ADR 0022). The worker runs the job it took next,
/// whatever its claim answered: a piggy-backed claim that did not commit
/// claimed nothing, and the job is claimed on its own.
pub(crate) struct Relay<'a> {
    jobs: &'a dyn NextJob,
    shutdown: Shutdown,
    lease_ttl: Duration,
    /// The job taken, and the answer of its piggy-backed claim once the
    /// finishing transaction committed.
    taken: Option<(Job, Option<Claim>)>,
    /// When the last period's finishing transaction is on disk: its commit
    /// may be shared with the next periods' (SQLite, ADR 0022), and the
    /// period is reported done only then.
    durable: Durable,
}

impl<'a> Relay<'a> {
    /// A relay taking jobs from `jobs`, for runs of `ctx`.
    pub(crate) fn new(jobs: &'a dyn NextJob, ctx: &Context) -> Relay<'a> {
        Relay {
            jobs,
            shutdown: ctx.shutdown.clone(),
            lease_ttl: ctx.lease_ttl,
            taken: None,
            durable: Durable::now(),
        }
    }

    /// The claim the finishing transaction should carry: the next job's
    /// (taken now if not yet), or none after a stop request, or when no
    /// job is ready.
    fn next_claim(&mut self) -> Option<NextClaim> {
        if self.shutdown.requested() {
            return None;
        }
        if self.taken.is_none() {
            self.taken = self.jobs.ready().map(|job| (job, None));
        }
        let (job, _) = self.taken.as_ref()?;
        Some(NextClaim {
            key: job.key.clone(),
            request: claim_request(&job.pipeline, &job.flags, &job.worker, self.lease_ttl),
        })
    }

    /// The answer of the claim a committed finishing transaction carried.
    fn claimed(&mut self, claim: Option<Claim>) {
        if let Some((_, answer)) = &mut self.taken {
            *answer = claim;
        }
    }

    /// The job taken for next, with its claim if one was piggy-backed.
    pub(crate) fn take(&mut self) -> Option<(Job, Option<Claim>)> {
        self.taken.take()
    }

    /// When the period that just ended is on disk (at once unless its
    /// commit is shared).
    pub(crate) fn take_durable(&mut self) -> Durable {
        std::mem::take(&mut self.durable)
    }
}

/// Everything one run key needs.
#[derive(Clone)]
pub(crate) struct Job {
    pub store: Store,
    pub pipeline: Arc<Pipeline>,
    pub source_id: String,
    /// What opens the source (the built-in readers, or a program's own).
    pub opener: Arc<dyn OpenSource>,
    pub key: RunKey,
    pub worker: WorkerId,
    pub flags: RunFlags,
    /// Run keys the engine runs at once with this one: a source sizes its
    /// connections by it.
    pub at_once: usize,
}

impl Job {
    /// Claims and runs the run key; every failure ends up in the outcome
    /// (and, once claimed, in the ledger).
    pub(crate) async fn run(self, ctx: &Context) -> Outcome {
        self.run_relayed(ctx, None, None).await
    }

    /// [`Job::run`] for a worker of a queue of jobs: `claim` is what the
    /// transaction that finished the worker's previous period answered for
    /// this key (claimed or done: used as is; held: claimed again, which
    /// also waits with `--wait`), and `relay`, when given, hands this
    /// period's finishing transaction the worker's next claim.
    pub(crate) async fn run_relayed(
        self,
        ctx: &Context,
        claim: Option<Claim>,
        relay: Option<&mut Relay<'_>>,
    ) -> Outcome {
        if ctx.shutdown.requested() {
            return self.give_back(claim, Outcome::Stopped).await;
        }
        let claim = match claim {
            Some(claim @ (Claim::Claimed(_) | Claim::Done(_))) => Ok(Some(claim)),
            Some(Claim::Held { .. }) | None => self.claim(ctx).await,
        };
        let run = match claim {
            Ok(Some(Claim::Claimed(run))) => {
                // A command that runs keys is a worker too: seen in the
                // ledger while it runs (a no-op under `serve`).
                ctx.presence.ensure(WorkerKind::Cli, 1).await;
                *run
            }
            Ok(Some(Claim::Done(result))) => return Outcome::AlreadyDone(result),
            Ok(Some(Claim::Held { owner, .. })) => return Outcome::Held { owner },
            Ok(None) => return Outcome::Stopped,
            Err(e) => return Outcome::Failed(e),
        };
        self.run_claimed_relayed(run, ctx, relay).await
    }

    /// A job its worker will not start (a stop request, or the command
    /// stopped claiming work), reported as `not_started`: when the
    /// previous period's transaction claimed it already, the claim is
    /// handed back at once (the key goes back to `pending`, its attempt
    /// `interrupted`, as after a signal) rather than left leased until its
    /// lease runs out.
    pub(crate) async fn give_back(&self, claim: Option<Claim>, not_started: Outcome) -> Outcome {
        let Some(Claim::Claimed(run)) = claim else {
            return not_started;
        };
        let why = "claimed with the worker's previous period but not started: the command stopped";
        let counts = run.counts;
        match self.release(&run.lease, &counts, why).await {
            Ok(()) => {
                tracing::info!(key = %self.key, "claimed but not started; key handed back to the queue");
                not_started
            }
            Err(error) => {
                tracing::error!(key = %self.key, error = %error, "could not hand the key back; its lease runs out instead");
                Outcome::Failed(error)
            }
        }
    }

    /// Ends the attempt of `lease`, unfinished, handing the key back to
    /// the queue (`interrupt`), with retries, despite a full disk.
    async fn release(&self, lease: &Lease, counts: &Counts, why: &str) -> Result<(), Error> {
        record_despite_full_storage(&self.store, || {
            retry(&self.pipeline.retry, "hand the key back", || {
                self.store.interrupt(lease, counts, why)
            })
        })
        .await
    }

    /// Runs an attempt already claimed (by the work queue, or by [`Job::run`])
    /// inside a span naming its run key, run id and attempt.
    pub(crate) async fn run_claimed(&self, run: ClaimedRun, ctx: &Context) -> Outcome {
        self.run_claimed_relayed(run, ctx, None).await
    }

    /// [`Job::run_claimed`], with the worker's relay (see [`Relay`]).
    async fn run_claimed_relayed(
        &self,
        run: ClaimedRun,
        ctx: &Context,
        relay: Option<&mut Relay<'_>>,
    ) -> Outcome {
        let span = tracing::info_span!(
            "run",
            pipeline = %self.key.pipeline,
            source = %self.key.source,
            export_type = %self.key.export_type,
            period = %self.key.period.label(),
            run_id = %run.lease.run_id,
            attempt = run.lease.attempt,
        );
        self.attempt(run, ctx, relay).instrument(span).await
    }

    /// The claim, waiting for a held key with `--wait`; `None` when a stop
    /// was asked for while waiting.
    async fn claim(&self, ctx: &Context) -> Result<Option<Claim>, Error> {
        let request = claim_request(&self.pipeline, &self.flags, &self.worker, ctx.lease_ttl);
        let mut waited = false;
        loop {
            let claim = retry(&self.pipeline.retry, "claim", || {
                self.store.claim(&self.key, &request)
            })
            .await?;
            match claim {
                Claim::Held { ref owner, .. } if self.flags.wait => {
                    if !waited {
                        tracing::info!(%owner, key = %self.key, "run key is held by another run; waiting");
                        waited = true;
                    }
                    tokio::select! {
                        () = tokio::time::sleep(WAIT_POLL) => {}
                        () = ctx.shutdown.wait() => return Ok(None),
                    }
                }
                // Having waited for another run, its result is what we report.
                Claim::Claimed(_) | Claim::Done(_) | Claim::Held { .. } => return Ok(Some(claim)),
            }
        }
    }

    async fn attempt(
        &self,
        run: ClaimedRun,
        ctx: &Context,
        relay: Option<&mut Relay<'_>>,
    ) -> Outcome {
        let lease = run.lease.clone();
        let resumed = run.resume.is_some();
        tracing::info!(resumed, "run started");
        let started = std::time::Instant::now();
        let mut tally = Tally {
            counts: run.counts,
            batches: run.batches,
        };
        let result = {
            let execute = self.execute(run, &mut tally, &ctx.shutdown, relay);
            tokio::pin!(execute);
            // The lease is first renewed a third of its length after the
            // claim: the renewing task starts only then, so a period done
            // before it (most small ones) never spawns one (each spawn
            // wakes a thread).
            let first_renewal = tokio::time::sleep(ctx.lease_ttl / 3);
            tokio::select! {
                biased;
                result = &mut execute => result,
                () = first_renewal => {
                    let heartbeat = spawn_heartbeat(self.store.clone(), lease.clone(), ctx.lease_ttl);
                    let result = execute.await;
                    heartbeat.abort();
                    result
                }
            }
        };
        let summary = Summary {
            tally,
            duration: started.elapsed(),
            resumed,
        };
        match result {
            Ok(Ended::Done(result)) => {
                let superseded = tally.counts.rows_superseded;
                if superseded > 0 {
                    tracing::info!(
                        rows_superseded = superseded,
                        "{superseded} row(s) left as they are: a later period holds their key (`TIDEMARK_LOG=debug` names them)"
                    );
                }
                summary.done();
                Outcome::Done(result)
            }
            Ok(Ended::Interrupted) => self.hand_back(&lease, &summary).await,
            Err(error) => {
                summary.failed(&error);
                if !matches!(error, Error::LeaseLost(_)) {
                    self.record_failure(&lease, &tally.counts, &error).await;
                }
                Outcome::Failed(error)
            }
        }
    }

    /// Records a failed attempt; the key's backoff counts from the
    /// database's clock (see [`record_failure`]).
    async fn record_failure(&self, lease: &Lease, counts: &Counts, error: &Error) {
        record_failure(&self.store, &self.pipeline.retry, lease, counts, error).await;
    }

    /// Ends an attempt stopped by a signal after its last committed batch:
    /// the key goes back to the queue with its checkpoint.
    async fn hand_back(&self, lease: &Lease, summary: &Summary) -> Outcome {
        let counts = &summary.tally.counts;
        let why =
            "interrupted by a signal after its last committed batch; the next claim resumes it";
        match self.release(lease, counts, why).await {
            Ok(()) => {
                summary.interrupted();
                Outcome::Interrupted
            }
            Err(error) => {
                tracing::error!(error = %error, "could not hand the key back; its lease runs out instead");
                Outcome::Failed(error)
            }
        }
    }

    async fn execute(
        &self,
        mut run: ClaimedRun,
        tally: &mut Tally,
        shutdown: &Shutdown,
        mut relay: Option<&mut Relay<'_>>,
    ) -> Result<Ended, Error> {
        let pipeline = &*self.pipeline;
        let schema = TableSchema::from_pipeline(pipeline);
        retry(&pipeline.retry, "prepare table", || {
            self.store.ensure_table(&schema)
        })
        .await?;
        let reads = self.period_view(&run);
        let transformer = Arc::new(Transformer::new(&reads, &self.source_id, &self.key.period)?);
        let mut committed: Option<Checkpoint> = run.resume.clone();
        // Reading starts first, so the first batch is parsed while the writer
        // reads the run key's stored hashes.
        let defer = Arc::new(AtomicBool::new(false));
        let mut batches = self.produce(&reads, committed.clone(), &transformer, &defer);
        let mut writer = self.open_writer(&schema, &run, relay.is_some()).await?;
        self.allow_defer(&writer, &defer);
        let mut backoff = Backoff::new(&pipeline.retry);
        let reconcile = Reconcile {
            on_missing: pipeline.spec.load.on_missing,
            max_delete_fraction: pipeline.spec.load.max_delete_fraction,
            force_deletes: self.flags.force_deletes,
        };
        let mut received = false;
        // A batch received while looking whether the first one was the last.
        let mut pending = None;
        loop {
            // A stop asked for: the batches committed so far stay, and the
            // key goes back to the queue with their checkpoint. (A batch
            // being read is waited for; the shutdown timeout bounds that.)
            if shutdown.requested() {
                return Ok(Ended::Interrupted);
            }
            let next = match pending.take() {
                Some(next) => next,
                None => match batches.recv().await {
                    Some(next) => next,
                    None => break,
                },
            };
            let batch = match next {
                Ok(batch) => batch,
                // The stored checkpoint no longer fits the source (files changed):
                // start the period over; committed rows stay and are reconciled.
                Err(Error::StaleCheckpoint(why)) if !received && committed.is_some() => {
                    tracing::warn!(%why, "checkpoint no longer matches the source; starting the period over");
                    let run_id = retry(&pipeline.retry, "restart the period", || {
                        self.store.restart_fresh(&run.lease)
                    })
                    .await?;
                    run = fresh(run, run_id);
                    writer = self.open_writer(&schema, &run, relay.is_some()).await?;
                    self.allow_defer(&writer, &defer);
                    // The ledger's counts went back to 0 with the restart.
                    tally.take(&writer);
                    committed = None;
                    batches = self.produce(&reads, None, &transformer, &defer);
                    continue;
                }
                Err(e) if backoff.should_retry(&e, "read source").await => {
                    batches = self.produce(&reads, committed.clone(), &transformer, &defer);
                    continue;
                }
                Err(e) => return Err(e),
            };
            received = true;
            backoff.reset();
            let batch = raw_shortcut(batch, &mut writer, &transformer, &defer).await?;
            let (rows, rejects) = self.dedupe(
                batch.rows,
                batch.rejects,
                &mut writer,
                transformer.key_indices(),
            )?;
            // A first batch shorter than a full one usually means the source
            // ended: then it commits with the reconciliation and `done`, one
            // transaction for the whole period.
            // An incomplete period takes the usual path instead: its batch
            // is committed, then the completeness check fails the run.
            let short = batch.read < pipeline.spec.load.batch_size as u64;
            if writer.batches() == 0 && short {
                match batches.recv().await {
                    None if self
                        .check_complete(&mut writer, batches.expected(), batch.read)
                        .is_ok() =>
                    {
                        let last = (&rows[..], &rejects[..], batch.read, &batch.checkpoint);
                        let result = finish_one(
                            &mut writer,
                            last,
                            &reconcile,
                            &mut backoff,
                            relay.as_deref_mut(),
                        )
                        .await;
                        tally.take(&writer);
                        return result.map(Ended::Done);
                    }
                    None => {}
                    Some(next) => pending = Some(next),
                }
            }
            loop {
                match writer
                    .write_batch(&rows, &rejects, batch.read, &batch.checkpoint)
                    .await
                {
                    Ok(()) => break,
                    Err(e) if backoff.should_retry(&e, "commit batch").await => continue,
                    Err(e) => return Err(e),
                }
            }
            backoff.reset();
            tally.take(&writer);
            tracing::debug!(
                rows = batch.read,
                kept = rows.len(),
                rejects = rejects.len(),
                "batch committed"
            );
            committed = Some(batch.checkpoint);
        }
        // Before anything is reconciled or the period is done.
        let checked = self.check_complete(&mut writer, batches.expected(), 0);
        tally.take(&writer);
        checked?;
        let result = finish(&mut writer, &reconcile, &mut backoff, relay).await?;
        // The reconciliation's deletes are counted now.
        tally.take(&writer);
        Ok(Ended::Done(result))
    }

    /// Completeness (`expect_count`): the rows read for the period, with
    /// `uncommitted` of a batch not yet written, must be the total the
    /// source declared. Records the declared total with the run's counts
    /// either way. A mismatch is [`Error::Incomplete`]: the caller then
    /// neither reconciles nor marks the period done, and the batches
    /// committed so far stay (they are rows the source did return).
    fn check_complete(
        &self,
        writer: &mut RunWriter,
        expected: Option<u64>,
        uncommitted: u64,
    ) -> Result<(), Error> {
        let Some(expected) = expected else {
            return Ok(());
        };
        writer.expect_rows(expected);
        let read = writer.counts().rows_read + uncommitted;
        if read == expected {
            tracing::debug!(
                rows_read = read,
                rows_expected = expected,
                "complete: the rows read match the declared total"
            );
            return Ok(());
        }
        let declared = match self.pipeline.source(&self.source_id) {
            Some(tidemark_core::spec::SourceSpec::Http(spec)) => {
                spec.expect_count.as_ref().map_or_else(String::new, |e| {
                    format!(" ({} of the last page)", e.describe())
                })
            }
            Some(tidemark_core::spec::SourceSpec::Sql(_)) => " (count_query)".to_string(),
            _ => String::new(),
        };
        Err(Error::Incomplete(format!(
            "source {} declared {expected} records{declared} but {read} were read: \
             the crawl is incomplete (a page missing or cut short, or records added or removed upstream during it); \
             nothing was reconciled and the period is not done; the rows written so far stay. \
             Run the period again once the source answers consistently",
            self.source_id
        )))
    }

    /// Starts the run's writer (it reads the run key's stored rows), with
    /// retries: like every database step of a run. A worker with a relay
    /// reports its periods through [`Relay::take_durable`], so its writer
    /// may share a tiny period's commit with the next ones'.
    async fn open_writer(
        &self,
        schema: &TableSchema,
        run: &ClaimedRun,
        share_commit: bool,
    ) -> Result<RunWriter, Error> {
        let load = &self.pipeline.spec.load;
        let options = WriterOptions {
            memory_budget: load.memory_budget_bytes(),
            track_new_keys: load.on_duplicate_key != DuplicateKeyPolicy::Last,
        };
        let mut writer = retry(&self.pipeline.retry, "open the writer", || {
            self.store.writer(schema.clone(), run, &self.key, options)
        })
        .await?;
        if share_commit {
            writer.share_commit();
        }
        Ok(writer)
    }

    /// The pipeline as this period reads its source: fields new to the
    /// period (the ledger saw it before they were in `[fields]`) are read
    /// as declared `added`, so an export that predates their columns is not
    /// drift and a done period is never failed for a field added since.
    fn period_view(&self, run: &ClaimedRun) -> Arc<Pipeline> {
        if run.new_fields.is_empty() {
            return Arc::clone(&self.pipeline);
        }
        tracing::debug!(fields = %run.new_fields.join(","), "fields new to this period: its export may lack their columns");
        Arc::new(self.pipeline.with_new_fields(&run.new_fields))
    }

    /// Lets the reading task defer typing (ADR 0021, "The raw-record
    /// hash") when the run key holds raw hashes to compare with, and the
    /// policy for duplicate keys is "last" (the others look keys up
    /// across batches, which needs every row typed).
    fn allow_defer(&self, writer: &RunWriter, defer: &AtomicBool) {
        let last = self.pipeline.spec.load.on_duplicate_key == DuplicateKeyPolicy::Last;
        defer.store(last && writer.has_raw_hashes(), Ordering::Relaxed);
    }

    fn produce(
        &self,
        pipeline: &Arc<Pipeline>,
        resume: Option<Checkpoint>,
        transformer: &Arc<Transformer>,
        defer: &Arc<AtomicBool>,
    ) -> Batches {
        let read = prepare::Read {
            pipeline: Arc::clone(pipeline),
            source_id: self.source_id.clone(),
            opener: Arc::clone(&self.opener),
            period: self.key.period,
            resume,
            at_once: self.at_once,
            defer: Arc::clone(defer),
        };
        prepare::spawn(read, &self.store, Arc::clone(transformer))
    }

    /// Applies `max_rejects` (for the whole period) and `on_duplicate_key`
    /// to a typed batch.
    fn dedupe(
        &self,
        typed: Vec<(Row, Origin)>,
        rejected: Vec<(Error, Reject)>,
        writer: &mut RunWriter,
        key_indices: &[usize],
    ) -> Result<(Vec<Row>, Vec<Reject>), Error> {
        let load = &self.pipeline.spec.load;
        let rejected_before = writer.counts().rows_rejected;
        let mut rejects = Vec::with_capacity(rejected.len());
        for (error, reject) in rejected {
            if rejected_before + rejects.len() as u64 >= load.max_rejects {
                return Err(error);
            }
            rejects.push(reject);
        }
        let mut rows: Vec<Row> = Vec::with_capacity(typed.len());
        let mut index: KeyMap<usize> =
            KeyMap::with_capacity_and_hasher(typed.len(), Default::default());
        // With "last", a key seen in an earlier batch is simply written
        // again (the later row wins), so that lookup is skipped.
        let earlier_batches = if load.on_duplicate_key == DuplicateKeyPolicy::Last {
            vec![false; typed.len()]
        } else {
            let keys: Vec<_> = typed.iter().map(|(row, _)| row.key_hash).collect();
            writer.seen_before(&keys)?
        };
        for ((row, origin), seen_before) in typed.into_iter().zip(earlier_batches) {
            let earlier = index.get(&row.key_hash).copied();
            if earlier.is_some() || seen_before {
                match load.on_duplicate_key {
                    DuplicateKeyPolicy::First => continue,
                    DuplicateKeyPolicy::Error => {
                        return Err(Error::Invariant(format!(
                            "{}: duplicate natural key ({}) = ({}) in this period's input (load.on_duplicate_key = \"error\")",
                            origin.location(),
                            load.key.join(", "),
                            row.key_text(key_indices)
                        )))
                    }
                    DuplicateKeyPolicy::Last => {
                        if let Some(i) = earlier {
                            rows[i] = row;
                            continue;
                        }
                    }
                }
            }
            index.insert(row.key_hash, rows.len());
            rows.push(row);
        }
        Ok((rows, rejects))
    }
}

/// The raw-record shortcut for a batch with deferred records: the writer
/// says which are unchanged (their raw hash is the stored one), and the
/// others are typed now, on the blocking pool. A batch where more than one
/// record in [`CHANGED_SHARE`] changed turns deferring off for the rest of the
/// run: typing them in the reading task, while the writer commits, is then
/// cheaper.
async fn raw_shortcut(
    mut batch: prepare::Prepared,
    writer: &mut RunWriter,
    transformer: &Arc<Transformer>,
    defer: &AtomicBool,
) -> Result<prepare::Prepared, Error> {
    if batch.deferred.is_empty() {
        return Ok(batch);
    }
    let unchanged = writer.raw_unchanged(&batch.order)?;
    let deferred = batch.deferred.len();
    let changed = unchanged.iter().filter(|same| !**same).count();
    // A few changed records are typed here: a hop to the blocking pool per
    // batch would cost more than typing them, and another thread's
    // allocator cache in the peak RSS.
    if changed <= INLINE_TYPING {
        let hits = batch.type_rest(transformer, &unchanged);
        return Ok(after_shortcut(batch, deferred, hits, defer));
    }
    let transformer = Arc::clone(transformer);
    let span = tracing::Span::current();
    let (batch, hits) = tokio::task::spawn_blocking(move || {
        let hits = span.in_scope(|| batch.type_rest(&transformer, &unchanged));
        (batch, hits)
    })
    .await
    .map_err(|e| Error::Invariant(format!("typing a batch's changed records failed: {e}")))?;
    Ok(after_shortcut(batch, deferred, hits, defer))
}

/// More than one deferred record in this many changed turns deferring off:
/// the changed ones are typed between the writer's batches, not beside
/// them, which cost a re-sync with 12 % of its rows changed more than the
/// typing it saved (bench: SQLite's mutated re-sync 13.5 s before the
/// raw hash, 21-24 s with deferring on at a one-in-two threshold).
const CHANGED_SHARE: usize = 16;

/// Changed records of a batch typed on the run's own task rather than on
/// the blocking pool (about a millisecond of typing).
const INLINE_TYPING: usize = 1_000;

/// Logs what the shortcut found, and turns deferring off when more than
/// one of a batch's deferred records in [`CHANGED_SHARE`] changed.
fn after_shortcut(
    batch: prepare::Prepared,
    deferred: usize,
    hits: usize,
    defer: &AtomicBool,
) -> prepare::Prepared {
    tracing::debug!(deferred, unchanged = hits, "raw records compared");
    if (deferred - hits) * CHANGED_SHARE > deferred && defer.swap(false, Ordering::Relaxed) {
        tracing::debug!(
            deferred,
            unchanged = hits,
            "more than one raw record in 16 changed: typing every record from now on"
        );
    }
    batch
}

/// Reconciles and marks the run done, with retries; the transaction also
/// claims the relay's next job (ADR 0022).
async fn finish(
    writer: &mut RunWriter,
    reconcile: &Reconcile,
    backoff: &mut Backoff<'_>,
    mut relay: Option<&mut Relay<'_>>,
) -> Result<serde_json::Value, Error> {
    loop {
        let next = relay.as_mut().and_then(|r| r.next_claim());
        match writer.finish_then_claim(reconcile, next.as_ref()).await {
            Ok((result, claim)) => {
                if let Some(relay) = relay {
                    relay.claimed(claim);
                }
                return Ok(result);
            }
            Err(e) if backoff.should_retry(&e, "finish run").await => continue,
            Err(e) => return Err(e),
        }
    }
}

/// Commits a period's only batch with its reconciliation, with retries;
/// the transaction also claims the relay's next job (ADR 0022).
async fn finish_one(
    writer: &mut RunWriter,
    last: (&[Row], &[Reject], u64, &Checkpoint),
    reconcile: &Reconcile,
    backoff: &mut Backoff<'_>,
    mut relay: Option<&mut Relay<'_>>,
) -> Result<serde_json::Value, Error> {
    loop {
        let next = relay.as_mut().and_then(|r| r.next_claim());
        match writer
            .write_last_batch_then_claim(last, reconcile, next.as_ref())
            .await
        {
            Ok((result, claim)) => {
                if let Some(relay) = relay {
                    relay.claimed(claim);
                    relay.durable = writer.take_durable();
                }
                return Ok(result);
            }
            Err(e) if backoff.should_retry(&e, "commit the period").await => continue,
            Err(e) => return Err(e),
        }
    }
}

/// Records a failed attempt in the ledger, with `policy`'s retries; the
/// key's back-off counts from the database's clock, like every time the
/// ledger stores (a worker whose clock is behind would otherwise store a
/// back-off already over). A failure to record is logged: the lease then
/// runs out instead.
pub(crate) async fn record_failure(
    store: &Store,
    policy: &RetryPolicy,
    lease: &Lease,
    counts: &Counts,
    error: &Error,
) {
    let recorded = record_despite_full_storage(store, || {
        retry(policy, "record failure", || {
            store.mark_failed(lease, counts, error)
        })
    })
    .await;
    if let Err(e) = recorded {
        tracing::error!(error = %e, "could not record the failure in the ledger");
    }
}

fn fresh(run: ClaimedRun, run_id: String) -> ClaimedRun {
    ClaimedRun {
        lease: Lease {
            run_id,
            ..run.lease
        },
        resume: None,
        counts: Counts::default(),
        batches: 0,
        seen: Default::default(),
        new_fields: run.new_fields,
    }
}

/// Tries of an attempt's last ledger write (its failure, or handing the key
/// back) that the database refused for lack of space.
const STORAGE_TRIES: u32 = 8;

/// The first pause between those tries; each next pause is one more of it
/// (about 7 s in all).
const STORAGE_PAUSE: Duration = Duration::from_millis(250);

/// Runs an attempt's last ledger write, trying again a few times when the
/// database cannot store it: on a full disk the write usually fails only
/// while another attempt's batch (in this process or another) holds the
/// last free space, which its own failure soon rolls back, and then fits
/// once SQLite's space reserve is released. A key whose end
/// is never written stays `running` until its lease runs out, and the next
/// command would need a takeover to see the truth.
async fn record_despite_full_storage<F, Fut>(store: &Store, mut write: F) -> Result<(), Error>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<(), Error>>,
{
    let mut tries = 1;
    loop {
        match write().await {
            Err(Error::Storage { message }) if tries < STORAGE_TRIES => {
                tracing::warn!(error = %message, "the ledger cannot store the attempt's end yet; trying again once other writes have rolled back");
                store.make_room();
                tokio::time::sleep(STORAGE_PAUSE * tries).await;
                tries += 1;
            }
            other => return other,
        }
    }
}

/// Renews the lease every third of its length until aborted.
/// Renews `lease` now and then every third of its length, until aborted or
/// the lease is lost.
fn spawn_heartbeat(store: Store, lease: Lease, ttl: Duration) -> tokio::task::JoinHandle<()> {
    tokio::spawn(
        async move {
            loop {
                match store.heartbeat(&lease, ttl).await {
                    Ok(true) => {}
                    Ok(false) => {
                        tracing::warn!("lease lost: another attempt took over this run key");
                        return;
                    }
                    Err(e) => tracing::warn!(error = %e, "heartbeat failed; will try again"),
                }
                tokio::time::sleep(ttl / 3).await;
            }
        }
        .in_current_span(),
    )
}

/// Retries of one operation: bounded, exponential, full jitter, honouring
/// `Retry-After`, and only for transient errors.
pub struct Backoff<'a> {
    policy: &'a RetryPolicy,
    failures: u32,
}

impl<'a> Backoff<'a> {
    /// No failure yet.
    pub fn new(policy: &'a RetryPolicy) -> Self {
        Backoff {
            policy,
            failures: 0,
        }
    }

    /// Forget earlier failures after a success.
    pub fn reset(&mut self) {
        self.failures = 0;
    }

    /// Whether to try again after `error`; sleeps the backoff delay first.
    pub async fn should_retry(&mut self, error: &Error, what: &str) -> bool {
        self.failures += 1;
        if !error.is_transient() || self.failures >= self.policy.max_attempts {
            return false;
        }
        let delay = self
            .policy
            .delay(self.failures, error.retry_after(), rand::random::<f64>());
        tracing::warn!(
            cause = %error,
            attempt = self.failures,
            max_attempts = self.policy.max_attempts,
            delay_ms = delay.as_millis(),
            "{what} failed with a transient error; retrying"
        );
        tokio::time::sleep(delay).await;
        true
    }
}

/// Runs `op` with [`Backoff`].
pub(crate) async fn retry<T, F, Fut>(
    policy: &RetryPolicy,
    what: &str,
    mut op: F,
) -> Result<T, Error>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, Error>>,
{
    let mut backoff = Backoff::new(policy);
    loop {
        match op().await {
            Err(e) if backoff.should_retry(&e, what).await => continue,
            other => return other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn retries_only_transient_errors_and_stops_at_max_attempts() {
        let policy = RetryPolicy {
            max_attempts: 3,
            base_delay: Duration::from_millis(10),
            max_delay: Duration::from_millis(40),
        };
        let mut calls = 0;
        let result: Result<(), Error> = retry(&policy, "op", || {
            calls += 1;
            async { Err(Error::source_transient("reset")) }
        })
        .await;
        assert!(result.is_err());
        assert_eq!(calls, 3);
        let mut calls = 0;
        let result: Result<(), Error> = retry(&policy, "op", || {
            calls += 1;
            async { Err(Error::source_permanent("404")) }
        })
        .await;
        assert!(result.is_err());
        assert_eq!(calls, 1);
    }
}
