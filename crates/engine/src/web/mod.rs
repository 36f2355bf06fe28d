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

use std::sync::Arc;

use axum::routing::get;
use axum::Router;
use tokio::net::TcpListener;

use crate::service::ServiceView;

pub use page::{LogUrl, LogUrlError};

/// What the server is told besides the service it shows.
#[derive(Debug, Clone, Default)]
pub struct WebOptions {
    /// Where an attempt's logs are (`serve --log-url TEMPLATE`): the period
    /// page links each attempt there.
    pub log_url: Option<LogUrl>,
}

/// What every handler sees.
#[derive(Clone)]
pub(crate) struct WebState {
    pub(crate) view: ServiceView,
    pub(crate) options: Arc<WebOptions>,
}

/// Every route, over `view`.
pub fn router(view: ServiceView, options: WebOptions) -> Router {
    Router::new()
        .route("/metrics", get(metrics::metrics))
        .route("/healthz", get(health::healthz))
        .route("/readyz", get(health::readyz))
        .merge(page::routes())
        .with_state(WebState {
            view,
            options: Arc::new(options),
        })
}

/// Serves [`router`] on `listener` until the service's engine is asked to
/// stop.
pub async fn serve(
    listener: TcpListener,
    view: ServiceView,
    options: WebOptions,
) -> std::io::Result<()> {
    let shutdown = view.engine().shutdown().clone();
    axum::serve(listener, router(view, options))
        .with_graceful_shutdown(async move { shutdown.wait().await })
        .await
}
