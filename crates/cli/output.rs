//! What tidemark prints: results on stdout (JSON lines or tables), errors
//! and progress on stderr.

use std::io::IsTerminal;

use chrono::{DateTime, Utc};
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;
use tidemark_core::{Period, Pipeline, RunKey};
use tidemark_load::{AttemptEntry, Counts, History, LedgerEntry, RejectEntry};

use crate::exit::Exit;
use tidemark_engine::status::{LineState, StatusSummary};
use tidemark_engine::Outcome;

/// A progress bar on stderr when it is a terminal; hidden otherwise.
pub fn progress_bar(total: u64, what: &str) -> ProgressBar {
    if !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(total);
    let template = format!("{{elapsed_precise}} [{{bar:40}}] {{pos}}/{{len}} {what} (eta {{eta}})");
    if let Ok(style) = ProgressStyle::with_template(&template) {
        bar.set_style(style.progress_chars("=> "));
    }
    bar
}

/// `run`: the canonical result as one JSON line on stdout; failures and
/// held keys on stderr.
pub fn print_outcome(key: &RunKey, outcome: &Outcome) {
    match outcome {
        Outcome::Done(result) => say!("{result}"),
        Outcome::AlreadyDone(result) => {
            tell!("already done: {key} (nothing was read or written; use --force to re-sync)");
            say!("{result}");
        }
        Outcome::Held { owner } => {
            tell!(
                "held: {key} is being run by {owner}; exiting with 75 (use --wait to wait for it)"
            )
        }
        Outcome::Failed(error) => tell!("error: {key}: {} error: {error}", error.class()),
        Outcome::NotRun { reason } => tell!("not run: {key}: {reason}"),
        Outcome::Interrupted => tell!(
            "interrupted: {key}: the batches committed so far stay; the key is back in the queue and the next run resumes it"
        ),
        Outcome::Stopped => tell!("not started: {key}: stopping on a signal"),
    }
}

fn count(result: &serde_json::Value, name: &str) -> u64 {
    result
        .get(name)
        .and_then(serde_json::Value::as_u64)
        .unwrap_or(0)
}

/// `backfill` and `sync`: one line per run key as it finishes, then
/// totals. Only the counters, the worst exit and the first "not run" reason
/// are kept, never the runs' results: a backfill of 100,000 periods holds
/// no more than one of ten.
#[derive(Debug, Default)]
pub struct Summary {
    /// done, already done, held, failed, not run, interrupted, stopped.
    tally: [usize; 7],
    not_run: Option<String>,
    exit: Option<Exit>,
}

impl Summary {
    fn header() {
        say!(
            "{:<20} {:<12} {:<8} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>10}",
            "PERIOD",
            "SOURCE",
            "STATUS",
            "READ",
            "INSERTED",
            "UPDATED",
            "UNCHANGED",
            "DELETED",
            "REJECTED",
            "SUPERSEDED"
        );
    }

    /// Prints the line of one finished run key (the header before the
    /// first) and counts it.
    pub fn add(&mut self, key: &RunKey, outcome: &Outcome) {
        if self.total() == 0 {
            Self::header();
        }
        let (status, result, slot) = match outcome {
            Outcome::Done(r) => ("done", Some(r), 0),
            Outcome::AlreadyDone(r) => ("skipped", Some(r), 1),
            Outcome::Held { .. } => ("held", None, 2),
            Outcome::Failed(_) => ("failed", None, 3),
            Outcome::NotRun { .. } => ("not run", None, 4),
            Outcome::Interrupted => ("interrupted", None, 5),
            Outcome::Stopped => ("stopped", None, 6),
        };
        self.tally[slot] += 1;
        let counts = Counts::COLUMNS
            .map(|n| result.map_or_else(|| "-".to_string(), |r| count(r, n).to_string()));
        say!(
            "{:<20} {:<12} {:<8} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>10}",
            key.period.label(),
            key.source,
            status,
            counts[0],
            counts[1],
            counts[2],
            counts[3],
            counts[4],
            counts[5],
            counts[6]
        );
        match outcome {
            Outcome::Failed(error) => tell!("error: {key}: {} error: {error}", error.class()),
            Outcome::Held { owner } => tell!("held: {key} is being run by {owner}"),
            Outcome::NotRun { reason } => {
                self.not_run.get_or_insert_with(|| reason.clone());
            }
            Outcome::Done(_)
            | Outcome::AlreadyDone(_)
            | Outcome::Interrupted
            | Outcome::Stopped => {}
        }
        let exit = Exit::of_outcome(outcome);
        self.exit = Some(Exit::worst(self.exit.into_iter().chain([exit])));
    }

    fn total(&self) -> usize {
        self.tally.iter().sum()
    }

    /// The totals line; the exit code of the worst outcome.
    pub fn finish(self) -> Exit {
        if self.total() == 0 {
            Self::header();
        }
        let tally = self.tally;
        let mut not_run = String::new();
        for (n, what) in [
            (tally[4], "not run"),
            (tally[5], "interrupted"),
            (tally[6], "not started (stopping)"),
        ] {
            if n > 0 {
                not_run.push_str(&format!(", {n} {what}"));
            }
        }
        say!(
            "{} run key(s): {} done, {} already done (skipped), {} held elsewhere, {} failed{not_run}",
            self.total(),
            tally[0],
            tally[1],
            tally[2],
            tally[3]
        );
        if let Some(reason) = &self.not_run {
            tell!("{} run key(s) not run: {reason}", tally[4]);
        }
        Exit::worst(self.exit)
    }
}

/// One line of `status`: a run key the ledger records, or one of the asked
/// periods it has no row for.
#[derive(Debug, Clone, Copy)]
pub enum StatusLine<'a> {
    /// A ledger row, and when its period becomes (or became) due.
    Recorded {
        entry: &'a LedgerEntry,
        due_at: Option<DateTime<Utc>>,
    },
    /// No ledger row: never run, never queued. `due` tells a gap
    /// (`missing`: due since `due_at`) from a period still to come
    /// (`not_due`: due at `due_at`).
    Missing {
        pipeline: &'a str,
        source: &'a str,
        export_type: &'a str,
        period: &'a Period,
        due_at: Option<DateTime<Utc>>,
        due: bool,
    },
}

/// A `missing` line in JSON: the fields of a recorded one (so a consumer
/// reads both with one schema), with status `missing`, zero counts and
/// nulls.
#[derive(Serialize)]
struct MissingJson<'a> {
    pipeline: &'a str,
    source: &'a str,
    export_type: &'a str,
    period_start: String,
    period_end: String,
    status: &'static str,
    attempts: i64,
    run_id: Option<String>,
    #[serde(flatten)]
    counts: Counts,
    error_class: Option<String>,
    error_message: Option<String>,
    started_at: Option<String>,
    finished_at: Option<String>,
    handler_version: Option<String>,
    provisional: bool,
    stale: bool,
    stale_reason: Option<String>,
    lease_owner: Option<String>,
    lease_expires_at: Option<String>,
    priority: i64,
    not_before: Option<String>,
    enqueued_by: Option<String>,
    marked: Option<String>,
    mark_note: Option<String>,
    /// When the period becomes (or became) due: its end plus `lag`.
    due_at: Option<String>,
    /// With `--period`: an empty story, so both kinds of line have one
    /// set of fields.
    #[serde(flatten)]
    story: Option<StoryJson<'a>>,
}

/// An instant as RFC 3339 in UTC, to the second.
fn rfc3339(at: DateTime<Utc>) -> String {
    at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

/// A recorded line in JSON: the ledger row's fields, then `due_at` as on
/// every line.
#[derive(Serialize)]
struct RecordedJson<'a> {
    #[serde(flatten)]
    entry: &'a LedgerEntry,
    due_at: Option<String>,
    /// With `--period`: the key's attempts and first rejects.
    #[serde(flatten)]
    story: Option<StoryJson<'a>>,
}

/// The fields `status --period --json` adds to a recorded line.
#[derive(Serialize)]
struct StoryJson<'a> {
    history: &'a [AttemptEntry],
    rejects: &'a [RejectEntry],
    rejects_total: i64,
}

impl<'a> StoryJson<'a> {
    fn of(history: &'a History) -> Self {
        StoryJson {
            history: &history.attempts,
            rejects: &history.rejects,
            rejects_total: history.rejects_total,
        }
    }
}

/// `status --json`: one object per line; a recorded line of `--period`
/// carries its story (`history`, `rejects`, `rejects_total`).
pub fn print_status_json(line: &StatusLine<'_>, story: Option<&History>) {
    let json = match *line {
        StatusLine::Recorded { entry, due_at } => serde_json::to_string(&RecordedJson {
            entry,
            due_at: due_at.map(rfc3339),
            story: story.map(StoryJson::of),
        }),
        StatusLine::Missing {
            pipeline,
            source,
            export_type,
            period,
            due_at,
            due,
        } => serde_json::to_string(&MissingJson {
            pipeline,
            source,
            export_type,
            period_start: period.start_rfc3339(),
            period_end: period.end_rfc3339(),
            status: if due { "missing" } else { "not_due" },
            attempts: 0,
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
            lease_owner: None,
            lease_expires_at: None,
            priority: 0,
            not_before: None,
            enqueued_by: None,
            marked: None,
            mark_note: None,
            due_at: due_at.map(rfc3339),
            story: story.map(StoryJson::of),
        }),
    };
    if let Ok(json) = json {
        say!("{json}");
    }
}

/// `status`: a table an operator can read, printed as the ledger streams
/// in (the header before the first row).
#[derive(Debug, Default)]
pub struct StatusTable {
    rows: usize,
}

impl StatusTable {
    pub fn add(&mut self, line: &StatusLine<'_>) {
        if self.rows == 0 {
            say!(
                "{:<26} {:<12} {:<9} {:>3} {:>8} {:>8} {:>8} {:>9} {:>7} {:>8} {:>10}  {:<24} NOTE",
                "PERIOD START",
                "SOURCE",
                "STATUS",
                "TRY",
                "READ",
                "INSERTED",
                "UPDATED",
                "UNCHANGED",
                "DELETED",
                "REJECTED",
                "SUPERSEDED",
                "FINISHED"
            );
        }
        self.rows += 1;
        match *line {
            StatusLine::Recorded { entry: e, .. } => status_row(
                &e.period_start,
                &e.source,
                e.status.as_str(),
                e.attempts,
                Some(&e.counts),
                e.finished_at.as_deref().unwrap_or("-"),
                &note(e),
            ),
            StatusLine::Missing {
                source,
                period,
                due_at,
                due,
                ..
            } => status_row(
                &period.start_rfc3339(),
                source,
                if due { "missing" } else { "not_due" },
                0,
                None,
                "-",
                &match (due, due_at) {
                    (true, _) => "never run".to_string(),
                    (false, Some(at)) => format!("not due until {}", rfc3339(at)),
                    (false, None) => "never due".to_string(),
                },
            ),
        }
    }
}

/// One row of the `status` table; no counts (a missing key) print as `-`.
fn status_row(
    start: &str,
    source: &str,
    status: &str,
    attempts: i64,
    counts: Option<&Counts>,
    finished: &str,
    note: &str,
) {
    let count = |get: fn(&Counts) -> u64| counts.map_or("-".to_string(), |c| get(c).to_string());
    say!(
        "{:<26} {:<12} {:<9} {:>3} {:>8} {:>8} {:>8} {:>9} {:>7} {:>8} {:>10}  {:<24} {}",
        start,
        source,
        status,
        attempts,
        count(|c| c.rows_read),
        count(|c| c.rows_inserted),
        count(|c| c.rows_updated),
        count(|c| c.rows_unchanged),
        count(|c| c.rows_deleted),
        count(|c| c.rows_rejected),
        count(|c| c.rows_superseded),
        finished,
        note
    );
}

/// The last line of a `status` table: the lines per state (they add up
/// to the lines above; marked, stale and provisional are kinds of done,
/// "backing off" a kind of failed) and the freshness of every line read:
/// now minus the end of the newest period up to which every period (of
/// every source, from the first line read) is done.
pub fn print_status_summary(summary: &StatusSummary, now: DateTime<Utc>) {
    let n = |state| summary.count(state);
    let freshness = match (summary.freshness(now), summary.complete_through()) {
        (Some(age), Some(through)) => format!(
            "freshness {} (every period done through {})",
            age_text(age),
            rfc3339(through)
        ),
        _ => "freshness - (the first period read is not done)".to_string(),
    };
    say!(
        "summary: {} run key(s): {} done ({} marked, {} stale, {} provisional), {} failed ({} backing off), {} running, {} pending, {} cancelled, {} missing, {} not due; {freshness}",
        summary.lines,
        summary.done(),
        n(LineState::Marked),
        summary.stale,
        summary.provisional,
        summary.failed(),
        n(LineState::Retrying),
        n(LineState::Running),
        n(LineState::Pending),
        n(LineState::Cancelled),
        n(LineState::Missing),
        n(LineState::NotDue),
    );
}

/// An age in its two largest units: `9d 12h`, `3h 5m`, `42m`.
fn age_text(age: chrono::Duration) -> String {
    let minutes = age.num_minutes().max(0);
    let (days, hours, minutes) = (minutes / 1440, minutes / 60 % 24, minutes % 60);
    match (days, hours) {
        (0, 0) => format!("{minutes}m"),
        (0, _) => format!("{hours}h {minutes}m"),
        _ => format!("{days}d {hours}h"),
    }
}

/// What `status` says when no line matched.
pub fn say_no_status(pipeline: &Pipeline, filtered: bool) {
    if filtered {
        say!(
            "no run keys of pipeline {} match the selection",
            pipeline.spec.name
        );
    } else {
        say!("no runs recorded for pipeline {}", pipeline.spec.name);
    }
}

/// The NOTE of a `status` line: the last error, or for a done key whether
/// it is provisional or stale (and why).
fn note(e: &LedgerEntry) -> String {
    let mut notes = Vec::new();
    if let (Some(class), Some(message)) = (&e.error_class, &e.error_message) {
        notes.push(format!("{class}: {message}"));
    }
    if let Some(marked) = &e.marked {
        notes.push(format!(
            "marked {marked}: {}",
            e.mark_note.as_deref().unwrap_or("")
        ));
    }
    if e.provisional {
        notes.push("provisional (done while open)".to_string());
    }
    if let Some(reason) = &e.stale_reason {
        notes.push(format!("stale: {reason}"));
    }
    notes.join("; ")
}
