//! The pages for people: `/` (a grid of periods per pipeline and source)
//! and `/periods/{pipeline}/{source}/{period}` (one period's story).

use axum::extract::{Path, State};
use axum::routing::get;
use axum::Router;
use maud::{html, Markup, DOCTYPE};

use super::WebState;

pub(super) fn routes() -> Router<WebState> {
    Router::new()
        .route("/", get(index))
        .route("/periods/{pipeline}/{source}/{period}", get(period))
}

async fn index(State(state): State<WebState>) -> Markup {
    let pipelines = state.view.pipelines();
    html! {
        (DOCTYPE)
        html { head { title { "tidemark" } } body {
            h1 { "tidemark" }
            ul { @for p in &pipelines { li { (p.spec.name) } } }
            (super::workers::panel(&state).await)
        } }
    }
}

async fn period(
    State(_state): State<WebState>,
    Path((pipeline, source, period)): Path<(String, String, String)>,
) -> Markup {
    html! {
        (DOCTYPE)
        html { head { title { (pipeline) " " (period) } } body {
            h1 { (pipeline) " / " (source) " / " (period) }
        } }
    }
}
