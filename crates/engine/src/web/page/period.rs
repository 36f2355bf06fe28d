//! `GET /periods/{pipeline}/{source}/{period}[?export=TYPE]`: one period's
//! story, as `status --period` tells it: every attempt with its own start,
//! end, worker (host, pid) and outcome (done, failed, lost, interrupted,
//! resumed from batch N, marked), its error; the key's counts, expected
//! against read, lease while running, back-off while retrying; the first
//! rejected records with their reasons; a link to each attempt's logs when
//! `serve --log-url` is given.
//!
//! A pipeline, source or period the service does not know is a 404 page
//! naming it; the export type defaults to the pipeline's.

use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::response::{IntoResponse, Response};
use maud::{html, Markup};
use serde::Deserialize;
use tidemark_core::{Period, Pipeline};
use tidemark_load::{AttemptEntry, History, LedgerEntry, OutboxNotice, RejectEntry};

use super::{layout, not_found, unavailable, LogUrl, LogValues};
use crate::status::{status, StatusItem, StatusQuery};
use crate::story::{resumption, AttemptOutcome, PeriodState};
use crate::web::WebState;

#[derive(Debug, Default, Deserialize)]
pub(super) struct PeriodQuery {
    export: Option<String>,
}

pub(super) async fn period(
    State(state): State<WebState>,
    path: Result<Path<(String, String, String)>, PathRejection>,
    query: Result<Query<PeriodQuery>, QueryRejection>,
) -> Response {
    let Ok(Path((name, source, text))) = path else {
        return not_found("this address names no period: /periods/PIPELINE/SOURCE/PERIOD");
    };
    let query = query.map(|Query(q)| q).unwrap_or_default();
    let Some(pipeline) = state
        .view
        .pipelines()
        .into_iter()
        .find(|p| p.spec.name == name)
    else {
        return not_found(&format!("no pipeline named {name:?} is served"));
    };
    let spec = &pipeline.spec.period;
    let period = match Period::parse(&text, spec.granularity, spec.timezone) {
        Ok(period) => period,
        Err(e) => {
            return not_found(&format!(
                "{text:?} names no period of pipeline {name:?}: {e}"
            ))
        }
    };
    let export_type = query
        .export
        .filter(|e| !e.is_empty())
        .unwrap_or_else(|| pipeline.spec.export_type.clone());
    let item = match find(&state, &pipeline, period, &source, &export_type).await {
        Ok(Some(item)) => item,
        Ok(None) => {
            return not_found(&format!(
                "pipeline {name:?} has no source {source:?} with export type {export_type:?}, \
                 and the ledger has no row of it for {}",
                period.label()
            ))
        }
        Err(e) => return unavailable(&e),
    };
    let title = format!("{name} {} {source}", period.label());
    let body = match &item {
        StatusItem::Recorded { entry, .. } => {
            let store = state.view.engine().store();
            let read = async {
                let history = store.history(entry).await?;
                let notices = store
                    .notices(&entry.pipeline, Some(&entry.period_start))
                    .await?;
                Ok::<_, tidemark_core::Error>((history, notices))
            };
            match read.await {
                Ok((history, notices)) => {
                    let notices: Vec<OutboxNotice> = notices
                        .into_iter()
                        .filter(|n| n.source == entry.source && n.export_type == entry.export_type)
                        .collect();
                    recorded(&state, &period, entry, &history, &notices)
                }
                Err(e) => return unavailable(&e),
            }
        }
        StatusItem::Missing { due_at, due, .. } => missing(&name, &source, &period, *due_at, *due),
    };
    layout(&title, body).into_response()
}

/// The period's line of `source` and `export_type`: one ledger read for
/// the period, with the `missing` line when the ledger has none. `None`
/// when neither the ledger nor the pipeline knows the source.
async fn find(
    state: &WebState,
    pipeline: &Pipeline,
    period: Period,
    source: &str,
    export_type: &str,
) -> Result<Option<StatusItem>, tidemark_core::Error> {
    let query = StatusQuery {
        range: Some((period, period)),
        only: None,
    };
    let mut found = None;
    let store = state.view.engine().store();
    status(
        Some(store),
        pipeline,
        query,
        state.view.engine().now(),
        |item| {
            let (s, e) = match &item {
                StatusItem::Recorded { entry, .. } => (&entry.source, &entry.export_type),
                StatusItem::Missing {
                    source,
                    export_type,
                    ..
                } => (source, export_type),
            };
            if s == source && e == export_type && found.is_none() {
                found = Some(item);
            }
        },
    )
    .await?;
    Ok(found)
}

fn heading(pipeline: &str, source: &str, period: &Period, state: PeriodState) -> Markup {
    html! {
        h1 {
            (pipeline) " · " (source) " · " (period.label())
            " " span class={"badge s-" (state)} { (state) }
        }
        p.when { (period.start_rfc3339()) " to " (period.end_rfc3339()) }
    }
}

fn missing(
    pipeline: &str,
    source: &str,
    period: &Period,
    due_at: Option<chrono::DateTime<chrono::Utc>>,
    due: bool,
) -> Markup {
    let state = if due {
        PeriodState::Missing
    } else {
        PeriodState::NotDue
    };
    let at = due_at.map_or_else(|| "-".to_string(), |at| at.to_rfc3339());
    html! {
        (heading(pipeline, source, period, state))
        @if due {
            p.story { "Never run: due since " (at) ", and the ledger has no row for it." }
        } @else {
            p.story { "Not due until " (at) "." }
        }
        p { a href="/" { "Back to the grid" } }
    }
}

fn recorded(
    state: &WebState,
    period: &Period,
    e: &LedgerEntry,
    h: &History,
    notices: &[OutboxNotice],
) -> Markup {
    let period_state = PeriodState::of_entry(e);
    html! {
        (heading(&e.pipeline, &e.source, period, period_state))
        (key_facts(e, period_state))
        h2 { "Attempts" }
        (attempts(state.options.log_url.as_ref(), e, h))
        (rejects(h))
        (notice_table(notices))
        p { a href="/" { "Back to the grid" } }
    }
}

/// The key's notices and lineage events with their delivery state
/// (docs/ledger.md "Notices"), as `status --notices` lists them.
fn notice_table(notices: &[OutboxNotice]) -> Markup {
    html! {
        @if !notices.is_empty() {
            h2 { "Notices" }
            table.notices {
                tr { th { "kind" } th { "target" } th { "attempt" } th { "written" } th { "delivery" } th { "tries" } th { "last error" } }
                @for n in notices {
                    tr class={"notice-" (n.status)} {
                        td { (n.kind) }
                        td { (n.target) }
                        td { (n.attempt) }
                        td { (n.created_at) }
                        td { (n.status) @if let Some(sent) = &n.sent_at { " " (sent) } }
                        td { (n.attempts) }
                        td { (n.last_error.as_deref().unwrap_or("")) }
                    }
                }
            }
        }
    }
}

/// The run key's row: state, counts, expected against read, lease,
/// back-off, staleness, mark.
fn key_facts(e: &LedgerEntry, state: PeriodState) -> Markup {
    let c = &e.counts;
    let expected_differs = c.rows_expected.is_some_and(|n| n != c.rows_read);
    html! {
        table.facts {
            tr { th { "status" } td { (e.status) @if state.as_str() != e.status.as_str() { " (" (state) ")" } } }
            tr { th { "export type" } td { (e.export_type) } }
            tr { th { "attempts" } td { (e.attempts) } }
            @if let Some(run_id) = &e.run_id { tr { th { "run id" } td.mono { (run_id) } } }
            tr {
                th { "rows" }
                td {
                    "read " (c.rows_read) ", inserted " (c.rows_inserted) ", updated " (c.rows_updated)
                    ", unchanged " (c.rows_unchanged) ", deleted " (c.rows_deleted)
                    ", rejected " (c.rows_rejected) ", superseded " (c.rows_superseded)
                }
            }
            @if let Some(expected) = c.rows_expected {
                tr.expected[expected_differs] {
                    th { "expected vs read" }
                    td { "expected " (expected) ", read " (c.rows_read) @if expected_differs { " (they differ)" } }
                }
            }
            @if let (Some(owner), Some(until)) = (&e.lease_owner, &e.lease_expires_at) {
                @if state == PeriodState::Running {
                    tr.lease { th { "lease" } td { "held by " span.mono { (owner) } " until " (until) " unless renewed" } }
                }
            }
            @if let Some(not_before) = &e.not_before {
                @if e.backing_off {
                    tr.backoff { th { "back-off" } td { "retrying: the queue runs it again from " (not_before) } }
                }
            }
            @if let Some(class) = &e.error_class {
                tr.error { th { "error" } td { (class) @if let Some(m) = &e.error_message { ": " (m) } } }
            }
            @if let Some(reason) = &e.stale_reason { tr { th { "stale" } td { (reason) } } }
            @if let Some(marked) = &e.marked {
                tr { th { "marked" } td { (marked) @if let Some(note) = &e.mark_note { ": " (note) } } }
            }
            @if let Some(by) = &e.enqueued_by { tr { th { "queued by" } td { (by) } } }
        }
    }
}

fn attempts(log_url: Option<&LogUrl>, e: &LedgerEntry, h: &History) -> Markup {
    let first = h.attempts.first().map_or(e.attempts + 1, |a| a.attempt);
    html! {
        @if first > 1 { p.note { "Attempts 1 to " (first - 1) " were pruned from the history." } }
        @if h.attempts.is_empty() {
            p.note { "The ledger holds no attempt of this key." }
        } @else {
            table.attempts {
                thead { tr {
                    th { "#" } th { "outcome" } th { "host" } th { "pid" } th { "started" } th { "ended" }
                    th { "rows" } th { "error" } @if log_url.is_some() { th { "logs" } }
                } }
                tbody {
                    @for a in &h.attempts { (attempt_row(log_url, e, a)) }
                }
            }
        }
    }
}

fn attempt_row(log_url: Option<&LogUrl>, e: &LedgerEntry, a: &AttemptEntry) -> Markup {
    let outcome = AttemptOutcome::of(a);
    let (host, pid) = a.host_pid();
    let marked = matches!(outcome, AttemptOutcome::Marked(_));
    html! {
        tr class={"attempt o-" (outcome.as_str())} {
            td { (a.attempt) }
            td.outcome {
                b { (outcome) }
                @if let Some(r) = resumption(a) { br; (r) }
                @if outcome == AttemptOutcome::Lost { br; small { "its worker stopped without a word; the next claim took it over" } }
            }
            @if marked {
                td colspan="2" { span.mono { (a.worker) } }
            } @else {
                td.mono { (host) } td.mono { (pid) }
            }
            td.mono { (a.started_at) }
            td.mono { (a.finished_at.as_deref().unwrap_or("(running)")) }
            td {
                @if let Some(read) = a.rows_read {
                    "read " (read) ", inserted " (a.rows_inserted.unwrap_or(0)) ", updated " (a.rows_updated.unwrap_or(0))
                    ", deleted " (a.rows_deleted.unwrap_or(0)) ", rejected " (a.rows_rejected.unwrap_or(0))
                }
                @if let Some(note) = &a.mark_note { "not run: " (note) }
            }
            td.error {
                @if let Some(class) = &a.error_class {
                    b { (class) } @if let Some(m) = &a.error_message { ": " (m) }
                }
            }
            @if let Some(url) = log_url {
                td { a.log href=(url.render(LogValues {
                    run_id: &a.run_id,
                    attempt: a.attempt,
                    pipeline: &e.pipeline,
                    period: &e.period_start,
                })) { "logs" } }
            }
        }
    }
}

fn rejects(h: &History) -> Markup {
    if h.rejects_total == 0 {
        return html! {};
    }
    let shown = h.rejects.len();
    html! {
        h2 { "Rejected records" }
        p {
            (h.rejects_total) " rejected"
            @if usize::try_from(h.rejects_total).unwrap_or(usize::MAX) > shown { ", the first " (shown) " shown" }
        }
        table.rejects {
            thead { tr { th { "where" } th { "field" } th { "value" } th { "reason" } } }
            tbody { @for r in &h.rejects { (reject_row(r)) } }
        }
    }
}

fn reject_row(r: &RejectEntry) -> Markup {
    html! {
        tr {
            td { (r.location) }
            td.mono { (r.field.as_deref().unwrap_or("")) }
            td.mono { (r.value.as_deref().unwrap_or("")) }
            td { (r.reason) }
        }
    }
}
