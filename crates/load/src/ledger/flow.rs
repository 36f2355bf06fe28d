//! The ledger's flow, written once for every backend: claim, heartbeat,
//! fence, batch commit, finish, fail, restart, status and prune.
//!
//! Every write transaction of an attempt begins with the fencing `UPDATE`
//! of its run row (which on PostgreSQL also locks the row until commit), so
//! an attempt whose lease was taken over commits nothing more.

use std::time::Duration;

use tidemark_core::spec::OnMissing;
use tidemark_core::{Error, FieldsFingerprint, KeySet, RunKey};

use super::driver::{
    fetch_all, fetch_optional, Arg, Dialect, Driver, LedgerTx, Record, Vanished as _,
};
use super::notices::{self, LineageEvent};
use super::rules::{decide, Decision, Snapshot};
use super::sql::{
    BeginAttempt, CreateRunning, EndAttempt, EnqueueNew, FinishDone, FinishRun, InsertAttempt,
    InsertReject, Requeue, SaveProgress, StartAttempt, Statements,
};
use super::{
    decode_hashes, new_run_id, AttemptStatus, Claim, ClaimRequest, ClaimedRun, Counts, Enqueue,
    Lease, LedgerEntry, NextClaim, QueuePipeline, QueuedRun, RunStatus, StartRange, StoredClass,
    WorkerId,
};
use crate::durable::{Commit, Durable};
use crate::schema::TableSchema;
use crate::stored::StoredHashes;
use crate::writer::{
    refuse_deletes, result_json, BatchOutcome, BatchWrite, Lineage, Reconcile, Stamp,
};

pub(super) fn sql<D: Driver>() -> &'static Statements {
    Statements::of(D::DIALECT)
}

/// How long a claim tries again for a run row another transaction holds
/// before it answers `Held`: long enough for a racing claim or heartbeat
/// (milliseconds), far shorter than a batch that waits on its table.
const CLAIM_PATIENCE: Duration = Duration::from_secs(1);

/// Pause between two tries of a claim whose run row is locked.
const CLAIM_RETRY: Duration = Duration::from_millis(50);

/// Takes the run key for a new attempt, or explains why not: creates its
/// ledger row if missing, locks it, applies the claim rules and starts the
/// attempt, in one transaction.
///
/// A claim never waits on a locked run row (on PostgreSQL a batch holds its
/// row until commit, and a batch may wait without limit on its destination
/// table): it tries again for [`CLAIM_PATIENCE`], then answers `Held` with
/// the owner the row names.
pub(crate) async fn claim<D: Driver>(
    driver: &D,
    key: &RunKey,
    request: &ClaimRequest,
) -> Result<Claim, Error> {
    let started = std::time::Instant::now();
    loop {
        if let Some(claim) = try_claim(driver, key, request).await? {
            return Ok(claim);
        }
        if started.elapsed() >= CLAIM_PATIENCE {
            return held_by_transaction(driver, key).await;
        }
        tokio::time::sleep(CLAIM_RETRY).await;
    }
}

/// The run key's arguments: pipeline, source, export type, period start.
fn run_key_args<'a>(key: &'a RunKey, start: &'a str) -> [Arg<'a>; 4] {
    [
        Arg::Text(&key.pipeline),
        Arg::Text(&key.source),
        Arg::Text(&key.export_type),
        Arg::Text(start),
    ]
}

/// One try of [`claim`]; `None` when another transaction holds the row.
async fn try_claim<D: Driver>(
    driver: &D,
    key: &RunKey,
    request: &ClaimRequest,
) -> Result<Option<Claim>, Error> {
    let mut tx = driver.begin().await?;
    let claim = claim_in::<D>(&mut tx, key, request).await?;
    tx.commit().await?;
    Ok(claim)
}

/// The claim of `key` inside `tx`: creates its ledger row if missing,
/// with the first attempt started ([`create_running`]), else locks it and
/// applies [`take`]. `None` when another transaction holds the row
/// (PostgreSQL skips it rather than wait). Shared by a claim's own
/// transaction ([`try_claim`]) and the transaction that finishes the
/// worker's previous period ([`piggy_back`]).
async fn claim_in<D: Driver>(
    tx: &mut D::Tx,
    key: &RunKey,
    request: &ClaimRequest,
) -> Result<Option<Claim>, Error> {
    if let Some(claim) = create_running::<D>(tx, key, request).await? {
        return Ok(Some(claim));
    }
    let start = key.period.start_rfc3339();
    match fetch_optional(tx, &sql::<D>().lock_run, &run_key_args(key, &start)).await? {
        Some(row) => take::<D>(tx, &row, request).await.map(Some),
        None => Ok(None),
    }
}

/// The first claim of a key that has no ledger row: the row is created
/// `running`, its attempt 1 started fresh, as [`take`] would start it on a
/// new `pending` row (the claim rules can only say "take it, fresh" of a
/// row no attempt has touched), in one statement on PostgreSQL and two on
/// SQLite instead of four. `None`: the row exists (the caller locks it).
async fn create_running<D: Driver>(
    tx: &mut D::Tx,
    key: &RunKey,
    request: &ClaimRequest,
) -> Result<Option<Claim>, Error> {
    let s = sql::<D>();
    let (start, end) = (key.period.start_rfc3339(), key.period.end_rfc3339());
    let run_id = new_run_id();
    let owner = request.worker.owner();
    // A new row has no fields the period has seen before.
    let fingerprint = FieldsFingerprint::from_stored(&request.fields_fingerprint).carry(None);
    let create = CreateRunning {
        pipeline: &key.pipeline,
        source: &key.source,
        export_type: &key.export_type,
        period_start: &start,
        period_end: &end,
        run_id: &run_id,
        owner: &owner,
        host: &request.worker.host,
        pid: i64::from(request.worker.pid),
        lease: request.lease_ttl,
        handler_version: &request.handler_version,
        provisional: request.provisional,
        fingerprint: &fingerprint,
    };
    let created = match &s.create_running_logged {
        Some(both) => fetch_optional(tx, both, &create.args()).await?,
        None => {
            let created = fetch_optional(tx, &s.create_running, &create.args()).await?;
            if let Some(row) = &created {
                let history = InsertAttempt {
                    run_ref: row.int("id")?,
                    attempt: 1,
                    run_id: &run_id,
                    owner: &owner,
                    fresh: true,
                    batches: 0,
                    queued: false,
                };
                tx.execute(&s.insert_attempt, &history.args()).await?;
            }
            created
        }
    };
    let Some(row) = created else {
        return Ok(None);
    };
    let lease = Lease {
        run_ref: row.int("id")?,
        attempt: 1,
        run_id,
        owner,
        notices: request.notices.clone(),
    };
    let started = Started {
        counts: Counts::default(),
        batches: 0,
        seen: KeySet::default(),
        resume: None,
    };
    started
        .claimed::<D>(tx, lease, &fingerprint)
        .await
        .map(Some)
}

/// The next key's claim at the end of a finishing transaction (ADR 0022,
/// the claim piggy-back). `Ok(None)`: nothing to claim, or its row is held
/// by another transaction (the worker then claims it on its own, with the
/// patience of [`claim`]). `Err`: the claim failed and `tx` may be aborted;
/// the caller finishes its period again without it, so the period never
/// fails for its successor's sake.
async fn piggy_back<D: Driver>(
    tx: &mut D::Tx,
    next: Option<&NextClaim>,
) -> Result<Option<Claim>, Error> {
    match next {
        Some(next) => claim_in::<D>(tx, &next.key, &next.request).await,
        None => Ok(None),
    }
}

/// Logs a piggy-backed claim that failed: its period is finished again
/// without it.
fn piggy_back_failed(next: Option<&NextClaim>, error: &Error) {
    if let Some(next) = next {
        tracing::debug!(key = %next.key, error = %error, "the next key's claim failed inside the finishing transaction; finishing without it");
    }
}

/// `Held` for a run row another transaction kept locked past
/// [`CLAIM_PATIENCE`]: a batch of its holder (which may be waiting on its
/// destination table), named by the row's lease.
async fn held_by_transaction<D: Driver>(driver: &D, key: &RunKey) -> Result<Claim, Error> {
    let start = key.period.start_rfc3339();
    let mut tx = driver.begin_read().await?;
    let row = fetch_optional(&mut tx, &sql::<D>().read_run, &run_key_args(key, &start)).await?;
    tx.commit().await?;
    let row = row.ok_or_else(|| Error::Database {
        message: format!("the ledger row of {key} vanished during its claim"),
        transient: true,
    })?;
    Ok(Claim::Held {
        owner: row
            .opt_text("lease_owner")?
            .unwrap_or_else(|| "another transaction (the run row is locked)".to_string()),
        expires_at: row.opt_text("lease_expires_at")?.unwrap_or_default(),
    })
}

/// Applies the claim rules to a locked run row and, when they say so,
/// starts a new attempt on it (inside the caller's transaction).
async fn take<D: Driver>(
    tx: &mut D::Tx,
    row: &Record,
    request: &ClaimRequest,
) -> Result<Claim, Error> {
    let s = sql::<D>();
    let run_ref = row.int("id")?;
    let resume = match decide(snapshot(row)?, request) {
        Decision::Done(result) => return Ok(Claim::Done(result)),
        Decision::Held { owner, expires_at } => return Ok(Claim::Held { owner, expires_at }),
        Decision::Take {
            resume,
            previous_lost,
        } => {
            if previous_lost {
                tx.execute(&s.lose_running_attempts, &[Arg::Int(run_ref)])
                    .await?;
                abort_lost::<D>(tx, row, request).await?;
            }
            resume
        }
    };
    let attempt = row.int("attempt")? + 1;
    // A pending key waited in the queue: its attempt records since when.
    let queued = row.state::<RunStatus>("status")? == RunStatus::Pending;
    let (run_id, counts, batches, seen, resume) = match resume {
        Some((checkpoint, run_id)) => {
            let seen = load_seen::<D>(tx, run_ref, &run_id).await?;
            (
                run_id,
                counts_of(row)?,
                row.int("batches")?,
                seen,
                Some(checkpoint),
            )
        }
        None => {
            // Batch rows exist only while `batches` counts them: each is
            // written with `batches = MAX(batches, n)` and every reset to 0
            // deletes them in the same transaction. A key that never
            // committed a batch (every first run) has none to delete.
            if row.int("batches")? > 0 {
                tx.execute(&s.delete_batches, &[Arg::Int(run_ref)]).await?;
            }
            (new_run_id(), Counts::default(), 0, KeySet::default(), None)
        }
    };
    let fresh = resume.is_none();
    let owner = request.worker.owner();
    // Fields the period's row has not seen before stay marked new to it.
    let fingerprint = FieldsFingerprint::from_stored(&request.fields_fingerprint)
        .carry(row.opt_text("fields_fingerprint")?.as_deref());
    let start = StartAttempt {
        attempt,
        run_id: &run_id,
        owner: &owner,
        host: &request.worker.host,
        pid: i64::from(request.worker.pid),
        lease: request.lease_ttl,
        fresh,
        batches,
        counts,
        handler_version: &request.handler_version,
        run_ref,
        provisional: request.provisional,
        fingerprint: &fingerprint,
    };
    match &s.begin_attempt {
        Some(both) => {
            let begin = BeginAttempt { start, queued };
            tx.execute(both, &begin.args()).await?;
        }
        None => {
            tx.execute(&s.start_attempt, &start.args()).await?;
            let history = InsertAttempt {
                run_ref,
                attempt,
                run_id: &run_id,
                owner: &owner,
                fresh,
                batches,
                queued,
            };
            tx.execute(&s.insert_attempt, &history.args()).await?;
        }
    }
    let lease = Lease {
        run_ref,
        attempt,
        run_id,
        owner,
        notices: request.notices.clone(),
    };
    let started = Started {
        counts,
        batches,
        seen,
        resume,
    };
    started.claimed::<D>(tx, lease, &fingerprint).await
}

/// Where a started attempt begins: what [`take`] and [`create_running`]
/// hand to [`Started::claimed`].
struct Started {
    counts: Counts,
    batches: i64,
    seen: KeySet,
    resume: Option<serde_json::Value>,
}

impl Started {
    /// The attempt under `lease` has started inside `tx`: its lineage
    /// `START` (when enabled) and the claim the worker runs.
    async fn claimed<D: Driver>(
        self,
        tx: &mut D::Tx,
        lease: Lease,
        fingerprint: &str,
    ) -> Result<Claim, Error> {
        if lease.notices.lineage {
            if let Some(before) = notices::before::<D>(tx, &lease).await? {
                notices::attempt_event::<D>(tx, &before, &lease, &self.counts, LineageEvent::Start)
                    .await?;
            }
        }
        Ok(Claim::Claimed(Box::new(ClaimedRun {
            lease,
            resume: self.resume,
            counts: self.counts,
            batches: self.batches,
            seen: self.seen,
            new_fields: tidemark_core::fingerprint::new_fields(fingerprint),
        })))
    }
}

/// The lineage `ABORT` of the attempt a takeover marked `lost` (the run
/// row still names it: its number, run id and holder).
async fn abort_lost<D: Driver>(
    tx: &mut D::Tx,
    row: &Record,
    request: &ClaimRequest,
) -> Result<(), Error> {
    if !request.notices.lineage {
        return Ok(());
    }
    let lost = Lease {
        run_ref: row.int("id")?,
        attempt: row.int("attempt")?,
        run_id: row.opt_text("run_id")?.unwrap_or_default(),
        owner: row.opt_text("lease_owner")?.unwrap_or_default(),
        notices: request.notices.clone(),
    };
    if let Some(before) = notices::before::<D>(tx, &lost).await? {
        let counts = counts_of(row)?;
        notices::attempt_event::<D>(tx, &before, &lost, &counts, LineageEvent::Abort).await?;
    }
    Ok(())
}

/// One claim of the work queue by a worker that runs `pipelines`: first a
/// running key whose holder is gone (lease expired, or provably dead on
/// this host), then the first `pending` key by rank. `None` when nothing is
/// claimable. On PostgreSQL rows other claims hold are skipped, never
/// waited for.
pub(crate) async fn claim_next<D: Driver>(
    driver: &D,
    pipelines: &[QueuePipeline],
    request: &ClaimRequest,
) -> Result<Option<QueuedRun>, Error> {
    if pipelines.is_empty() {
        return Ok(None);
    }
    let s = sql::<D>();
    let cutoffs = due_cutoffs(pipelines);
    let args = QueueArgs::of(pipelines, &cutoffs, &request.worker.host);
    let mut tx = driver.begin().await?;
    let mut candidates = Vec::new();
    for row in fetch_all(
        &mut tx,
        &s.takeover_candidates(pipelines.len()),
        &args.running,
    )
    .await?
    {
        // Only a key the rules would take is locked (and judged again,
        // locked, by `take`): a live holder's row is never locked.
        let Some(request) = queue_request(pipelines, &row, request)? else {
            continue;
        };
        if matches!(decide(snapshot(&row)?, &request), Decision::Held { .. }) {
            continue;
        }
        let id = [Arg::Int(row.int("id")?)];
        if let Some(locked) = fetch_optional(&mut tx, &s.lock_running(), &id).await? {
            candidates.push(locked);
        }
    }
    if let Some(next) =
        fetch_optional(&mut tx, &s.queue_next(pipelines.len()), &args.pending).await?
    {
        candidates.push(next);
    }
    for row in candidates {
        let Some(request) = queue_request(pipelines, &row, request)? else {
            continue;
        };
        if let Claim::Claimed(run) = take::<D>(&mut tx, &row, &request).await? {
            let queued = QueuedRun {
                pipeline: row.text("pipeline")?,
                source: row.text("source")?,
                export_type: row.text("export_type")?,
                period_start: row.text("period_start")?,
                period_end: row.text("period_end")?,
                provisional: request.provisional,
                run: *run,
            };
            tx.commit().await?;
            return Ok(Some(queued));
        }
    }
    tx.commit().await?;
    Ok(None)
}

/// The claim a queue worker makes for a candidate row of `pipelines`, or
/// `None` when the queue must not take it now: its pipeline is not one
/// this worker runs, or its period is still open and its last attempt was
/// not provisional. The attempt records the version and fields of the
/// pipeline it runs (a stopped attempt resumes only under the same), and
/// is provisional exactly when its period is still open: it then continues
/// the provisional attempt `--allow-open` started; once due, the period is
/// read again from the start ([`super::rules::resumable`]).
fn queue_request(
    pipelines: &[QueuePipeline],
    row: &Record,
    request: &ClaimRequest,
) -> Result<Option<ClaimRequest>, Error> {
    let pipeline = row.text("pipeline")?;
    let Some(queued_for) = pipelines.iter().find(|p| p.name == pipeline) else {
        return Ok(None);
    };
    let open = !queued_for.is_due(&row.text("period_end")?);
    if open && row.int("provisional")? == 0 {
        return Ok(None);
    }
    Ok(Some(ClaimRequest {
        handler_version: queued_for.handler_version.clone(),
        fields_fingerprint: queued_for.fields_fingerprint.clone(),
        provisional: open,
        notices: queued_for.notices.clone(),
        ..request.clone()
    }))
}

/// The arguments of the queue's statements for a worker of `pipelines` on
/// `host`: `running` binds the scans of running keys (the host, then the
/// pipelines), `pending` the reads of the first pending key (the pipelines,
/// then their due cut-offs).
struct QueueArgs<'a> {
    running: Vec<Arg<'a>>,
    pending: Vec<Arg<'a>>,
}

impl<'a> QueueArgs<'a> {
    fn of(pipelines: &'a [QueuePipeline], cutoffs: &'a [String], host: &'a str) -> QueueArgs<'a> {
        let names = pipelines.iter().map(|p| Arg::Text(&p.name));
        let running = std::iter::once(Arg::Text(host))
            .chain(names.clone())
            .collect();
        let pending = names.chain(cutoffs.iter().map(|c| Arg::Text(c))).collect();
        QueueArgs { running, pending }
    }
}

/// The due cut-offs of `pipelines`, in their order, as the ledger compares
/// times.
fn due_cutoffs(pipelines: &[QueuePipeline]) -> Vec<String> {
    pipelines
        .iter()
        .map(|p| crate::timestamp_text(p.due_before))
        .collect()
}

/// Whether anything is left for a draining worker of `pipelines` on this
/// host: what [`claim_next`] could claim now, by the same rules: a pending
/// key that is due or continues a provisional attempt, or a running key
/// whose lease has expired or whose holder on this host is gone. A key held
/// by a live worker elsewhere is that worker's; a key whose period is still
/// open is left for when it is due (a `serve` without `--drain` claims it
/// then).
pub(crate) async fn work_left<D: Driver>(
    driver: &D,
    pipelines: &[QueuePipeline],
    me: &WorkerId,
) -> Result<bool, Error> {
    if pipelines.is_empty() {
        return Ok(false);
    }
    let s = sql::<D>();
    let cutoffs = due_cutoffs(pipelines);
    let args = QueueArgs::of(pipelines, &cutoffs, &me.host);
    let mut tx = driver.begin_read().await?;
    let pending = fetch_optional(&mut tx, &s.queue_peek(pipelines.len()), &args.pending).await?;
    let running = match pending {
        Some(_) => Vec::new(),
        None => {
            fetch_all(
                &mut tx,
                &s.running_leftovers(pipelines.len()),
                &args.running,
            )
            .await?
        }
    };
    tx.commit().await?;
    if pending.is_some() {
        return Ok(true);
    }
    for row in running {
        let (pipeline, end) = (row.text("pipeline")?, row.text("period_end")?);
        let open = pipelines
            .iter()
            .find(|p| p.name == pipeline)
            .is_some_and(|p| !p.is_due(&end));
        if open && row.int("provisional")? == 0 {
            continue;
        }
        let live = row.int("lease_live")? == 1;
        let dead = super::rules::holder_is_dead(
            row.opt_text("lease_host")?.as_deref(),
            row.opt_int("lease_pid")?,
            me,
        );
        if !live || dead {
            return Ok(true);
        }
    }
    Ok(false)
}

/// The database's plans of a claim's two reads of the queue, for
/// `pipelines` (see [`crate::ClaimPlan`]).
pub(crate) async fn explain_claim<D: Driver>(
    driver: &D,
    pipelines: &[QueuePipeline],
) -> Result<crate::ClaimPlan, Error> {
    let s = sql::<D>();
    let cutoffs = due_cutoffs(pipelines);
    let args = QueueArgs::of(pipelines, &cutoffs, "");
    let mut tx = driver.begin_read().await?;
    let takeover = plan_lines::<D>(
        &mut tx,
        &s.explain(&s.takeover_candidates(pipelines.len())),
        &args.running,
    )
    .await?;
    let next = plan_lines::<D>(
        &mut tx,
        &s.explain(&s.queue_next(pipelines.len())),
        &args.pending,
    )
    .await?;
    tx.commit().await?;
    Ok(crate::ClaimPlan { takeover, next })
}

/// The text of each row of an `EXPLAIN`.
async fn plan_lines<D: Driver>(
    tx: &mut D::Tx,
    explain: &str,
    args: &[Arg<'_>],
) -> Result<Vec<String>, Error> {
    let column = match D::DIALECT {
        Dialect::Postgres => "QUERY PLAN",
        Dialect::Sqlite => "detail",
    };
    fetch_all(tx, explain, args)
        .await?
        .iter()
        .map(|row| row.text(column))
        .collect()
}

/// Keys per enqueue statement, and per transaction of a plan's enqueue.
pub(crate) const ENQUEUE_CHUNK: usize = 10_000;

/// Queues `keys` of one pipeline: new keys are inserted as `pending`;
/// existing keys in one of `requeue` states go back to `pending`, fresh.
/// One statement per chunk of keys, not a round trip per key; all in one
/// transaction (a plan's enqueue calls this per page, so a transaction
/// holds at most [`ENQUEUE_CHUNK`] keys: ADR 0014). Returns how many keys
/// are newly queued.
pub(crate) async fn enqueue<D: Driver>(driver: &D, batch: &Enqueue<'_>) -> Result<u64, Error> {
    const CHUNK: usize = ENQUEUE_CHUNK;
    let s = sql::<D>();
    let mut tx = driver.begin().await?;
    let mut queued = 0;
    for chunk in batch.keys.chunks(CHUNK) {
        let new: serde_json::Value = chunk
            .iter()
            .map(|k| serde_json::json!([k.source, k.period_start, k.period_end]))
            .collect();
        let insert = EnqueueNew {
            pipeline: batch.pipeline,
            export_type: batch.export_type,
            priority: batch.priority,
            enqueued_by: batch.by.as_str(),
            keys: &new,
        };
        let inserted = tx.execute(&s.enqueue_new(), &insert.args()).await?;
        queued += inserted;
        // Every key was new: none can be in a state to queue again.
        if batch.requeue.is_empty() || inserted == chunk.len() as u64 {
            continue;
        }
        let existing: serde_json::Value = chunk
            .iter()
            .map(|k| serde_json::json!([k.source, k.period_start]))
            .collect();
        let requeue = Requeue {
            pipeline: batch.pipeline,
            export_type: batch.export_type,
            priority: batch.priority,
            enqueued_by: batch.by.as_str(),
            respect_backoff: batch.respect_backoff,
            keys: &existing,
        };
        queued += tx
            .execute(&s.requeue(batch.requeue), &requeue.args())
            .await?;
    }
    if queued > 0 {
        wake_workers::<D>(&mut tx).await?;
    }
    tx.commit().await?;
    Ok(queued)
}

/// After a command queued `total` keys: refreshes the planner's statistics
/// once if they are many.
pub(crate) async fn enqueued<D: Driver>(driver: &D, total: u64) {
    if total >= ANALYZE_AFTER {
        refresh_statistics(driver).await;
    }
}

/// Keys queued at once from which the planner's statistics are refreshed
/// at once rather than by the next autovacuum.
const ANALYZE_AFTER: u64 = 1_000;

/// See [`Statements::analyze_runs`]. The keys are queued already; a failure
/// here costs speed, not correctness, so it is logged, not returned.
async fn refresh_statistics<D: Driver>(driver: &D) {
    let Some(analyze) = &sql::<D>().analyze_runs else {
        return;
    };
    let result = async {
        let mut tx = driver.begin().await?;
        tx.execute(analyze, &[]).await?;
        tx.commit().await
    }
    .await;
    if let Err(e) = result {
        tracing::warn!(error = %e, "could not refresh the ledger's statistics after queuing keys");
    }
}

/// Takes `pending` keys of a pipeline out of the queue (`cancelled`);
/// running keys finish. Optionally one source and periods starting within
/// `[from, to]` (RFC 3339 instants). Returns how many.
pub(crate) async fn cancel<D: Driver>(
    driver: &D,
    pipeline: &str,
    source: Option<&str>,
    from: Option<&str>,
    to: Option<&str>,
) -> Result<u64, Error> {
    let mut tx = driver.begin().await?;
    let cancelled = tx
        .execute(
            &sql::<D>().cancel(),
            &[
                Arg::Text(pipeline),
                Arg::OptText(source),
                Arg::OptText(from),
                Arg::OptText(to),
            ],
        )
        .await?;
    tx.commit().await?;
    Ok(cancelled)
}

/// Ends an attempt stopped by a signal after its last committed batch: the
/// run key goes back to `pending` with its lease released and its
/// checkpoint kept, so any worker resumes it at once; the attempt is
/// `interrupted`. Fenced: a superseded attempt changes nothing.
pub(crate) async fn interrupt<D: Driver>(
    driver: &D,
    lease: &Lease,
    counts: &Counts,
    why: &str,
) -> Result<(), Error> {
    let mut tx = driver.begin().await?;
    // An interruption is news to lineage only (people hear of failures).
    let before = if lease.notices.lineage {
        notices::before::<D>(&mut tx, lease).await?
    } else {
        None
    };
    let updated = tx
        .execute(
            &sql::<D>().interrupt_run,
            &[
                Arg::Int(lease.run_ref),
                Arg::Int(lease.attempt),
                Arg::Text(why),
            ],
        )
        .await?;
    if updated != 1 {
        return Err(lease_lost(lease));
    }
    end_attempt::<D>(&mut tx, lease, AttemptStatus::Interrupted, counts, None).await?;
    if let Some(before) = &before {
        notices::attempt_event::<D>(&mut tx, before, lease, counts, LineageEvent::Abort).await?;
    }
    wake_workers::<D>(&mut tx).await?;
    tx.commit().await
}

/// Tells idle workers of every process that a key was queued, when `tx`
/// commits (where the database can).
async fn wake_workers<D: Driver>(tx: &mut D::Tx) -> Result<(), Error> {
    if let Some(notify) = &sql::<D>().notify_queue {
        tx.execute(notify, &[]).await?;
    }
    Ok(())
}

pub(super) fn snapshot(row: &Record) -> Result<Snapshot, Error> {
    Ok(Snapshot {
        status: row.state("status")?,
        run_id: row.opt_text("run_id")?,
        lease_owner: row.opt_text("lease_owner")?,
        lease_host: row.opt_text("lease_host")?,
        lease_pid: row.opt_int("lease_pid")?,
        lease_expires_at: row.opt_text("lease_expires_at")?,
        lease_live: row.int("lease_live")? == 1,
        provisional: row.int("provisional")? != 0,
        checkpoint: row.json("checkpoint")?,
        result: row.json("result")?,
        handler_version: row.opt_text("handler_version")?,
        fields_fingerprint: row.opt_text("fields_fingerprint")?,
    })
}

fn counts_of(row: &Record) -> Result<Counts, Error> {
    let mut values = [None; Counts::COLUMNS.len()];
    for (value, column) in values.iter_mut().zip(Counts::COLUMNS) {
        *value = row.opt_int(column)?;
    }
    Ok(Counts::from_values(values))
}

/// The keys a crashed run's committed batches saw without writing.
async fn load_seen<D: Driver>(tx: &mut D::Tx, run_ref: i64, run_id: &str) -> Result<KeySet, Error> {
    let mut seen = KeySet::default();
    let args = [Arg::Int(run_ref), Arg::Text(run_id)];
    tx.fetch_each(&sql::<D>().select_seen, &args, |row| {
        decode_hashes(&row.bytes("key_hashes")?, &mut seen);
        Ok(())
    })
    .await?;
    Ok(seen)
}

/// The heartbeat waits for a row lock at most this share of the lease (a
/// claim's or the end of its own batch, both short); past it the renewal
/// fails as transient and is tried again at the next beat, well inside the
/// lease.
const HEARTBEAT_PATIENCE_SHARE: u32 = 6;

/// Extends the lease. `Ok(false)` when the attempt no longer holds it.
pub(crate) async fn heartbeat<D: Driver>(
    driver: &D,
    lease: &Lease,
    ttl: Duration,
) -> Result<bool, Error> {
    let s = sql::<D>();
    let mut tx = driver.begin().await?;
    if let Some(patience) = &s.heartbeat_patience {
        let millis = (ttl / HEARTBEAT_PATIENCE_SHARE)
            .as_millis()
            .max(1)
            .to_string();
        tx.execute(patience, &[Arg::Text(&millis)]).await?;
    }
    let renewed = tx
        .execute(
            &s.heartbeat,
            &[
                Arg::Float(ttl.as_secs_f64()),
                Arg::Int(lease.run_ref),
                Arg::Int(lease.attempt),
            ],
        )
        .await?;
    tx.commit().await?;
    Ok(renewed == 1)
}

/// The fencing check: the ledger must still hold this attempt, running.
/// On PostgreSQL it also holds the run row against claims until commit
/// (`FOR KEY SHARE`), never against the attempt's own heartbeat.
async fn fence<D: Driver>(tx: &mut D::Tx, lease: &Lease) -> Result<(), Error> {
    let args = [Arg::Int(lease.run_ref), Arg::Int(lease.attempt)];
    let fence = &sql::<D>().fence;
    let held = match D::DIALECT {
        Dialect::Postgres => fetch_optional(tx, fence, &args).await?.is_some(),
        Dialect::Sqlite => tx.execute(fence, &args).await? == 1,
    };
    if held {
        Ok(())
    } else {
        Err(lease_lost(lease))
    }
}

fn lease_lost(lease: &Lease) -> Error {
    Error::LeaseLost(format!(
        "attempt {} no longer holds the run key (another attempt took it over)",
        lease.attempt
    ))
}

/// Ends the attempt's history row.
async fn end_attempt<D: Driver>(
    tx: &mut D::Tx,
    lease: &Lease,
    status: AttemptStatus,
    counts: &Counts,
    error: Option<&Error>,
) -> Result<(), Error> {
    let message = error.map(ToString::to_string);
    let end = EndAttempt {
        status,
        counts: *counts,
        class: error.map(StoredClass::of),
        message: message.as_deref(),
        run_ref: lease.run_ref,
        attempt: lease.attempt,
    };
    tx.execute(&sql::<D>().end_attempt, &end.args()).await?;
    Ok(())
}

/// Records a failed attempt (fenced: a superseded attempt changes nothing);
/// its back-off counts from the database's clock.
pub(crate) async fn mark_failed<D: Driver>(
    driver: &D,
    lease: &Lease,
    counts: &Counts,
    error: &Error,
) -> Result<(), Error> {
    let message = error.to_string();
    let mut tx = driver.begin().await?;
    // Read before the change: whether this failure is news.
    let before = notices::before::<D>(&mut tx, lease).await?;
    let updated = tx
        .execute(
            &sql::<D>().fail_run,
            &[
                Arg::Text(StoredClass::of(error).as_str()),
                Arg::Text(&message),
                Arg::Int(lease.run_ref),
                Arg::Int(lease.attempt),
                Arg::OptInt(counts.rows_expected.and_then(|n| i64::try_from(n).ok())),
            ],
        )
        .await?;
    if updated == 1 {
        end_attempt::<D>(&mut tx, lease, AttemptStatus::Failed, counts, Some(error)).await?;
        if let Some(before) = &before {
            notices::failed::<D>(&mut tx, before, lease, counts, error).await?;
        }
    }
    tx.commit().await
}

/// Forgets a resumable checkpoint so the attempt starts the period over,
/// under a new run id (returned): rows the run wrote before must not count
/// as seen by the fresh start.
pub(crate) async fn restart_fresh<D: Driver>(driver: &D, lease: &Lease) -> Result<String, Error> {
    let s = sql::<D>();
    let run_id = new_run_id();
    let mut tx = driver.begin().await?;
    fence::<D>(&mut tx, lease).await?;
    tx.execute(
        &s.restart_run,
        &[Arg::Text(&run_id), Arg::Int(lease.run_ref)],
    )
    .await?;
    tx.execute(
        &s.restart_attempt,
        &[
            Arg::Text(&run_id),
            Arg::Int(lease.run_ref),
            Arg::Int(lease.attempt),
        ],
    )
    .await?;
    tx.execute(&s.delete_batches, &[Arg::Int(lease.run_ref)])
        .await?;
    tx.commit().await?;
    Ok(run_id)
}

/// Ledger rows of a pipeline, optionally for one period start.
pub(crate) async fn status<D: Driver>(
    driver: &D,
    pipeline: &str,
    period_start: Option<&str>,
) -> Result<Vec<LedgerEntry>, Error> {
    let mut entries = Vec::new();
    let range = StartRange {
        from: period_start,
        to: period_start,
    };
    status_each(driver, pipeline, range, |entry| {
        entries.push(entry);
        Ok(())
    })
    .await?;
    Ok(entries)
}

/// The rows of `pipeline` whose period starts lie in `range`, in the order
/// of their instants, handed to `each` as they are read: a ledger of
/// 100,000 run keys is never held at once.
pub(crate) async fn status_each<D: Driver>(
    driver: &D,
    pipeline: &str,
    range: StartRange<'_>,
    mut each: impl FnMut(LedgerEntry) -> Result<(), Error> + Send,
) -> Result<(), Error> {
    let mut tx = driver.begin_read().await?;
    tx.fetch_each(
        &sql::<D>().status,
        &[
            Arg::Text(pipeline),
            Arg::OptText(range.from),
            Arg::OptText(range.to),
        ],
        |row| each(entry_of(&row)?),
    )
    .await?;
    tx.commit().await
}

pub(super) fn entry_of(row: &Record) -> Result<LedgerEntry, Error> {
    let status: RunStatus = row.state("status")?;
    Ok(LedgerEntry {
        pipeline: row.text("pipeline")?,
        source: row.text("source")?,
        export_type: row.text("export_type")?,
        period_start: row.text("period_start")?,
        period_end: row.text("period_end")?,
        status,
        attempts: row.int("attempt")?,
        run_id: row.opt_text("run_id")?,
        counts: counts_of(row)?,
        error_class: row.opt_class("error_class")?,
        error_message: row.opt_text("error_message")?,
        started_at: row.opt_text("started_at")?,
        finished_at: row.opt_text("finished_at")?,
        handler_version: row.opt_text("handler_version")?,
        // The column is set when an attempt starts; it describes a result
        // only once there is one.
        provisional: status == RunStatus::Done && row.int("provisional")? != 0,
        stale: false,
        stale_reason: None,
        fields_fingerprint: row.opt_text("fields_fingerprint")?,
        lease_owner: row.opt_text("lease_owner")?,
        lease_expires_at: row.opt_text("lease_expires_at")?,
        priority: row.int("priority")?,
        not_before: row.opt_text("not_before")?,
        backing_off: row.int("backing_off")? != 0,
        enqueued_by: row.opt_text("enqueued_by")?,
        marked: row.opt_text("marked")?,
        mark_note: row.opt_text("mark_note")?,
    })
}

/// Deletes attempt history and rejects older than `age`; the numbers of
/// attempt rows and reject rows removed. An age reaching before the year 1
/// is refused, never turned into "delete everything".
pub(crate) async fn prune<D: Driver>(driver: &D, age: Duration) -> Result<(u64, u64), Error> {
    chrono::Duration::from_std(age)
        .ok()
        .and_then(|age| chrono::Utc::now().checked_sub_signed(age))
        .filter(|at| chrono::Datelike::year(at) >= 1)
        .ok_or_else(|| {
            Error::config(
                "command line",
                "older than",
                format!("{age:?} reaches back before the year 1"),
            )
        })?;
    // The cut-off is the database's clock minus `age`: the times compared
    // are the database's (this process's clock may be skewed).
    let age_secs = age.as_secs_f64();
    let age = [Arg::Float(age_secs)];
    let s = sql::<D>();
    let mut tx = driver.begin().await?;
    let attempts = tx.execute(&s.prune_attempts, &age).await?;
    let rejects = tx.execute(&s.prune_rejects, &age).await?;
    // Workers not seen for as long are gone: the table stays bounded.
    let workers = super::workers::prune(&mut tx, D::DIALECT, age[0]).await?;
    // Delivered notices past the TTL; dead ones stay until seen.
    let notices = notices::prune(&mut tx, D::DIALECT, age_secs).await?;
    tx.commit().await?;
    if workers > 0 {
        tracing::info!(workers, "pruned workers not seen for as long");
    }
    if notices > 0 {
        tracing::info!(notices, "pruned delivered notices older than the cut-off");
    }
    Ok((attempts, rejects))
}

/// Commits one batch: its rows, rejects, remembered keys, counts and
/// checkpoint, in one fenced transaction.
pub(crate) async fn apply_batch<D: Driver>(
    driver: &D,
    lease: &Lease,
    schema: &TableSchema,
    lineage: &Lineage,
    batch: &BatchWrite<'_>,
) -> Result<BatchOutcome, Error> {
    let (stamp, prepared, mut tx) =
        begin_batch(driver, lease, schema, lineage, batch, Commit::Alone).await?;
    let outcome = write_batch_in::<D>(
        driver, &mut tx, lease, schema, &stamp, batch, &prepared, true,
    )
    .await?;
    if outcome.direct_copy_conflict {
        // The transaction is aborted: dropped, it rolls back.
        drop(tx);
        let merged = Box::pin(apply_batch(driver, lease, schema, lineage, &batch.merged())).await?;
        return Ok(BatchOutcome {
            direct_copy_conflict: true,
            ..merged
        });
    }
    tx.commit().await?;
    Ok(outcome)
}

/// A batch's lineage stamp and its rows encoded (before any lock is
/// taken), then its fenced transaction.
async fn begin_batch<'l, D: Driver>(
    driver: &D,
    lease: &'l Lease,
    schema: &TableSchema,
    lineage: &'l Lineage,
    batch: &BatchWrite<'_>,
    commit: Commit,
) -> Result<(Stamp<'l>, D::Prepared, D::Tx), Error> {
    let stamp = Stamp {
        lineage,
        run_id: &lease.run_id,
        loaded_at: chrono::Utc::now(),
    };
    let prepared = driver.prepare(schema, &stamp, batch)?;
    let mut tx = match commit {
        Commit::Alone => driver.begin().await?,
        Commit::Shared => driver.begin_shared().await?,
    };
    fence::<D>(&mut tx, lease).await?;
    Ok((stamp, prepared, tx))
}

/// What the finishing transaction of a one-batch period did.
pub(crate) struct Finished {
    pub outcome: BatchOutcome,
    /// The run's result (its counts), as stored with `done`.
    pub result: serde_json::Value,
    /// The answer of the next key's claim, when one was carried.
    pub claim: Option<Claim>,
    /// When it is on disk (see [`Commit::Shared`]).
    pub durable: Durable,
}

/// A period that fits in one batch: the batch, the reconciliation and
/// `done` in one fenced transaction (one commit instead of two, and no
/// remembered keys: they would be deleted in the same transaction).
/// `existing` must already count the batch's keys as seen. With `next`,
/// the same transaction then claims the worker's next key (ADR 0022) and
/// returns the claim's answer. With [`Commit::Shared`] the commit may be
/// made later, with the next periods' ([`Finished::durable`]).
#[allow(clippy::too_many_arguments)] // the batch's and the finish's inputs
pub(crate) async fn apply_and_finish<D: Driver>(
    driver: &D,
    lease: &Lease,
    schema: &TableSchema,
    lineage: &Lineage,
    batch: &BatchWrite<'_>,
    existing: &StoredHashes,
    reconcile: &Reconcile,
    next: Option<&NextClaim>,
    commit: Commit,
) -> Result<Finished, Error> {
    let (stamp, prepared, mut tx) =
        begin_batch(driver, lease, schema, lineage, batch, commit).await?;
    let outcome = write_batch_in::<D>(
        driver, &mut tx, lease, schema, &stamp, batch, &prepared, false,
    )
    .await?;
    if outcome.direct_copy_conflict {
        // The transaction is aborted: dropped, it rolls back.
        drop(tx);
        let merged = batch.merged();
        let finished = Box::pin(apply_and_finish(
            driver, lease, schema, lineage, &merged, existing, reconcile, next, commit,
        ))
        .await?;
        let outcome = BatchOutcome {
            direct_copy_conflict: true,
            ..finished.outcome
        };
        return Ok(Finished {
            outcome,
            ..finished
        });
    }
    let mut counts = batch.counts;
    outcome.written.apply(&mut counts);
    // This batch remembers no keys; earlier ones may have (batch rows
    // exist only while `batches` counts them).
    let batch_rows = batch.batch_no > 1;
    let result = finish_in::<D>(
        driver, &mut tx, lease, schema, lineage, existing, reconcile, counts, batch_rows,
    )
    .await?;
    let claim = match piggy_back::<D>(&mut tx, next).await {
        Ok(claim) => claim,
        Err(e) => {
            piggy_back_failed(next, &e);
            drop(tx);
            return Box::pin(apply_and_finish(
                driver, lease, schema, lineage, batch, existing, reconcile, None, commit,
            ))
            .await;
        }
    };
    let durable = match commit {
        Commit::Alone => tx.commit().await.map(|()| Durable::now())?,
        Commit::Shared => tx.commit_shared().await?,
    };
    Ok(Finished {
        outcome,
        result,
        claim,
        durable,
    })
}

/// The writes of one batch inside `tx`: rows, rejects, remembered keys
/// (`remember`: not when the run finishes in the same transaction), counts
/// and checkpoint.
#[allow(clippy::too_many_arguments)] // one batch's inputs, passed through
async fn write_batch_in<D: Driver>(
    driver: &D,
    tx: &mut D::Tx,
    lease: &Lease,
    schema: &TableSchema,
    stamp: &Stamp<'_>,
    batch: &BatchWrite<'_>,
    prepared: &D::Prepared,
    remember: bool,
) -> Result<BatchOutcome, Error> {
    let s = sql::<D>();
    let lineage = stamp.lineage;
    let outcome = driver
        .write_rows(tx, schema, stamp, batch, prepared)
        .await?;
    if outcome.direct_copy_conflict {
        // Nothing more runs in an aborted transaction.
        return Ok(outcome);
    }
    for reject in batch.rejects {
        let insert = InsertReject {
            pipeline: &lineage.pipeline,
            source: &lineage.source,
            export_type: &lineage.export_type,
            period_start: &lineage.period_start,
            run_id: &lease.run_id,
            location: &reject.location,
            field: reject.field.as_deref(),
            value: reject.value.as_deref(),
            reason: &reject.reason,
            record: &reject.record,
        };
        tx.execute(&s.insert_reject, &insert.args()).await?;
    }
    if !remember {
        return Ok(outcome);
    }
    if let Some(keys) = batch.remembered_keys(&outcome.written) {
        tx.execute(
            &s.insert_batch_keys,
            &[
                Arg::Int(lease.run_ref),
                Arg::Text(&lease.run_id),
                Arg::Int(batch.batch_no),
                Arg::Bytes(&keys),
            ],
        )
        .await?;
    }
    let mut counts = batch.counts;
    outcome.written.apply(&mut counts);
    save_progress::<D>(tx, lease, &counts, Some(batch.checkpoint), batch.batch_no).await?;
    Ok(outcome)
}

async fn save_progress<D: Driver>(
    tx: &mut D::Tx,
    lease: &Lease,
    counts: &Counts,
    checkpoint: Option<&serde_json::Value>,
    batches: i64,
) -> Result<(), Error> {
    let progress = SaveProgress {
        checkpoint,
        batches,
        counts: *counts,
        run_ref: lease.run_ref,
    };
    tx.execute(&sql::<D>().save_progress, &progress.args())
        .await?;
    Ok(())
}

/// Reconciles vanished rows per `reconcile` and marks the run done, in one
/// fenced transaction. Returns the canonical result. `batches`: how many
/// the run has committed. With `next`, the same transaction then claims
/// the worker's next key (ADR 0022) and returns the claim's answer.
#[allow(clippy::too_many_arguments)] // the run's identity and its end state
pub(crate) async fn finish<D: Driver>(
    driver: &D,
    lease: &Lease,
    schema: &TableSchema,
    lineage: &Lineage,
    existing: &StoredHashes,
    reconcile: &Reconcile,
    counts: Counts,
    batches: i64,
    next: Option<&NextClaim>,
) -> Result<(serde_json::Value, Option<Claim>), Error> {
    let mut tx = driver.begin().await?;
    fence::<D>(&mut tx, lease).await?;
    // Batch rows exist only while `batches` counts them.
    let batch_rows = batches > 0;
    let result = finish_in::<D>(
        driver, &mut tx, lease, schema, lineage, existing, reconcile, counts, batch_rows,
    )
    .await?;
    let claim = match piggy_back::<D>(&mut tx, next).await {
        Ok(claim) => claim,
        Err(e) => {
            piggy_back_failed(next, &e);
            drop(tx);
            return Box::pin(finish(
                driver, lease, schema, lineage, existing, reconcile, counts, batches, None,
            ))
            .await;
        }
    };
    tx.commit().await?;
    Ok((result, claim))
}

/// Marks the run and its attempt `done` with their final counts; returns
/// the stored result, whose `finished_at` is the database's clock. One
/// statement where the dialect has one for both ([`Statements::finish_done`]).
async fn mark_done<D: Driver>(
    tx: &mut D::Tx,
    lease: &Lease,
    result: &serde_json::Value,
    counts: Counts,
) -> Result<serde_json::Value, Error> {
    let s = sql::<D>();
    let stored = match &s.finish_done {
        Some(both) => {
            let finish = FinishDone {
                result,
                counts,
                run_ref: lease.run_ref,
                attempt: lease.attempt,
            };
            fetch_optional(tx, both, &finish.args()).await?
        }
        None => {
            let finish = FinishRun {
                result,
                counts,
                run_ref: lease.run_ref,
            };
            let stored = fetch_optional(tx, &s.finish_run, &finish.args()).await?;
            end_attempt::<D>(tx, lease, AttemptStatus::Done, &counts, None).await?;
            stored
        }
    };
    stored
        .and_then(|row| row.json("result").transpose())
        .transpose()?
        .ok_or_else(|| Error::Database {
            message: format!(
                "the ledger row of run {} vanished as it finished",
                lease.run_id
            ),
            transient: true,
        })
}

/// The reconciliation and `done` inside `tx`.
#[allow(clippy::too_many_arguments)] // the run's identity and its end state
async fn finish_in<D: Driver>(
    driver: &D,
    tx: &mut D::Tx,
    lease: &Lease,
    schema: &TableSchema,
    lineage: &Lineage,
    existing: &StoredHashes,
    reconcile: &Reconcile,
    mut counts: Counts,
    batch_rows: bool,
) -> Result<serde_json::Value, Error> {
    let s = sql::<D>();
    if reconcile.on_missing != OnMissing::Keep {
        let (live, vanished) = driver.vanished(tx, schema, lineage, existing).await?;
        if let Some(why) =
            refuse_deletes(vanished.count() as u64, live, counts.rows_read, reconcile)
        {
            return Err(Error::DeletesRefused(why));
        }
        counts.rows_deleted = driver
            .remove_vanished(tx, schema, lineage, reconcile.on_missing, &vanished)
            .await?;
    }
    // Read before the change: whether the key had failed since done.
    let before = notices::before::<D>(tx, lease).await?;
    let result = result_json(lineage, lease, &counts);
    let result = mark_done::<D>(tx, lease, &result, counts).await?;
    if let Some(before) = &before {
        notices::done::<D>(tx, before, lease, &counts).await?;
    }
    if batch_rows {
        tx.execute(&s.delete_batches, &[Arg::Int(lease.run_ref)])
            .await?;
    }
    Ok(result)
}
