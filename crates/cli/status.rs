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

use crate::cli::{Global, StatusArgs, StatusOnly};
use crate::engine::Backoff;
use crate::exit::Exit;
use crate::output::{self, StatusLine};

/// `status PIPELINE [--period P | --from P1 --to P2] [--only STATE] [--json]`.
///
/// It only reads: the database is opened read-only (a missing SQLite file
/// is not created, an old ledger is not migrated but named, with
/// `tidemark migrate` to run), and no ledger yet means no run key yet.
pub async fn status(global: &Global, args: StatusArgs) -> Result<Exit, Error> {
    let pipeline = crate::commands::load_pipeline(global, &args.pipeline)?;
    let now = crate::clock::now()?;
    let range = expected_range(&pipeline, &args, now)?;
    let store = Store::open_read_only(&global.database_url).await?;
    if store.is_none() {
        tell!(
            "note: no ledger at {} yet: nothing has run against this database (status creates none)",
            tidemark_load::redact_url(&global.database_url)
        );
    }
    let result = print(store.as_ref(), &pipeline, &args, range, now).await;
    if let Some(store) = &store {
        store.close().await;
    }
    result.map(|()| Exit::Success)
}

/// The periods whose absence from the ledger is worth a `missing` line:
/// the asked range, or, for `--only missing` without one, every period
/// from `period.start` through the last due one.
fn expected_range(
    pipeline: &Pipeline,
    args: &StatusArgs,
    now: DateTime<Utc>,
) -> Result<Option<(Period, Period)>, Error> {
    if let Some(text) = &args.period {
        let period = pipeline.period(text)?;
        return Ok(Some((period, period)));
    }
    if let (Some(from), Some(to)) = (&args.from, &args.to) {
        return pipeline.period_range(from, to).map(Some);
    }
    if args.only == Some(StatusOnly::Missing) {
        // Walked, not collected: only the first and the last are kept.
        let mut due = pipeline.due_periods(now)?;
        let first = due.next();
        return Ok(first.map(|first| (first, due.last().unwrap_or(first))));
    }
    Ok(None)
}

/// Reads and prints. A read that fails transiently before anything was
/// printed is tried again with the pipeline's retries; once lines are out,
/// a retry would print them twice, so the error is reported instead.
async fn print(
    store: Option<&Store>,
    pipeline: &Pipeline,
    args: &StatusArgs,
    range: Option<(Period, Period)>,
    now: DateTime<Utc>,
) -> Result<(), Error> {
    let starts = range.map(|(from, to)| (from.start_rfc3339(), to.start_rfc3339()));
    let ledger_range = StartRange {
        from: starts.as_ref().map(|(from, _)| from.as_str()),
        to: starts.as_ref().map(|(_, to)| to.as_str()),
    };
    let mut sources = crate::commands::source_ids(pipeline, None)?;
    sources.sort();
    let mut backoff = Backoff::new(&pipeline.retry);
    loop {
        let mut view = View::new(pipeline, args, sources.clone(), range, now);
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
            Err(e) if view.printed == 0 && backoff.should_retry(&e, "read the ledger").await => {}
            Err(e) => return Err(e),
            Ok(()) => {
                view.finish();
                return Ok(());
            }
        }
    }
}

/// The merge of the ledger stream with the expected periods, and the
/// printer.
struct View<'a> {
    pipeline: &'a Pipeline,
    only: Option<StatusOnly>,
    json: bool,
    sources: Vec<String>,
    fingerprint: FieldsFingerprint,
    /// The expected periods not reached yet.
    expected: Option<Peekable<Box<dyn Iterator<Item = Period> + Send + 'a>>>,
    /// The ledger rows of one period start, waiting for the next start.
    group: Vec<LedgerEntry>,
    table: output::StatusTable,
    printed: usize,
    /// The clock that decides what is due: an expected period without a
    /// ledger row is `missing` once due, `not_due` before.
    now: DateTime<Utc>,
}

impl<'a> View<'a> {
    /// `sources`: every source of the pipeline, in the ledger's order.
    fn new(
        pipeline: &'a Pipeline,
        args: &StatusArgs,
        sources: Vec<String>,
        range: Option<(Period, Period)>,
        now: DateTime<Utc>,
    ) -> Self {
        let expected = range.map(|(from, to)| {
            let periods: Box<dyn Iterator<Item = Period> + Send> =
                Box::new(Period::range_inclusive(from, to));
            periods.peekable()
        });
        View {
            pipeline,
            only: args.only,
            json: args.json,
            sources,
            fingerprint: pipeline.fields_fingerprint(),
            expected,
            group: Vec::new(),
            table: output::StatusTable::default(),
            printed: 0,
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
            None => group.iter().for_each(|e| self.print_recorded(e)),
        }
    }

    /// An expected period's recorded lines and its missing sources, in
    /// source order.
    fn print_merged(&mut self, period: &Period, group: Vec<LedgerEntry>) {
        let export_type = &self.pipeline.spec.export_type;
        let recorded: Vec<&str> = group
            .iter()
            .filter(|e| &e.export_type == export_type)
            .map(|e| e.source.as_str())
            .collect();
        let mut lines: Vec<(String, Option<&LedgerEntry>)> = group
            .iter()
            .map(|e| (e.source.clone(), Some(e)))
            .chain(
                self.sources
                    .iter()
                    .filter(|s| !recorded.contains(&s.as_str()))
                    .map(|s| (s.clone(), None)),
            )
            .collect();
        lines.sort_by(|a, b| a.0.cmp(&b.0));
        for (source, entry) in lines {
            match entry {
                Some(entry) => self.print_recorded(entry),
                None => self.print_missing(period, std::slice::from_ref(&source)),
            }
        }
    }

    fn print_recorded(&mut self, entry: &LedgerEntry) {
        if self.only.map_or(true, |only| matches(only, entry)) {
            let due_at = DateTime::parse_from_rfc3339(&entry.period_end)
                .ok()
                .and_then(|end| {
                    let lag = chrono::Duration::from_std(self.pipeline.lag).ok()?;
                    end.with_timezone(&Utc).checked_add_signed(lag)
                });
            self.emit(StatusLine::Recorded { entry, due_at });
        }
    }

    /// `missing` lines for `period`: the given sources, or every source.
    /// A period not due yet is no gap: its lines say when it becomes due
    /// (`not_due`), and `--only missing` leaves them out.
    fn print_missing(&mut self, period: &Period, sources: &[String]) {
        let due_at = self.pipeline.due_at(period);
        let not_due = !due_at.is_some_and(|at| at <= self.now);
        if self.only.is_some() && (not_due || self.only != Some(StatusOnly::Missing)) {
            return;
        }
        let sources = if sources.is_empty() {
            self.sources.clone()
        } else {
            sources.to_vec()
        };
        for source in &sources {
            self.emit(StatusLine::Missing {
                pipeline: &self.pipeline.spec.name,
                source,
                export_type: &self.pipeline.spec.export_type,
                period,
                due_at,
                due: !not_due,
            });
        }
    }

    fn emit(&mut self, line: StatusLine<'_>) {
        self.printed += 1;
        if self.json {
            output::print_status_json(&line);
        } else {
            self.table.add(&line);
        }
    }

    /// Prints what is left: the last group and the expected periods after
    /// the last ledger row.
    fn finish(mut self) {
        self.flush_group();
        if let Some(expected) = self.expected.take() {
            for period in expected {
                self.print_missing(&period, &[]);
            }
        }
        if !self.json && self.printed == 0 {
            output::say_no_status(self.pipeline, self.only.is_some());
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
fn matches(only: StatusOnly, entry: &LedgerEntry) -> bool {
    match only {
        StatusOnly::Pending => entry.status == RunStatus::Pending,
        StatusOnly::Running => entry.status == RunStatus::Running,
        StatusOnly::Done => entry.status == RunStatus::Done,
        StatusOnly::Failed => entry.status == RunStatus::Failed,
        StatusOnly::Cancelled => entry.status == RunStatus::Cancelled,
        StatusOnly::Missing => false,
        StatusOnly::Stale => entry.stale,
        StatusOnly::Provisional => entry.provisional,
    }
}
