//! What a period's state and its attempts' outcomes are called, derived
//! once from the ledger's rows so that every view (the page's grid and
//! period page, and any other reader of the engine) names them alike: a
//! failed key backing off is `retrying` until its `not_before`, a done key
//! recorded by `tidemark mark` is `marked`, an attempt that continued an
//! earlier one's batches is `resumed from batch N`.

use std::fmt;

use tidemark_load::{AttemptEntry, AttemptStatus, GridRow, LedgerEntry, RunStatus};

use crate::status::StatusItem;

/// The state of one period of one source, as a cell of the grid shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PeriodState {
    /// Done under the pipeline's current version and fields.
    Done,
    /// Done by `tidemark mark` (adopted or deliberately empty), not run.
    Marked,
    /// Done under another handler version or other `[fields]`.
    Stale,
    /// Done while its period was still open.
    Provisional,
    /// An attempt holds the lease now.
    Running,
    /// Failed or queued with a back-off whose `not_before` has not passed
    /// yet: the queue runs it again then.
    Retrying,
    /// The last attempt failed, and no back-off is pending.
    Failed,
    /// Queued, waiting for a worker (or interrupted, waiting to resume).
    Pending,
    /// Taken out of the queue by `cancel`.
    Cancelled,
    /// Due, and the ledger has no row for it: never run.
    Missing,
    /// No row, and not due yet (its end plus `lag` is still to come).
    NotDue,
}

impl PeriodState {
    /// Every state, in the order a legend lists them.
    pub const ALL: [PeriodState; 11] = [
        PeriodState::Done,
        PeriodState::Marked,
        PeriodState::Stale,
        PeriodState::Provisional,
        PeriodState::Running,
        PeriodState::Retrying,
        PeriodState::Failed,
        PeriodState::Pending,
        PeriodState::Cancelled,
        PeriodState::Missing,
        PeriodState::NotDue,
    ];

    /// The state of a status line.
    pub fn of(item: &StatusItem) -> PeriodState {
        match item {
            StatusItem::Recorded { entry, .. } => PeriodState::of_entry(entry),
            StatusItem::Missing { due: true, .. } => PeriodState::Missing,
            StatusItem::Missing { due: false, .. } => PeriodState::NotDue,
        }
    }

    /// The state of a ledger row (its staleness judged already).
    pub fn of_entry(entry: &LedgerEntry) -> PeriodState {
        PeriodState::of_parts(
            entry.status,
            entry.marked.is_some(),
            entry.stale,
            entry.provisional,
            entry.backing_off,
        )
    }

    /// The state of a grid row, `stale` as judged against the pipeline.
    pub fn of_row(row: &GridRow, stale: bool) -> PeriodState {
        PeriodState::of_parts(
            row.status,
            row.marked.is_some(),
            stale,
            row.provisional,
            row.backing_off,
        )
    }

    fn of_parts(
        status: RunStatus,
        marked: bool,
        stale: bool,
        provisional: bool,
        backing_off: bool,
    ) -> PeriodState {
        match status {
            RunStatus::Done if marked => PeriodState::Marked,
            RunStatus::Done if stale => PeriodState::Stale,
            RunStatus::Done if provisional => PeriodState::Provisional,
            RunStatus::Done => PeriodState::Done,
            RunStatus::Running => PeriodState::Running,
            RunStatus::Failed | RunStatus::Pending if backing_off => PeriodState::Retrying,
            RunStatus::Failed => PeriodState::Failed,
            RunStatus::Pending => PeriodState::Pending,
            RunStatus::Cancelled => PeriodState::Cancelled,
        }
    }

    /// Its name: one word, also the page's CSS class (`s-NAME`).
    pub fn as_str(self) -> &'static str {
        match self {
            PeriodState::Done => "done",
            PeriodState::Marked => "marked",
            PeriodState::Stale => "stale",
            PeriodState::Provisional => "provisional",
            PeriodState::Running => "running",
            PeriodState::Retrying => "retrying",
            PeriodState::Failed => "failed",
            PeriodState::Pending => "pending",
            PeriodState::Cancelled => "cancelled",
            PeriodState::Missing => "missing",
            PeriodState::NotDue => "not-due",
        }
    }

    /// What it means, for a legend.
    pub fn meaning(self) -> &'static str {
        match self {
            PeriodState::Done => "loaded",
            PeriodState::Marked => "marked done or skipped by an operator, not run",
            PeriodState::Stale => "done under another handler version or other [fields]",
            PeriodState::Provisional => "done while the period was still open",
            PeriodState::Running => "an attempt holds the lease",
            PeriodState::Retrying => "failed, backing off: runs again at not_before",
            PeriodState::Failed => "the last attempt failed",
            PeriodState::Pending => "queued, waiting for a worker",
            PeriodState::Cancelled => "taken out of the queue",
            PeriodState::Missing => "due, never run",
            PeriodState::NotDue => "not due yet",
        }
    }
}

impl fmt::Display for PeriodState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How one attempt ended, in the words `status --period` uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AttemptOutcome {
    /// Still under way.
    Running,
    /// Ended with the key done.
    Done,
    /// Ended with an error (permanent, or out of retries).
    Failed,
    /// Its worker stopped without a word (or lost its lease); a later
    /// claim took the key over.
    Lost,
    /// Stopped by a signal after its last committed batch.
    Interrupted,
    /// Not run: `tidemark mark` recorded the key as `done` or `skipped`.
    Marked(String),
}

impl AttemptOutcome {
    /// The outcome of `attempt`.
    pub fn of(attempt: &AttemptEntry) -> AttemptOutcome {
        if let Some(marked) = &attempt.marked {
            return AttemptOutcome::Marked(marked.clone());
        }
        match attempt.status {
            AttemptStatus::Running => AttemptOutcome::Running,
            AttemptStatus::Done => AttemptOutcome::Done,
            AttemptStatus::Failed => AttemptOutcome::Failed,
            AttemptStatus::Lost => AttemptOutcome::Lost,
            AttemptStatus::Interrupted => AttemptOutcome::Interrupted,
        }
    }

    /// One word, also a CSS class (`o-NAME`).
    pub fn as_str(&self) -> &'static str {
        match self {
            AttemptOutcome::Running => "running",
            AttemptOutcome::Done => "done",
            AttemptOutcome::Failed => "failed",
            AttemptOutcome::Lost => "lost",
            AttemptOutcome::Interrupted => "interrupted",
            AttemptOutcome::Marked(_) => "marked",
        }
    }
}

impl fmt::Display for AttemptOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AttemptOutcome::Marked(how) => write!(f, "marked {how}"),
            other => f.write_str(other.as_str()),
        }
    }
}

/// `resumed from batch N` (or `resumed`, for attempts recorded before the
/// batch was), when the attempt continued an earlier one's batches.
pub fn resumption(attempt: &AttemptEntry) -> Option<String> {
    match (attempt.resumed, attempt.from_batch) {
        (true, Some(batch)) => Some(format!("resumed from batch {batch}")),
        (true, None) => Some("resumed".to_string()),
        (false, _) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tidemark_load::Counts;

    fn entry(status: RunStatus) -> LedgerEntry {
        LedgerEntry {
            pipeline: "p".into(),
            source: "s".into(),
            export_type: "t".into(),
            period_start: "2024-01-01T00:00:00+00:00".into(),
            period_end: "2024-01-02T00:00:00+00:00".into(),
            status,
            attempts: 1,
            run_id: None,
            counts: Counts::default(),
            error_class: None,
            error_message: None,
            started_at: None,
            finished_at: None,
            handler_version: None,
            provisional: false,
            stale: false,
            stale_reason: None,
            fields_fingerprint: None,
            lease_owner: None,
            lease_expires_at: None,
            priority: 0,
            not_before: None,
            backing_off: false,
            enqueued_by: None,
            marked: None,
            mark_note: None,
        }
    }

    #[test]
    fn a_failed_key_backing_off_is_retrying() {
        assert_eq!(
            PeriodState::of_entry(&entry(RunStatus::Failed)),
            PeriodState::Failed
        );
        let mut backing_off = entry(RunStatus::Failed);
        backing_off.backing_off = true;
        assert_eq!(PeriodState::of_entry(&backing_off), PeriodState::Retrying);
        backing_off.status = RunStatus::Pending;
        assert_eq!(PeriodState::of_entry(&backing_off), PeriodState::Retrying);
    }

    #[test]
    fn marked_comes_before_stale_and_provisional() {
        let mut done = entry(RunStatus::Done);
        done.stale = true;
        assert_eq!(PeriodState::of_entry(&done), PeriodState::Stale);
        done.marked = Some("skipped".into());
        assert_eq!(PeriodState::of_entry(&done), PeriodState::Marked);
        let mut open = entry(RunStatus::Done);
        open.provisional = true;
        assert_eq!(PeriodState::of_entry(&open), PeriodState::Provisional);
    }

    #[test]
    fn state_names_are_distinct() {
        let mut names: Vec<&str> = PeriodState::ALL.iter().map(|s| s.as_str()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), PeriodState::ALL.len());
    }
}
