//! `status`: what happened to each run key of a pipeline, answered from the
//! ledger alone (no source is read, no secret is needed).
//!
//! With a range (`--period`, or `--from`/`--to`) the periods the ledger has
//! no row for are shown too, as `missing`: "what happened to last Tuesday?"
//! has an answer even when nothing ever ran. The ledger streams in ordered
//! by period start as an instant, and the expected periods are merged in as
//! it does, so a range of 100,000 hourly periods is never held at once.

use std::iter::Peekable;

use chrono::{DateTime, FixedOffset, Utc};
use tidemark_core::{Error, FieldsFingerprint, Period, Pipeline};
use tidemark_load::{LedgerEntry, RunStatus, StartRange, Store};

use crate::run::Backoff;

mod calendar;
mod summary;

pub use calendar::{Calendar, CalendarBuilder, CalendarRow, CALENDAR_MAX_PERIODS};
pub use summary::{LineState, StatusSummary};

/// A selection by state (`status --only`): the ledger's states
/// (docs/ledger.md), plus `missing` (no row: never run), `stale` and
/// `provisional` (done, with a note).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatusFilter {
    /// Queued, waiting for a worker (or interrupted, waiting to resume).
    Pending,
    /// An attempt holds the lease now.
    Running,
    /// Finished.
    Done,
    /// The last attempt failed.
    Failed,
    /// Taken out of the queue by `cancel`.
    Cancelled,
    /// No ledger row: the period was never run (or queued).
    Missing,
    /// Done under another handler version or other `[fields]`.
    Stale,
    /// Done while its period was still open.
    Provisional,
}

/// One line of a pipeline's status.
#[derive(Debug, Clone)]
pub enum StatusItem {
    /// A ledger row (staleness judged against the pipeline as loaded), and
    /// when its period becomes (or became) due.
    Recorded {
        /// The row (boxed: it is many times larger than a missing line).
        entry: Box<LedgerEntry>,
        /// Its period's end plus `lag`.
        due_at: Option<DateTime<Utc>>,
    },
    /// No ledger row: never run, never queued. `due` tells a gap
    /// (`missing`: due since `due_at`) from a period still to come
    /// (`not_due`: due at `due_at`).
    Missing {
        /// The pipeline's name.
        pipeline: String,
        /// The source.
        source: String,
        /// The pipeline's export type.
        export_type: String,
        /// The period.
        period: Period,
        /// Its end plus `lag`.
        due_at: Option<DateTime<Utc>>,
        /// Whether it is due at the status's `now`.
        due: bool,
    },
}

/// What a status asks for.
#[derive(Debug, Clone, Copy, Default)]
pub struct StatusQuery {
    /// The periods whose absence is worth a `missing` line (see
    /// [`expected_range`]); `None`: only what the ledger holds.
    pub range: Option<(Period, Period)>,
    /// Only the lines in this state.
    pub only: Option<StatusFilter>,
}

/// The periods whose absence from the ledger is worth a `missing` line:
/// the asked range, or, for `--only missing` without one, every period
/// from `period.start` through the last due one.
pub fn expected_range(
    pipeline: &Pipeline,
    asked: Option<(Period, Period)>,
    only: Option<StatusFilter>,
    now: DateTime<Utc>,
) -> Result<Option<(Period, Period)>, Error> {
    if asked.is_some() {
        return Ok(asked);
    }
    if only == Some(StatusFilter::Missing) {
        // Walked, not collected: only the first and the last are kept.
        let mut due = pipeline.due_periods(now)?;
        let first = due.next();
        return Ok(first.map(|first| (first, due.last().unwrap_or(first))));
    }
    Ok(None)
}

/// The status of `pipeline` at `now`, each line handed to `each` as the
/// ledger streams in (ordered by period start as an instant), with the
/// expected periods merged in: a range of 100,000 hourly periods is never
/// held at once. Returns how many lines it gave. Without a ledger
/// (`store` is `None`) only `missing` lines come.
///
/// A read that fails transiently before any line was given is tried again
/// with the pipeline's retries; once lines are out, a retry would give them
/// twice, so the error is returned instead.
pub async fn status(
    store: Option<&Store>,
    pipeline: &Pipeline,
    query: StatusQuery,
    now: DateTime<Utc>,
    each: impl FnMut(StatusItem) + Send,
) -> Result<usize, Error> {
    let report = status_report(store, pipeline, query, now, false, each).await?;
    Ok(report.summary.lines)
}

/// What a status gives besides its lines: their summary, and with
/// `calendar` asked the calendars of every line read.
#[derive(Debug, Clone)]
pub struct StatusReport {
    /// The counts of the lines given and the freshness of those read.
    pub summary: StatusSummary,
    /// One calendar per source ([`CalendarBuilder`]); `None` when not
    /// asked, or when the range is longer than [`CALENDAR_MAX_PERIODS`].
    pub calendars: Option<Vec<Calendar>>,
}

/// [`status`], with its summary and, when `calendar`, its calendars: the
/// summary counts the lines given (so it agrees with the table), its
/// freshness and the calendars follow every line read (`--only` narrows
/// what is listed, not what is fresh).
pub async fn status_report(
    store: Option<&Store>,
    pipeline: &Pipeline,
    query: StatusQuery,
    now: DateTime<Utc>,
    calendar: bool,
    mut each: impl FnMut(StatusItem) + Send,
) -> Result<StatusReport, Error> {
    let starts = query
        .range
        .map(|(from, to)| (from.start_rfc3339(), to.start_rfc3339()));
    let ledger_range = StartRange {
        from: starts.as_ref().map(|(from, _)| from.as_str()),
        to: starts.as_ref().map(|(_, to)| to.as_str()),
    };
    let mut sources = crate::catalog::source_ids(pipeline, None)?;
    sources.sort();
    let mut backoff = Backoff::new(&pipeline.retry);
    loop {
        let watch = Watch {
            summary: StatusSummary::new(&sources),
            calendar: calendar.then(|| CalendarBuilder::new(pipeline)),
        };
        let mut view = View::new(pipeline, query, sources.clone(), now, watch, &mut each);
        let read = match store {
            Some(store) => {
                store
                    .status_each(&pipeline.spec.name, ledger_range, |entry| {
                        view.push(entry);
                        Ok(())
                    })
                    .await
            }
            None => Ok(()),
        };
        match read {
            Err(e) if view.given() == 0 && backoff.should_retry(&e, "read the ledger").await => {}
            Err(e) => return Err(e),
            Ok(()) => return Ok(view.finish()),
        }
    }
}

/// What a view keeps of the lines besides handing them on.
struct Watch {
    summary: StatusSummary,
    calendar: Option<CalendarBuilder>,
}

impl Watch {
    /// Whether a line of `source` that is not given still matters: to the
    /// calendar, or to a freshness still being followed (a million
    /// periods `--only failed` leaves out are not each made into a line).
    fn needs(&self, source: &str) -> bool {
        self.calendar.is_some() || self.summary.follows(source)
    }

    /// A line read, before `--only` decides whether it is given.
    fn read(&mut self, item: &StatusItem) {
        self.summary.read(item);
        if let Some(calendar) = &mut self.calendar {
            calendar.read(item);
        }
    }
}

/// The merge of the ledger stream with the expected periods.
struct View<'a, F> {
    pipeline: &'a Pipeline,
    only: Option<StatusFilter>,
    sources: Vec<String>,
    fingerprint: FieldsFingerprint,
    /// The expected periods not reached yet.
    expected: Option<Peekable<Box<dyn Iterator<Item = Period> + Send + 'a>>>,
    /// The ledger rows of one period start, waiting for the next start.
    group: Vec<LedgerEntry>,
    each: &'a mut F,
    watch: Watch,
    /// The clock that decides what is due: an expected period without a
    /// ledger row is `missing` once due, `not_due` before.
    now: DateTime<Utc>,
}

impl<'a, F: FnMut(StatusItem) + Send> View<'a, F> {
    /// `sources`: every source of the pipeline, in the ledger's order.
    fn new(
        pipeline: &'a Pipeline,
        query: StatusQuery,
        sources: Vec<String>,
        now: DateTime<Utc>,
        watch: Watch,
        each: &'a mut F,
    ) -> Self {
        let expected = query.range.map(|(from, to)| {
            let periods: Box<dyn Iterator<Item = Period> + Send> =
                Box::new(Period::range_inclusive(from, to));
            periods.peekable()
        });
        View {
            pipeline,
            only: query.only,
            sources,
            fingerprint: pipeline.fields_fingerprint(),
            expected,
            group: Vec::new(),
            each,
            watch,
            now,
        }
    }

    fn push(&mut self, mut entry: LedgerEntry) {
        entry.judge_staleness(&self.pipeline.spec.version, &self.fingerprint);
        if self
            .group
            .first()
            .is_some_and(|first| first.period_start != entry.period_start)
        {
            self.flush_group();
        }
        self.group.push(entry);
    }

    /// Prints the held group, after the expected periods that come before
    /// it, with a `missing` line for each source of the pipeline the group
    /// lacks when it is an expected period itself.
    fn flush_group(&mut self) {
        let group = std::mem::take(&mut self.group);
        let Some(first) = group.first() else {
            return;
        };
        let at = DateTime::parse_from_rfc3339(&first.period_start).ok();
        let mut matched = None;
        if let (Some(at), Some(expected)) = (at, self.expected.as_mut()) {
            let mut before = Vec::new();
            while let Some(period) = expected.next_if(|p| starts_before(p, at)) {
                before.push(period);
            }
            matched = expected.next_if(|p| starts_at(p, at));
            for period in before {
                self.print_missing(&period, &[]);
            }
        }
        match matched {
            Some(period) => self.print_merged(&period, group),
            None => group.into_iter().for_each(|e| self.print_recorded(e)),
        }
    }

    /// An expected period's recorded lines and its missing sources, in
    /// source order.
    fn print_merged(&mut self, period: &Period, group: Vec<LedgerEntry>) {
        let export_type = &self.pipeline.spec.export_type;
        let missing: Vec<String> = self
            .sources
            .iter()
            .filter(|s| {
                !group
                    .iter()
                    .any(|e| &e.export_type == export_type && &e.source == *s)
            })
            .cloned()
            .collect();
        let mut lines: Vec<(String, Option<LedgerEntry>)> = group
            .into_iter()
            .map(|e| (e.source.clone(), Some(e)))
            .chain(missing.into_iter().map(|s| (s, None)))
            .collect();
        lines.sort_by(|a, b| a.0.cmp(&b.0));
        for (source, entry) in lines {
            match entry {
                Some(entry) => self.print_recorded(entry),
                None => self.print_missing(period, std::slice::from_ref(&source)),
            }
        }
    }

    fn print_recorded(&mut self, entry: LedgerEntry) {
        let given = self.only.map_or(true, |only| matches(only, &entry));
        let due_at = DateTime::parse_from_rfc3339(&entry.period_end)
            .ok()
            .and_then(|end| {
                let lag = chrono::Duration::from_std(self.pipeline.lag).ok()?;
                end.with_timezone(&Utc).checked_add_signed(lag)
            });
        let item = StatusItem::Recorded {
            entry: Box::new(entry),
            due_at,
        };
        self.watch.read(&item);
        if given {
            self.emit(item);
        }
    }

    /// `missing` lines for `period`: the given sources, or every source.
    /// A period not due yet is no gap: its lines say when it becomes due
    /// (`not_due`), and `--only missing` leaves them out.
    fn print_missing(&mut self, period: &Period, sources: &[String]) {
        let due_at = self.pipeline.due_at(period);
        let not_due = !due_at.is_some_and(|at| at <= self.now);
        let given = self.only.is_none() || (!not_due && self.only == Some(StatusFilter::Missing));
        let sources = if sources.is_empty() {
            self.sources.clone()
        } else {
            sources.to_vec()
        };
        for source in &sources {
            if !given && !self.watch.needs(source) {
                continue;
            }
            let item = StatusItem::Missing {
                pipeline: self.pipeline.spec.name.clone(),
                source: source.clone(),
                export_type: self.pipeline.spec.export_type.clone(),
                period: *period,
                due_at,
                due: !not_due,
            };
            self.watch.read(&item);
            if given {
                self.emit(item);
            }
        }
    }

    fn emit(&mut self, item: StatusItem) {
        self.watch.summary.given(&item);
        (self.each)(item);
    }

    /// How many lines were given so far.
    fn given(&self) -> usize {
        self.watch.summary.lines
    }

    /// Gives what is left: the last group and the expected periods after
    /// the last ledger row; the summary of every line, and the calendars.
    fn finish(mut self) -> StatusReport {
        self.flush_group();
        if let Some(expected) = self.expected.take() {
            for period in expected {
                self.print_missing(&period, &[]);
            }
        }
        StatusReport {
            summary: self.watch.summary,
            calendars: self.watch.calendar.and_then(CalendarBuilder::finish),
        }
    }
}

fn starts_before(period: &Period, at: DateTime<FixedOffset>) -> bool {
    period.start() < at
}

fn starts_at(period: &Period, at: DateTime<FixedOffset>) -> bool {
    period.start() == at
}

/// Whether a recorded run key is in the state `--only` asks for.
fn matches(only: StatusFilter, entry: &LedgerEntry) -> bool {
    match only {
        StatusFilter::Pending => entry.status == RunStatus::Pending,
        StatusFilter::Running => entry.status == RunStatus::Running,
        StatusFilter::Done => entry.status == RunStatus::Done,
        StatusFilter::Failed => entry.status == RunStatus::Failed,
        StatusFilter::Cancelled => entry.status == RunStatus::Cancelled,
        StatusFilter::Missing => false,
        StatusFilter::Stale => entry.stale,
        StatusFilter::Provisional => entry.provisional,
    }
}
