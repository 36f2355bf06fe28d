//! The workers panel of the page: every worker the ledger knows, live,
//! dead or stopped (judged by the database's clock, as every view judges
//! it), when each was last seen and what it runs.

use std::time::Duration;

use maud::{html, Markup};
use tidemark_load::WorkerEntry;

use super::WebState;

/// How long the panel waits for the database.
const PANEL_TIMEOUT: Duration = Duration::from_secs(5);

/// The panel, read from the ledger at request time. A database that does
/// not answer leaves the panel saying so; the rest of the page still shows.
pub(super) async fn panel(state: &WebState) -> Markup {
    let workers = state.view.engine().store().workers();
    let workers = match tokio::time::timeout(PANEL_TIMEOUT, workers).await {
        Ok(Ok(workers)) => workers,
        Ok(Err(e)) => return unavailable(&e.to_string()),
        Err(_) => return unavailable("the database did not answer within 5 s"),
    };
    html! {
        section.workers {
            h2 { "Workers" }
            @if workers.is_empty() {
                p.empty { "No worker has recorded itself yet." }
            } @else {
                table.workers {
                    thead { tr {
                        th { "state" } th { "host" } th { "pid" } th { "version" }
                        th { "kind" } th { "slots" } th { "started" } th { "last seen" }
                        th { "runs" }
                    } }
                    tbody { @for w in &workers { (row(w)) } }
                }
            }
        }
    }
}

fn row(w: &WorkerEntry) -> Markup {
    let state = w.state.as_str();
    html! {
        tr class={ "worker " (state) } data-worker=(w.worker) {
            td.state { (state) }
            td.host { (w.host) }
            td.pid { (w.pid) }
            td.version { (w.version) }
            td.kind { (w.kind) }
            td.slots { (w.slots) }
            td.started { (w.started_at) }
            td.last-seen { (w.last_seen) }
            td.runs {
                @if w.holds.is_empty() {
                    "idle"
                } @else {
                    ul { @for h in &w.holds {
                        li { (h.pipeline) " / " (h.source) " / " (h.period_start) }
                    } }
                }
            }
        }
    }
}

fn unavailable(why: &str) -> Markup {
    html! {
        section.workers {
            h2 { "Workers" }
            p.error { "Cannot read the workers: " (why) }
        }
    }
}
