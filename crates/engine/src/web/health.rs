//! `/healthz` (the service's loops tick) and `/readyz` (the database
//! answers and is migrated).
//!
//! Liveness and readiness are kept apart on purpose: an unreachable
//! database makes the service not ready (take it out of rotation, alert),
//! but restarting every worker for it would help nothing, so `/healthz`
//! only asks whether the process's own loops still turn.

use std::fmt::Write as _;
use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;

use super::WebState;

/// How long `/readyz` waits for the database: well within the 5 s a probe
/// is promised an answer in.
const READY_TIMEOUT: Duration = Duration::from_secs(3);

/// 200 while every loop (presence ticker, scheduler, worker slots) has
/// ticked within its bound; 503 naming each one that has not.
pub(super) async fn healthz(State(state): State<WebState>) -> (StatusCode, String) {
    let health = state.view.engine().health();
    let wedged = health.wedged();
    if wedged.is_empty() {
        return (
            StatusCode::OK,
            format!("ok: {}\n", health.loops().join(", ")),
        );
    }
    let mut body = String::new();
    for w in &wedged {
        let _ = writeln!(
            body,
            "wedged: {} silent for {:.1} s (bound {:.1} s)",
            w.name,
            w.silent.as_secs_f64(),
            w.bound.as_secs_f64()
        );
    }
    (StatusCode::SERVICE_UNAVAILABLE, body)
}

/// 200 when the database answers within [`READY_TIMEOUT`] and holds every
/// ledger migration this build expects; 503 saying why otherwise.
pub(super) async fn readyz(State(state): State<WebState>) -> (StatusCode, String) {
    let ready = state.view.engine().store().ready();
    match tokio::time::timeout(READY_TIMEOUT, ready).await {
        Ok(Ok(())) => (StatusCode::OK, "ready\n".to_string()),
        Ok(Err(e)) => (StatusCode::SERVICE_UNAVAILABLE, format!("not ready: {e}\n")),
        Err(_) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "not ready: the database did not answer within {} s\n",
                READY_TIMEOUT.as_secs()
            ),
        ),
    }
}
