//! `status PIPELINE --period P`: after the table, the period's story from
//! the ledger's attempt history (each attempt's worker, start, end and
//! outcome), its lease and back-off, expected against read, and the first
//! rejected records with their reasons. `--json` adds the same as the
//! fields `history`, `rejects` and `rejects_total` of each recorded line
//! ([`crate::output::print_status_json`]).

use tidemark_load::{AttemptEntry, AttemptStatus, History, LedgerEntry, RejectEntry, RunStatus};

/// Prints the story of one run key.
pub fn print(entry: &LedgerEntry, history: &History) {
    say!();
    say!(
        "{} {} (source {}, export {}): {}, {} attempt(s)",
        entry.pipeline,
        entry.period_start,
        entry.source,
        entry.export_type,
        entry.status.as_str(),
        entry.attempts
    );
    let first = history
        .attempts
        .first()
        .map_or(entry.attempts + 1, |a| a.attempt);
    if first > 1 {
        say!("  attempts 1 to {}: pruned from the history", first - 1);
    }
    for attempt in &history.attempts {
        say!("  {}", attempt_line(attempt));
    }
    for line in key_lines(entry) {
        say!("  {line}");
    }
    if history.rejects_total > 0 {
        say!(
            "  rejected {} record(s){}:",
            history.rejects_total,
            if usize::try_from(history.rejects_total).unwrap_or(usize::MAX) > history.rejects.len()
            {
                format!(", the first {}", history.rejects.len())
            } else {
                String::new()
            }
        );
        for reject in &history.rejects {
            say!("    {}", reject_line(reject));
        }
    }
}

/// `attempt 2  done  host db-2 pid 913  10:02:14 -> 10:05:01  resumed from
/// batch 41; read 60000 ...`.
fn attempt_line(a: &AttemptEntry) -> String {
    if let Some(marked) = &a.marked {
        return format!(
            "attempt {:<3} {:<11} marked {marked} by {} at {}, not run: {}",
            a.attempt,
            a.status.as_str(),
            a.worker,
            a.finished_at.as_deref().unwrap_or(&a.started_at),
            a.mark_note.as_deref().unwrap_or(""),
        );
    }
    let (host, pid) = a.host_pid();
    let mut notes = Vec::new();
    match (a.resumed, a.from_batch) {
        (true, Some(batch)) => notes.push(format!("resumed from batch {batch}")),
        (true, None) => notes.push("resumed".to_string()),
        (false, _) => {}
    }
    if let Some(read) = a.rows_read {
        notes.push(format!(
            "read {read}, inserted {}, updated {}, deleted {}, rejected {}",
            a.rows_inserted.unwrap_or(0),
            a.rows_updated.unwrap_or(0),
            a.rows_deleted.unwrap_or(0),
            a.rows_rejected.unwrap_or(0)
        ));
    }
    if let (Some(class), message) = (&a.error_class, &a.error_message) {
        notes.push(match message {
            Some(message) => format!("{class}: {message}"),
            None => class.to_string(),
        });
    }
    if a.status == AttemptStatus::Lost {
        notes.push("its worker stopped without a word; the next claim took it over".to_string());
    }
    format!(
        "attempt {:<3} {:<11} host {} pid {:<8} {} -> {}{}",
        a.attempt,
        a.status.as_str(),
        host,
        pid,
        a.started_at,
        a.finished_at.as_deref().unwrap_or("(running)"),
        if notes.is_empty() {
            String::new()
        } else {
            format!("  {}", notes.join("; "))
        }
    )
}

/// What the run key's row adds: its lease while running, its back-off
/// when failed, expected against read.
fn key_lines(e: &LedgerEntry) -> Vec<String> {
    let mut lines = Vec::new();
    if e.status == RunStatus::Running {
        if let (Some(owner), Some(until)) = (&e.lease_owner, &e.lease_expires_at) {
            lines.push(format!(
                "lease: held by {owner} until {until} unless renewed"
            ));
        }
    }
    if let Some(not_before) = &e.not_before {
        if e.status == RunStatus::Failed {
            lines.push(format!(
                "back-off: the queue runs it again from {not_before}"
            ));
        }
    }
    if let Some(expected) = e.counts.rows_expected {
        lines.push(format!(
            "expected {expected} row(s), read {}",
            e.counts.rows_read
        ));
    }
    lines
}

/// `line 14, field v, value "x": not an integer`.
fn reject_line(r: &RejectEntry) -> String {
    let mut at = vec![r.location.clone()];
    if let Some(field) = &r.field {
        at.push(format!("field {field}"));
    }
    if let Some(value) = &r.value {
        at.push(format!("value {value:?}"));
    }
    format!("{}: {}", at.join(", "), r.reason)
}
