//! What tidemark prints: results on stdout (JSON lines or tables), errors
//! and progress on stderr.

use std::io::IsTerminal;

use indicatif::{ProgressBar, ProgressStyle};
use tidemark_core::{Pipeline, RunKey};
use tidemark_load::LedgerEntry;

use crate::engine::Outcome;

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

/// `backfill`: one line per run key, then totals.
pub fn print_summary(results: &[(RunKey, Outcome)]) {
    say!(
        "{:<20} {:<12} {:<8} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}",
        "PERIOD",
        "SOURCE",
        "STATUS",
        "READ",
        "INSERTED",
        "UPDATED",
        "UNCHANGED",
        "DELETED",
        "REJECTED"
    );
    let mut tally = [0usize; 7];
    for (key, outcome) in results {
        let (status, result, slot) = match outcome {
            Outcome::Done(r) => ("done", Some(r), 0),
            Outcome::AlreadyDone(r) => ("skipped", Some(r), 1),
            Outcome::Held { .. } => ("held", None, 2),
            Outcome::Failed(_) => ("failed", None, 3),
            Outcome::NotRun { .. } => ("not run", None, 4),
            Outcome::Interrupted => ("interrupted", None, 5),
            Outcome::Stopped => ("stopped", None, 6),
        };
        tally[slot] += 1;
        let counts = [
            "rows_read",
            "rows_inserted",
            "rows_updated",
            "rows_unchanged",
            "rows_deleted",
            "rows_rejected",
        ]
        .map(|n| result.map_or_else(|| "-".to_string(), |r| count(r, n).to_string()));
        say!(
            "{:<20} {:<12} {:<8} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}",
            key.period.label(),
            key.source,
            status,
            counts[0],
            counts[1],
            counts[2],
            counts[3],
            counts[4],
            counts[5]
        );
        if let Outcome::Failed(error) = outcome {
            tell!("error: {key}: {} error: {error}", error.class());
        }
        if let Outcome::Held { owner } = outcome {
            tell!("held: {key} is being run by {owner}");
        }
    }
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
        results.len(),
        tally[0],
        tally[1],
        tally[2],
        tally[3]
    );
    if let Some((_, Outcome::NotRun { reason })) = results
        .iter()
        .find(|(_, o)| matches!(o, Outcome::NotRun { .. }))
    {
        tell!("{} run key(s) not run: {reason}", tally[4]);
    }
}

/// `status --json`: one object per run key.
pub fn print_status_json(entries: &[LedgerEntry]) {
    for entry in entries {
        if let Ok(line) = serde_json::to_string(entry) {
            say!("{line}");
        }
    }
}

/// `status`: a table an operator can read.
pub fn print_status_table(pipeline: &Pipeline, entries: &[LedgerEntry]) {
    if entries.is_empty() {
        say!("no runs recorded for pipeline {}", pipeline.spec.name);
        return;
    }
    say!(
        "{:<26} {:<12} {:<8} {:>3} {:>8} {:>8} {:>8} {:>9} {:>7} {:>8}  {:<24} NOTE",
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
        "FINISHED"
    );
    for e in entries {
        let note = note(e);
        say!(
            "{:<26} {:<12} {:<8} {:>3} {:>8} {:>8} {:>8} {:>9} {:>7} {:>8}  {:<24} {}",
            e.period_start,
            e.source,
            e.status.as_str(),
            e.attempts,
            e.counts.rows_read,
            e.counts.rows_inserted,
            e.counts.rows_updated,
            e.counts.rows_unchanged,
            e.counts.rows_deleted,
            e.counts.rows_rejected,
            e.finished_at.as_deref().unwrap_or("-"),
            note
        );
    }
}

/// The NOTE of a `status` line: the last error, or for a done key whether
/// it is provisional or stale (and why).
fn note(e: &LedgerEntry) -> String {
    let mut notes = Vec::new();
    if let (Some(class), Some(message)) = (&e.error_class, &e.error_message) {
        notes.push(format!("{class}: {message}"));
    }
    if e.provisional {
        notes.push("provisional (done while open)".to_string());
    }
    if let Some(reason) = &e.stale_reason {
        notes.push(format!("stale: {reason}"));
    }
    notes.join("; ")
}
