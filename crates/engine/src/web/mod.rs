//! `serve --listen ADDR`: what a running service shows, read-only, over
//! HTTP (axum). Everything comes from the ledger or the service's own
//! loops; no handler steers the service.
//!
//! - `GET /metrics`: Prometheus text exposition (`metrics.rs`).
//! - `GET /healthz`, `GET /readyz`: liveness and readiness (`health.rs`).
//! - `GET /` and `GET /periods/…`: pages for people (`page/`).
//!
//! The server stops with the engine's [`crate::Shutdown`], after the
//! requests in flight.

mod health;
mod metrics;
mod page;
mod workers;

use std::sync::Arc;
use std::time::Duration;

use axum::routing::get;
use axum::Router;
use tokio::net::TcpListener;

use crate::service::ServiceView;

pub(crate) use page::period_path;
pub use page::{LogUrl, LogUrlError};

/// How the endpoints answer (`serve`'s flags).
#[derive(Debug, Clone)]
pub struct WebOptions {
    /// Where an attempt's logs are (`serve --log-url TEMPLATE`): the period
    /// page links each attempt there.
    pub log_url: Option<LogUrl>,
    /// The longest `/metrics` reuses what it read from the ledger before
    /// reading it again (0: at every scrape; at most 15 s is sensible).
    /// While scrapes come, the cache is refreshed in the background, so a
    /// scrape does not wait for the ledger's queries.
    pub metrics_max_age: Duration,
}

impl Default for WebOptions {
    fn default() -> Self {
        WebOptions {
            log_url: None,
            metrics_max_age: DEFAULT_METRICS_MAX_AGE,
        }
    }
}

/// The default of [`WebOptions::metrics_max_age`].
pub const DEFAULT_METRICS_MAX_AGE: Duration = Duration::from_secs(10);

/// What every handler sees.
#[derive(Clone)]
pub(crate) struct WebState {
    pub(crate) view: ServiceView,
    pub(crate) options: Arc<WebOptions>,
    /// The ledger's aggregates for `/metrics`, kept briefly.
    pub(crate) metrics: Arc<metrics::MetricsCache>,
}

/// Every route, over `view`. The first read of the ledger's aggregates
/// for `/metrics` begins now, in the background.
pub fn router(view: ServiceView, options: WebOptions) -> Router {
    let cache = Arc::new(metrics::MetricsCache::new(options.metrics_max_age));
    cache.warm(view.engine().store().clone());
    Router::new()
        .route("/metrics", get(metrics::metrics))
        .route("/healthz", get(health::healthz))
        .route("/readyz", get(health::readyz))
        .merge(page::routes())
        .with_state(WebState {
            view,
            options: Arc::new(options),
            metrics: cache,
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
