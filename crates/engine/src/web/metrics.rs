//! `/metrics`: the Prometheus text exposition, through prometheus-client.

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::WebState;

/// The content type of the text exposition format.
const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Version {
    version: String,
}

pub(super) async fn metrics(State(_state): State<WebState>) -> Response {
    let mut registry = Registry::default();
    let build = Family::<Version, Gauge>::default();
    build
        .get_or_create(&Version {
            version: env!("CARGO_PKG_VERSION").to_string(),
        })
        .set(1);
    registry.register("tidemark_build_info", "tidemark's version", build);
    let mut body = String::new();
    match encode(&mut body, &registry) {
        Ok(()) => ([(header::CONTENT_TYPE, CONTENT_TYPE)], body).into_response(),
        Err(_) => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
    }
}
