//! A run key's story as the ledger kept it: every attempt with its own
//! start, end, worker and outcome (`_tm_attempts`), and the first records
//! its current run rejected (`_tm_rejects`). `status --period` prints it;
//! the latest attempt alone (what `_tm_runs` holds) cannot say that attempt
//! 1 was lost on one host and attempt 2 resumed it on another.

use serde::Serialize;
use tidemark_core::Error;

use super::driver::{Arg, Driver, LedgerTx, Record};
use super::flow::sql;
use super::{AttemptStatus, LedgerEntry, StoredClass};

/// The most rejected records a story shows; the rest are counted.
pub const FIRST_REJECTS: i64 = 10;

/// One attempt of a run key (`_tm_attempts`).
#[derive(Debug, Clone, Serialize)]
pub struct AttemptEntry {
    /// Its number, from 1.
    pub attempt: i64,
    /// The run id its rows are stamped with (a resumed attempt keeps it).
    pub run_id: String,
    /// Its worker: `host:pid:instance`.
    pub worker: String,
    /// How it ended, or `running`.
    pub status: AttemptStatus,
    /// It continued an earlier attempt's committed batches.
    pub resumed: bool,
    /// The batch count it continued from, when it resumed (recorded since
    /// migration 7; NULL for older attempts).
    pub from_batch: Option<i64>,
    /// Rows read by the run when the attempt ended (NULL while running, or
    /// when it was lost).
    pub rows_read: Option<i64>,
    /// Rows inserted by then.
    pub rows_inserted: Option<i64>,
    /// Rows updated by then.
    pub rows_updated: Option<i64>,
    /// Rows deleted by then.
    pub rows_deleted: Option<i64>,
    /// Rows rejected by then.
    pub rows_rejected: Option<i64>,
    /// Why it ended without `done`.
    pub error_class: Option<StoredClass>,
    /// The failure's message.
    pub error_message: Option<String>,
    /// When it started (the database's clock).
    pub started_at: String,
    /// When it ended.
    pub finished_at: Option<String>,
    /// `done` or `skipped` when the attempt was a `tidemark mark`, not a
    /// run (its worker is then `mark:user@host:pid`).
    pub marked: Option<String>,
    /// The operator's note of that mark.
    pub mark_note: Option<String>,
}

impl AttemptEntry {
    /// The worker's host and process id, from `host:pid:instance`.
    pub fn host_pid(&self) -> (&str, &str) {
        let mut parts = self.worker.rsplitn(3, ':');
        let _instance = parts.next();
        let pid = parts.next().unwrap_or("?");
        let host = parts.next().unwrap_or(&self.worker);
        (host, pid)
    }
}

/// One rejected record (`_tm_rejects`).
#[derive(Debug, Clone, Serialize)]
pub struct RejectEntry {
    /// Where in the source: `line 14`, `page 3 record 7`.
    pub location: String,
    /// The field at fault, when one is.
    pub field: Option<String>,
    /// The value at fault.
    pub value: Option<String>,
    /// Why it was rejected.
    pub reason: String,
}

/// A run key's attempts, oldest first, and its current run's first rejects.
#[derive(Debug, Clone, Default, Serialize)]
pub struct History {
    /// Every attempt the ledger still holds (`prune` removes old ones).
    pub attempts: Vec<AttemptEntry>,
    /// The current run's first [`FIRST_REJECTS`] rejected records.
    pub rejects: Vec<RejectEntry>,
    /// How many records the current run rejected in all.
    pub rejects_total: i64,
}

/// The story of `entry`'s run key.
pub(crate) async fn history<D: Driver>(driver: &D, entry: &LedgerEntry) -> Result<History, Error> {
    let s = sql::<D>();
    let key = [
        Arg::Text(&entry.pipeline),
        Arg::Text(&entry.source),
        Arg::Text(&entry.export_type),
        Arg::Text(&entry.period_start),
    ];
    let mut history = History::default();
    let mut tx = driver.begin_read().await?;
    tx.fetch_each(&s.attempts, &key, |row| {
        history.attempts.push(attempt_of(&row)?);
        Ok(())
    })
    .await?;
    if let Some(run_id) = &entry.run_id {
        let args = [
            Arg::Text(&entry.pipeline),
            Arg::Text(&entry.source),
            Arg::Text(&entry.export_type),
            Arg::Text(&entry.period_start),
            Arg::Text(run_id),
            Arg::Int(FIRST_REJECTS),
        ];
        tx.fetch_each(&s.rejects, &args, |row| {
            history.rejects.push(reject_of(&row)?);
            Ok(())
        })
        .await?;
        tx.fetch_each(&s.reject_count, &args[..5], |row| {
            history.rejects_total = row.int("n")?;
            Ok(())
        })
        .await?;
    }
    tx.commit().await?;
    Ok(history)
}

fn attempt_of(row: &Record) -> Result<AttemptEntry, Error> {
    Ok(AttemptEntry {
        attempt: row.int("attempt")?,
        run_id: row.text("run_id")?,
        worker: row.text("worker")?,
        status: row.state("status")?,
        resumed: row.int("resumed")? != 0,
        from_batch: row.opt_int("from_batch")?,
        rows_read: row.opt_int("rows_read")?,
        rows_inserted: row.opt_int("rows_inserted")?,
        rows_updated: row.opt_int("rows_updated")?,
        rows_deleted: row.opt_int("rows_deleted")?,
        rows_rejected: row.opt_int("rows_rejected")?,
        error_class: row.opt_class("error_class")?,
        error_message: row.opt_text("error_message")?,
        started_at: row.text("started_at")?,
        finished_at: row.opt_text("finished_at")?,
        marked: row.opt_text("marked")?,
        mark_note: row.opt_text("mark_note")?,
    })
}

fn reject_of(row: &Record) -> Result<RejectEntry, Error> {
    Ok(RejectEntry {
        location: row.text("location")?,
        field: row.opt_text("field")?,
        value: row.opt_text("value")?,
        reason: row.text("reason")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attempt(worker: &str) -> AttemptEntry {
        AttemptEntry {
            attempt: 1,
            run_id: "r".into(),
            worker: worker.into(),
            status: AttemptStatus::Done,
            resumed: false,
            from_batch: None,
            rows_read: None,
            rows_inserted: None,
            rows_updated: None,
            rows_deleted: None,
            rows_rejected: None,
            error_class: None,
            error_message: None,
            started_at: String::new(),
            finished_at: None,
            marked: None,
            mark_note: None,
        }
    }

    #[test]
    fn host_and_pid_come_from_the_owner() {
        assert_eq!(attempt("db-1:812:ab12").host_pid(), ("db-1", "812"));
        // A host name is never split on its own colons (an IPv6 literal).
        assert_eq!(attempt("fe80::1:812:ab12").host_pid(), ("fe80::1", "812"));
        assert_eq!(attempt("odd").host_pid(), ("odd", "?"));
    }
}
