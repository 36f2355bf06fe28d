//! The ledger's flow, written once for every backend: claim, heartbeat,
//! fence, batch commit, finish, fail, restart, status and prune.
//!
//! Every write transaction of an attempt begins with the fencing `UPDATE`
//! of its run row (which on PostgreSQL also locks the row until commit), so
//! an attempt whose lease was taken over commits nothing more.

use std::time::Duration;

use tidemark_core::spec::OnMissing;
use tidemark_core::{Error, KeySet, RunKey};

use super::driver::{fetch_optional, Arg, Driver, LedgerTx, Record, Vanished as _};
use super::rules::{decide, Decision, Snapshot};
use super::sql::Statements;
use super::{
    decode_hashes, new_run_id, AttemptStatus, Claim, ClaimRequest, ClaimedRun, Counts, Lease,
    LedgerEntry, RunStatus,
};
use crate::schema::TableSchema;
use crate::stored::StoredHashes;
use crate::writer::{
    refuse_deletes, result_json, BatchOutcome, BatchWrite, Lineage, Reconcile, Stamp,
};

fn sql<D: Driver>() -> &'static Statements {
    Statements::of(D::DIALECT)
}

/// The six counters as arguments, in [`Counts::COLUMNS`] order.
fn count_args(counts: &Counts) -> [Arg<'static>; 6] {
    counts.values().map(Arg::Int)
}

/// Takes the run key for a new attempt, or explains why not: creates its
/// ledger row if missing, locks it, applies the claim rules and starts the
/// attempt, in one transaction.
pub(crate) async fn claim<D: Driver>(
    driver: &D,
    key: &RunKey,
    request: &ClaimRequest,
) -> Result<Claim, Error> {
    let s = sql::<D>();
    let (start, end) = (key.period.start_rfc3339(), key.period.end_rfc3339());
    let run_key = [
        Arg::Text(&key.pipeline),
        Arg::Text(&key.source),
        Arg::Text(&key.export_type),
        Arg::Text(&start),
    ];
    let mut tx = driver.begin().await?;
    let mut insert = run_key.to_vec();
    insert.push(Arg::Text(&end));
    tx.execute(&s.insert_run, &insert).await?;
    let row = fetch_optional(&mut tx, &s.lock_run, &run_key)
        .await?
        .ok_or_else(|| Error::Database {
            message: format!("the ledger row of {key} vanished during its claim"),
            transient: true,
        })?;
    let run_ref = row.int("id")?;
    let resume = match decide(snapshot(&row)?, request) {
        Decision::Done(result) => return Ok(Claim::Done(result)),
        Decision::Held { owner, expires_at } => return Ok(Claim::Held { owner, expires_at }),
        Decision::Take {
            resume,
            previous_lost,
        } => {
            if previous_lost {
                tx.execute(&s.lose_running_attempts, &[Arg::Int(run_ref)])
                    .await?;
            }
            resume
        }
    };
    let attempt = row.int("attempt")? + 1;
    let (run_id, counts, batches, seen, resume) = match resume {
        Some((checkpoint, run_id)) => {
            let seen = load_seen::<D>(&mut tx, run_ref, &run_id).await?;
            (
                run_id,
                counts_of(&row)?,
                row.int("batches")?,
                seen,
                Some(checkpoint),
            )
        }
        None => {
            tx.execute(&s.delete_batches, &[Arg::Int(run_ref)]).await?;
            (new_run_id(), Counts::default(), 0, KeySet::default(), None)
        }
    };
    let fresh = resume.is_none();
    let owner = request.worker.owner();
    let mut args = vec![
        Arg::Int(attempt),
        Arg::Text(&run_id),
        Arg::Text(&owner),
        Arg::Text(&request.worker.host),
        Arg::Int(i64::from(request.worker.pid)),
        Arg::Float(request.lease_ttl.as_secs_f64()),
        Arg::Bool(fresh),
        Arg::Int(batches),
    ];
    args.extend(count_args(&counts));
    args.extend([
        Arg::Text(&request.handler_version),
        Arg::Int(run_ref),
        Arg::Bool(request.provisional),
        Arg::Text(&request.fields_fingerprint),
    ]);
    tx.execute(&s.start_attempt, &args).await?;
    tx.execute(
        &s.insert_attempt,
        &[
            Arg::Int(run_ref),
            Arg::Int(attempt),
            Arg::Text(&run_id),
            Arg::Text(&owner),
            Arg::Bool(!fresh),
        ],
    )
    .await?;
    tx.commit().await?;
    Ok(Claim::Claimed(Box::new(ClaimedRun {
        lease: Lease {
            run_ref,
            attempt,
            run_id,
            owner,
        },
        resume,
        counts,
        batches,
        seen,
    })))
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
        checkpoint: row.json("checkpoint")?,
        result: row.json("result")?,
        handler_version: row.opt_text("handler_version")?,
        fields_fingerprint: row.opt_text("fields_fingerprint")?,
    })
}

fn counts_of(row: &Record) -> Result<Counts, Error> {
    let mut values = [0i64; 6];
    for (value, column) in values.iter_mut().zip(Counts::COLUMNS) {
        *value = row.int(column)?;
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

/// Extends the lease. `Ok(false)` when the attempt no longer holds it.
pub(crate) async fn heartbeat<D: Driver>(
    driver: &D,
    lease: &Lease,
    ttl: Duration,
) -> Result<bool, Error> {
    let mut tx = driver.begin().await?;
    let renewed = tx
        .execute(
            &sql::<D>().heartbeat,
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
async fn fence<D: Driver>(tx: &mut D::Tx, lease: &Lease) -> Result<(), Error> {
    let held = tx
        .execute(
            &sql::<D>().fence,
            &[Arg::Int(lease.run_ref), Arg::Int(lease.attempt)],
        )
        .await?;
    if held == 1 {
        Ok(())
    } else {
        Err(Error::LeaseLost(format!(
            "attempt {} no longer holds the run key (another attempt took it over)",
            lease.attempt
        )))
    }
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
    let mut args = vec![Arg::Text(status.as_str())];
    args.extend(count_args(counts));
    args.extend([
        Arg::OptText(error.map(|e| e.class().as_str())),
        Arg::OptText(message.as_deref()),
        Arg::Int(lease.run_ref),
        Arg::Int(lease.attempt),
    ]);
    tx.execute(&sql::<D>().end_attempt, &args).await?;
    Ok(())
}

/// Records a failed attempt (fenced: a superseded attempt changes nothing).
pub(crate) async fn mark_failed<D: Driver>(
    driver: &D,
    lease: &Lease,
    counts: &Counts,
    error: &Error,
) -> Result<(), Error> {
    let message = error.to_string();
    let mut tx = driver.begin().await?;
    let updated = tx
        .execute(
            &sql::<D>().fail_run,
            &[
                Arg::Text(error.class().as_str()),
                Arg::Text(&message),
                Arg::Int(lease.run_ref),
                Arg::Int(lease.attempt),
            ],
        )
        .await?;
    if updated == 1 {
        end_attempt::<D>(&mut tx, lease, AttemptStatus::Failed, counts, Some(error)).await?;
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
    let mut tx = driver.begin_read().await?;
    let mut entries = Vec::new();
    tx.fetch_each(
        &sql::<D>().status,
        &[Arg::Text(pipeline), Arg::OptText(period_start)],
        |row| {
            entries.push(entry_of(&row)?);
            Ok(())
        },
    )
    .await?;
    tx.commit().await?;
    Ok(entries)
}

fn entry_of(row: &Record) -> Result<LedgerEntry, Error> {
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
        error_class: row.opt_text("error_class")?,
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
    })
}

/// Deletes attempt history and rejects older than `age`; the numbers of
/// attempt rows and reject rows removed. An age reaching before the year 1
/// is refused, never turned into "delete everything".
pub(crate) async fn prune<D: Driver>(driver: &D, age: Duration) -> Result<(u64, u64), Error> {
    let cutoff = chrono::Duration::from_std(age)
        .ok()
        .and_then(|age| chrono::Utc::now().checked_sub_signed(age))
        .filter(|at| chrono::Datelike::year(at) >= 1)
        .ok_or_else(|| {
            Error::config(
                "command line",
                "--older-than",
                format!("{age:?} reaches back before the year 1"),
            )
        })?;
    let cutoff = crate::timestamp_text(cutoff);
    let s = sql::<D>();
    let mut tx = driver.begin().await?;
    let attempts = tx.execute(&s.prune_attempts, &[Arg::Text(&cutoff)]).await?;
    let rejects = tx.execute(&s.prune_rejects, &[Arg::Text(&cutoff)]).await?;
    tx.commit().await?;
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
    let s = sql::<D>();
    let stamp = Stamp {
        lineage,
        run_id: &lease.run_id,
        loaded_at: chrono::Utc::now(),
    };
    let prepared = driver.prepare(schema, &stamp, batch)?;
    let mut tx = driver.begin().await?;
    fence::<D>(&mut tx, lease).await?;
    let outcome = driver
        .write_rows(&mut tx, schema, &stamp, batch, &prepared)
        .await?;
    for reject in batch.rejects {
        tx.execute(
            &s.insert_reject,
            &[
                Arg::Text(&lineage.pipeline),
                Arg::Text(&lineage.source),
                Arg::Text(&lineage.export_type),
                Arg::Text(&lineage.period_start),
                Arg::Text(&lease.run_id),
                Arg::Text(&reject.location),
                Arg::OptText(reject.field.as_deref()),
                Arg::OptText(reject.value.as_deref()),
                Arg::Text(&reject.reason),
                Arg::Json(Some(&reject.record)),
            ],
        )
        .await?;
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
    save_progress::<D>(
        &mut tx,
        lease,
        &counts,
        Some(batch.checkpoint),
        batch.batch_no,
    )
    .await?;
    tx.commit().await?;
    Ok(outcome)
}

async fn save_progress<D: Driver>(
    tx: &mut D::Tx,
    lease: &Lease,
    counts: &Counts,
    checkpoint: Option<&serde_json::Value>,
    batches: i64,
) -> Result<(), Error> {
    let mut args = vec![Arg::Json(checkpoint), Arg::Int(batches)];
    args.extend(count_args(counts));
    args.push(Arg::Int(lease.run_ref));
    tx.execute(&sql::<D>().save_progress, &args).await?;
    Ok(())
}

/// Reconciles vanished rows per `reconcile` and marks the run done, in one
/// fenced transaction. Returns the canonical result.
pub(crate) async fn finish<D: Driver>(
    driver: &D,
    lease: &Lease,
    schema: &TableSchema,
    lineage: &Lineage,
    existing: &StoredHashes,
    reconcile: &Reconcile,
    mut counts: Counts,
) -> Result<serde_json::Value, Error> {
    let s = sql::<D>();
    let mut tx = driver.begin().await?;
    fence::<D>(&mut tx, lease).await?;
    if reconcile.on_missing != OnMissing::Keep {
        let (live, vanished) = driver.vanished(&mut tx, schema, lineage, existing).await?;
        if let Some(why) =
            refuse_deletes(vanished.count() as u64, live, counts.rows_read, reconcile)
        {
            return Err(Error::Invariant(why));
        }
        counts.rows_deleted = driver
            .remove_vanished(&mut tx, schema, lineage, reconcile.on_missing, &vanished)
            .await?;
    }
    let finished_at = crate::timestamp_text(chrono::Utc::now());
    let result = result_json(lineage, lease, &counts, &finished_at);
    save_progress::<D>(&mut tx, lease, &counts, None, 0).await?;
    tx.execute(
        &s.finish_run,
        &[Arg::Json(Some(&result)), Arg::Int(lease.run_ref)],
    )
    .await?;
    end_attempt::<D>(&mut tx, lease, AttemptStatus::Done, &counts, None).await?;
    tx.execute(&s.delete_batches, &[Arg::Int(lease.run_ref)])
        .await?;
    tx.commit().await?;
    Ok(result)
}
