//! Marking run keys `done` without running them (`tidemark mark`): periods
//! another tool loaded (adoption, [`MarkAs::Done`]) or that are deliberately
//! empty ([`MarkAs::Skipped`]). A marked key is a `done` row like any other
//! (so `sync`, `backfill --only missing`, dry runs and freshness count it
//! as done), with `marked` and `mark_note` set on the row and on the
//! attempt that recorded it; the next real attempt clears them on the row
//! (`start_attempt`).
//!
//! One transaction per call; a command marks a page of keys per call.

use tidemark_core::Error;

use super::driver::{fetch_optional, Arg, Driver, LedgerTx};
use super::flow::sql;
use super::sql::MarkRun;
use super::{new_run_id, Counts, QueueKey, RunStatus};

/// What a mark records a key as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MarkAs {
    /// Loaded by another tool: its rows are there (adoption).
    Done,
    /// Deliberately empty: nothing to load.
    Skipped,
}

impl MarkAs {
    /// The name stored in `marked`.
    pub fn as_str(self) -> &'static str {
        match self {
            MarkAs::Done => "done",
            MarkAs::Skipped => "skipped",
        }
    }
}

/// Keys of one pipeline to mark, and how.
#[derive(Debug, Clone)]
pub struct Mark<'a> {
    /// Pipeline name.
    pub pipeline: &'a str,
    /// Its export type.
    pub export_type: &'a str,
    /// The keys (the period end is stored for new rows).
    pub keys: &'a [QueueKey],
    /// Done or skipped.
    pub marked: MarkAs,
    /// The operator's note.
    pub note: &'a str,
    /// Re-mark keys that are done already.
    pub force: bool,
    /// The pipeline's handler version, recorded (so the key is not stale).
    pub handler_version: &'a str,
    /// The fingerprint of its `[fields]`, recorded likewise.
    pub fields_fingerprint: &'a str,
    /// Who marks: the attempt's worker (`mark:user@host:pid`).
    pub worker: &'a str,
}

/// A key a mark left alone because a run holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldKey {
    /// Source id.
    pub source: String,
    /// Period start (RFC 3339).
    pub period_start: String,
    /// The holder (`host:pid:instance`), as its lease names it.
    pub owner: String,
}

/// What a mark did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Marked {
    /// Keys recorded as marked.
    pub marked: u64,
    /// Keys left as they were because they were done (without `force`).
    pub already_done: u64,
    /// Keys left as they were because they were running.
    pub held: Vec<HeldKey>,
}

/// Marks `mark.keys`, in one transaction.
pub(crate) async fn mark<D: Driver>(driver: &D, mark: &Mark<'_>) -> Result<Marked, Error> {
    let s = sql::<D>();
    let mut outcome = Marked::default();
    let mut tx = driver.begin().await?;
    for key in mark.keys {
        let run_key = [
            Arg::Text(mark.pipeline),
            Arg::Text(&key.source),
            Arg::Text(mark.export_type),
            Arg::Text(&key.period_start),
        ];
        let mut insert = run_key.to_vec();
        insert.push(Arg::Text(&key.period_end));
        tx.execute(&s.insert_run, &insert).await?;
        let Some(row) = fetch_optional(&mut tx, &s.lock_run, &run_key).await? else {
            // PostgreSQL: a batch of a running attempt holds the row.
            let row = fetch_optional(&mut tx, &s.read_run, &run_key).await?;
            let owner = row
                .map(|r| r.opt_text("lease_owner"))
                .transpose()?
                .flatten();
            outcome.held.push(HeldKey {
                source: key.source.clone(),
                period_start: key.period_start.clone(),
                owner: owner.unwrap_or_else(|| "another transaction".to_string()),
            });
            continue;
        };
        let status: RunStatus = row.state("status")?;
        match status {
            RunStatus::Running => {
                outcome.held.push(HeldKey {
                    source: key.source.clone(),
                    period_start: key.period_start.clone(),
                    owner: row
                        .opt_text("lease_owner")?
                        .unwrap_or_else(|| "an unknown holder".to_string()),
                });
                continue;
            }
            RunStatus::Done if !mark.force => {
                outcome.already_done += 1;
                continue;
            }
            RunStatus::Done | RunStatus::Pending | RunStatus::Failed | RunStatus::Cancelled => {}
        }
        let run_ref = row.int("id")?;
        let attempt = row.int("attempt")? + 1;
        let run_id = new_run_id();
        if row.int("batches")? > 0 {
            tx.execute(&s.delete_batches, &[Arg::Int(run_ref)]).await?;
        }
        let mut result = serde_json::json!({
            "pipeline": mark.pipeline,
            "source": row.text("source")?,
            "export_type": mark.export_type,
            "period_start": row.text("period_start")?,
            "period_end": row.text("period_end")?,
            "status": RunStatus::Done.as_str(),
            "attempts": attempt,
            "run_id": run_id,
        });
        if let (Some(map), Ok(serde_json::Value::Object(c))) = (
            result.as_object_mut(),
            serde_json::to_value(Counts::default()),
        ) {
            map.extend(c);
        }
        if let Some(map) = result.as_object_mut() {
            map.insert("marked".into(), mark.marked.as_str().into());
            map.insert("mark_note".into(), mark.note.into());
        }
        let params = MarkRun {
            attempt,
            run_id: &run_id,
            result: &result,
            handler_version: mark.handler_version,
            fingerprint: mark.fields_fingerprint,
            marked: mark.marked.as_str(),
            note: mark.note,
            run_ref,
        };
        tx.execute(&s.mark_run, &params.args()).await?;
        tx.execute(
            &s.insert_mark_attempt,
            &[
                Arg::Int(run_ref),
                Arg::Int(attempt),
                Arg::Text(&run_id),
                Arg::Text(mark.worker),
                Arg::Text(mark.marked.as_str()),
                Arg::Text(mark.note),
            ],
        )
        .await?;
        outcome.marked += 1;
    }
    tx.commit().await?;
    Ok(outcome)
}
