//! What is due for a pipeline at an instant: one decision shared by `sync`
//! (which runs it) and the `serve` scheduler (which queues it), so the two
//! can never disagree.
//!
//! Due are the periods from `period.start` through the last whose end +
//! `lag` has passed. Of those, per source:
//! - a period with no ledger row runs;
//! - a failed period runs again once its backoff (`not_before`: 1 min,
//!   doubling, at most 24 h) has passed, so a permanently failing source is
//!   not read again at every fire;
//! - the last `lookback` done periods run again, forced (late data);
//! - a cancelled period stays out until an operator runs or queues it.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use tidemark_core::{Error, Period, Pipeline};
use tidemark_load::{LedgerEntry, RunStatus};

/// One source's due periods, by what they need.
#[derive(Debug, Default)]
pub struct Due {
    /// Never run (no ledger row): run them.
    pub first_runs: Vec<Period>,
    /// Failed, and past their backoff: run them again.
    pub retries: Vec<Period>,
    /// Done, and among the last `lookback` due periods: run them again,
    /// forced.
    pub again: Vec<Period>,
    /// Due, but waiting: failed with a backoff that has not passed yet,
    /// pending or running elsewhere, or cancelled by an operator.
    pub waiting: usize,
}

impl Due {
    /// Every period to run, in period order, with whether it is forced.
    pub fn runs(&self) -> Vec<(Period, bool)> {
        let mut runs: Vec<(Period, bool)> = self
            .first_runs
            .iter()
            .chain(&self.retries)
            .map(|p| (*p, false))
            .chain(self.again.iter().map(|p| (*p, true)))
            .collect();
        runs.sort_by_key(|(p, _)| p.start());
        runs
    }
}

/// The due work of `source` of `pipeline` at `now`, given the pipeline's
/// ledger rows.
pub fn due(
    pipeline: &Pipeline,
    source: &str,
    entries: &[LedgerEntry],
    now: DateTime<Utc>,
) -> Result<Due, Error> {
    let rows: HashMap<&str, &LedgerEntry> = entries
        .iter()
        .filter(|e| e.source == source && e.export_type == pipeline.spec.export_type)
        .map(|e| (e.period_start.as_str(), e))
        .collect();
    let lookback = usize::try_from(pipeline.spec.period.lookback).unwrap_or(usize::MAX);
    let mut due = Due::default();
    let mut done = Vec::new();
    for period in pipeline.due_periods(now)? {
        match rows.get(period.start_rfc3339().as_str()) {
            None => due.first_runs.push(period),
            Some(entry) => match entry.status {
                RunStatus::Done => done.push(period),
                RunStatus::Failed if backoff_passed(entry, now) => due.retries.push(period),
                RunStatus::Failed
                | RunStatus::Pending
                | RunStatus::Running
                | RunStatus::Cancelled => due.waiting += 1,
            },
        }
    }
    due.again = done.iter().rev().take(lookback).rev().copied().collect();
    Ok(due)
}

/// Whether a failed key's `not_before` has passed at `now` (or it has none).
fn backoff_passed(entry: &LedgerEntry, now: DateTime<Utc>) -> bool {
    entry
        .not_before
        .as_deref()
        .and_then(|t| DateTime::parse_from_rfc3339(t).ok())
        .map_or(true, |at| at <= now)
}
