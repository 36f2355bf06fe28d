//! The summary of a status: how many of the lines shown are in each state,
//! and how fresh the data is (now minus the end of the newest period up to
//! which every period is done), the number `/metrics` exports as
//! `tidemark_freshness_seconds`.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use tidemark_load::RunStatus;

use super::StatusItem;

/// What one line of a status is: its calendar cell and its place in the
/// summary. A done key is told apart as marked, provisional or stale (in
/// that order: a cell has one state), a failed key as retrying while its
/// back-off (`not_before`) has not passed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum LineState {
    /// Done by a run of the current pipeline.
    Done,
    /// Done by `tidemark mark` (adopted or deliberately skipped).
    Marked,
    /// Done while its period was still open.
    Provisional,
    /// Done under another handler version or other `[fields]`.
    Stale,
    /// Failed; its back-off has passed (the next `sync` or fire runs it).
    Failed,
    /// Failed and backing off: no `sync` or schedule runs it before its
    /// `not_before`.
    Retrying,
    /// An attempt holds the lease.
    Running,
    /// Queued (or interrupted, waiting to resume).
    Pending,
    /// Taken out of the queue by `cancel`.
    Cancelled,
    /// No ledger row, and due: a gap.
    Missing,
    /// No ledger row, not due yet.
    NotDue,
}

impl LineState {
    /// Every state, in the order of a legend.
    pub const ALL: [LineState; 11] = [
        LineState::Done,
        LineState::Marked,
        LineState::Provisional,
        LineState::Stale,
        LineState::Failed,
        LineState::Retrying,
        LineState::Running,
        LineState::Pending,
        LineState::Cancelled,
        LineState::Missing,
        LineState::NotDue,
    ];

    /// Its name, as a legend and the web page's classes say it.
    pub fn name(self) -> &'static str {
        match self {
            LineState::Done => "done",
            LineState::Marked => "marked",
            LineState::Provisional => "provisional",
            LineState::Stale => "stale",
            LineState::Failed => "failed",
            LineState::Retrying => "retrying",
            LineState::Running => "running",
            LineState::Pending => "pending",
            LineState::Cancelled => "cancelled",
            LineState::Missing => "missing",
            LineState::NotDue => "not_due",
        }
    }

    /// Whether the line's period counts as done (for freshness, `sync`
    /// and the grid, marked periods do).
    pub fn is_done(self) -> bool {
        matches!(
            self,
            LineState::Done | LineState::Marked | LineState::Provisional | LineState::Stale
        )
    }
}

impl StatusItem {
    /// The line's state.
    pub fn state(&self) -> LineState {
        let entry = match self {
            StatusItem::Missing { due: true, .. } => return LineState::Missing,
            StatusItem::Missing { due: false, .. } => return LineState::NotDue,
            StatusItem::Recorded { entry, .. } => entry,
        };
        match entry.status {
            RunStatus::Done if entry.marked.is_some() => LineState::Marked,
            RunStatus::Done if entry.provisional => LineState::Provisional,
            RunStatus::Done if entry.stale => LineState::Stale,
            RunStatus::Done => LineState::Done,
            RunStatus::Failed if entry.backing_off => LineState::Retrying,
            RunStatus::Failed => LineState::Failed,
            RunStatus::Running => LineState::Running,
            RunStatus::Pending => LineState::Pending,
            RunStatus::Cancelled => LineState::Cancelled,
        }
    }

    /// The line's source.
    pub fn source(&self) -> &str {
        match self {
            StatusItem::Recorded { entry, .. } => &entry.source,
            StatusItem::Missing { source, .. } => source,
        }
    }

    /// Its period's start and end as instants (none for a ledger row whose
    /// stored times do not parse).
    pub fn instants(&self) -> Option<(DateTime<Utc>, DateTime<Utc>)> {
        match self {
            StatusItem::Recorded { entry, .. } => {
                let at = |t: &str| DateTime::parse_from_rfc3339(t).ok().map(|t| t.to_utc());
                Some((at(&entry.period_start)?, at(&entry.period_end)?))
            }
            StatusItem::Missing { period, .. } => {
                Some((period.start().to_utc(), period.end().to_utc()))
            }
        }
    }
}

/// The counts of the lines a status gave, and the freshness of every line
/// it read (`--only` narrows the lines, not what is fresh).
#[derive(Debug, Clone, Default)]
pub struct StatusSummary {
    /// Lines given.
    pub lines: usize,
    /// Lines given per state.
    pub states: BTreeMap<LineState, usize>,
    /// Done lines that are also stale (a marked or provisional line may be).
    pub stale: usize,
    /// Done lines that are also provisional.
    pub provisional: usize,
    /// Per source of the pipeline, how far its periods are done without a
    /// gap from the first line read.
    chains: BTreeMap<String, Chain>,
}

/// One source's run of done periods from its first line.
#[derive(Debug, Clone, Default)]
struct Chain {
    /// The end of the last period of the unbroken run; none while its
    /// first period is not done.
    through: Option<DateTime<Utc>>,
    /// The end of the last period read, to see a gap between two rows.
    last_end: Option<DateTime<Utc>>,
    /// A period that is not done (or a gap) was met: the run has ended.
    broken: bool,
}

impl StatusSummary {
    /// A summary over `sources`, the pipeline's: a source with no line at
    /// all leaves the pipeline with nothing complete.
    pub fn new(sources: &[String]) -> StatusSummary {
        StatusSummary {
            chains: sources
                .iter()
                .map(|s| (s.clone(), Chain::default()))
                .collect(),
            ..StatusSummary::default()
        }
    }

    /// How many lines given were in `state`.
    pub fn count(&self, state: LineState) -> usize {
        self.states.get(&state).copied().unwrap_or(0)
    }

    /// How many lines given were done in any way (marked, provisional and
    /// stale ones too).
    pub fn done(&self) -> usize {
        self.states
            .iter()
            .filter(|(state, _)| state.is_done())
            .map(|(_, n)| n)
            .sum()
    }

    /// How many lines given were failed (backing off or not).
    pub fn failed(&self) -> usize {
        self.count(LineState::Failed) + self.count(LineState::Retrying)
    }

    /// Counts a line given.
    pub(super) fn given(&mut self, item: &StatusItem) {
        let state = item.state();
        self.lines += 1;
        *self.states.entry(state).or_default() += 1;
        if let StatusItem::Recorded { entry, .. } = item {
            if entry.status == RunStatus::Done {
                self.stale += usize::from(entry.stale);
                self.provisional += usize::from(entry.provisional);
            }
        }
    }

    /// Whether `source`'s run of done periods is still being followed.
    pub(super) fn follows(&self, source: &str) -> bool {
        self.chains.get(source).is_some_and(|chain| !chain.broken)
    }

    /// Follows a line read (given or not) in its source's run of done
    /// periods. Lines come in period order.
    pub(super) fn read(&mut self, item: &StatusItem) {
        let Some(chain) = self.chains.get_mut(item.source()) else {
            return;
        };
        if chain.broken {
            return;
        }
        let Some((start, end)) = item.instants() else {
            chain.broken = true;
            return;
        };
        let gap = chain.last_end.is_some_and(|last| last != start);
        if gap || !item.state().is_done() {
            chain.broken = true;
            return;
        }
        chain.through = Some(end);
        chain.last_end = Some(end);
    }

    /// The end of the newest period up to which every period of every
    /// source is done (from the first line read on); none when a source's
    /// first period is not done, or a source has no line.
    pub fn complete_through(&self) -> Option<DateTime<Utc>> {
        let mut through = None;
        for chain in self.chains.values() {
            let end = chain.through?;
            through = Some(through.map_or(end, |t: DateTime<Utc>| t.min(end)));
        }
        through
    }

    /// Now minus [`StatusSummary::complete_through`] (zero for a done
    /// period still open).
    pub fn freshness(&self, now: DateTime<Utc>) -> Option<chrono::Duration> {
        self.complete_through()
            .map(|through| (now - through).max(chrono::Duration::zero()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tidemark_load::{Counts, LedgerEntry};

    fn day(d: u32, status: RunStatus) -> StatusItem {
        StatusItem::Recorded {
            entry: Box::new(LedgerEntry {
                pipeline: "p".into(),
                source: "s".into(),
                export_type: "e".into(),
                period_start: format!("2024-01-{d:02}T00:00:00Z"),
                period_end: format!("2024-01-{:02}T00:00:00Z", d + 1),
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
            }),
            due_at: None,
        }
    }

    fn through(items: &[StatusItem]) -> Option<String> {
        let mut summary = StatusSummary::new(&["s".to_string()]);
        for item in items {
            summary.read(item);
            summary.given(item);
        }
        summary
            .complete_through()
            .map(|t| t.format("%Y-%m-%d").to_string())
    }

    #[test]
    fn freshness_stops_at_the_first_period_not_done_or_absent() {
        let done = RunStatus::Done;
        assert_eq!(
            through(&[day(1, done), day(2, done), day(4, done)]),
            Some("2024-01-03".into()),
            "a gap in the ledger's rows stops it"
        );
        assert_eq!(
            through(&[day(1, done), day(2, RunStatus::Failed), day(3, done)]),
            Some("2024-01-02".into())
        );
        assert_eq!(through(&[day(1, RunStatus::Pending), day(2, done)]), None);
        assert_eq!(through(&[]), None, "a source with no line");
    }

    #[test]
    fn the_counts_add_up_to_the_lines() {
        let mut summary = StatusSummary::new(&["s".to_string()]);
        for item in [
            day(1, RunStatus::Done),
            day(2, RunStatus::Failed),
            day(3, RunStatus::Running),
        ] {
            summary.given(&item);
        }
        assert_eq!(summary.lines, 3);
        assert_eq!(
            (
                summary.done(),
                summary.failed(),
                summary.count(LineState::Running)
            ),
            (1, 1, 1)
        );
    }
}
