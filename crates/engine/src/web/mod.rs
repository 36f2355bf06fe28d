//! `serve --listen ADDR`: what a running service shows, read-only, over
//! HTTP (axum). Everything comes from the ledger or the service's own
//! loops; no handler steers the service.
//!
//! - `GET /metrics`: Prometheus text exposition (`metrics.rs`).
//! - `GET /healthz`, `GET /readyz`: liveness and readiness (`health.rs`).
//! - `GET /` and `GET /periods/…`: pages for people (`page.rs`).
//!
//! The server stops with the engine's [`crate::Shutdown`], after the
//! requests in flight.

mod health;
mod metrics;
mod page;
mod workers;

use axum::routing::get;
use axum::Router;
use tokio::net::TcpListener;

use crate::service::ServiceView;

/// What every handler sees.
#[derive(Clone)]
pub(crate) struct WebState {
    pub(crate) view: ServiceView,
}

/// Every route, over `view`.
pub fn router(view: ServiceView) -> Router {
    Router::new()
        .route("/metrics", get(metrics::metrics))
        .route("/healthz", get(health::healthz))
        .route("/readyz", get(health::readyz))
        .merge(page::routes())
        .with_state(WebState { view })
}

/// Serves [`router`] on `listener` until the service's engine is asked to
/// stop.
pub async fn serve(listener: TcpListener, view: ServiceView) -> std::io::Result<()> {
    let shutdown = view.engine().shutdown().clone();
    axum::serve(listener, router(view))
        .with_graceful_shutdown(async move { shutdown.wait().await })
        .await
}
