//! The pages for people: `/` (a grid of periods per pipeline and source,
//! [`grid`]) and `/periods/{pipeline}/{source}/{period}` (one period's
//! story, [`period`]).
//!
//! Server-rendered with maud (which escapes every value), CSS inline, no
//! JavaScript: the page works in any browser, behind any proxy, and has no
//! build step. Read-only: nothing here writes to the ledger.

mod grid;
mod log_url;
mod period;

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use maud::{html, Markup, PreEscaped, DOCTYPE};
use tidemark_core::{Granularity, Period};

use super::WebState;

pub use log_url::{LogUrl, LogUrlError, LogValues};

pub(super) fn routes() -> Router<WebState> {
    Router::new()
        .route("/", get(grid::index))
        .route("/periods/{pipeline}/{source}/{period}", get(period::period))
}

/// The page's style: one sheet, inline.
const STYLE: &str = include_str!("style.css");

/// A whole page around `body`.
fn layout(title: &str, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " · tidemark" }
                style { (PreEscaped(STYLE)) }
            }
            body {
                header { a.home href="/" { "tidemark" } }
                main { (body) }
            }
        }
    }
}

/// A 404 page that names what was not found.
fn not_found(what: &str) -> Response {
    let body = html! {
        h1 { "Not found" }
        p.not-found { (what) }
        p { a href="/" { "Back to the grid" } }
    };
    (StatusCode::NOT_FOUND, layout("not found", body)).into_response()
}

/// A 500 page: the ledger could not be read.
fn unavailable(error: &tidemark_core::Error) -> Response {
    let body = html! {
        h1 { "The ledger cannot be read" }
        p.error { (error) }
    };
    (StatusCode::SERVICE_UNAVAILABLE, layout("unavailable", body)).into_response()
}

/// How a period is named in a URL: its local date (`2024-01-03`, a week
/// by its first day), month (`2024-01`), or, for an hour, its start with
/// its offset, so both 02:00 hours of a DST fall-back day have their own
/// page. Every form parses back to the same period ([`Period::parse`]).
fn period_key(period: &Period) -> String {
    let local = period.start().naive_local();
    match period.granularity() {
        Granularity::Hour => period.start_rfc3339(),
        Granularity::Day | Granularity::Week => local.format("%Y-%m-%d").to_string(),
        Granularity::Month => local.format("%Y-%m").to_string(),
    }
}

/// What a path segment must not hold as it is.
const SEGMENT: &percent_encoding::AsciiSet = &percent_encoding::CONTROLS
    .add(b' ')
    .add(b'"')
    .add(b'#')
    .add(b'%')
    .add(b'/')
    .add(b'<')
    .add(b'>')
    .add(b'?')
    .add(b'`')
    .add(b'{')
    .add(b'}')
    .add(b'\\')
    .add(b'+');

/// `text` as one path segment.
fn segment(text: &str) -> percent_encoding::PercentEncode<'_> {
    percent_encoding::utf8_percent_encode(text, SEGMENT)
}

/// `/periods/PIPELINE/SOURCE/`, to which a period's [`period_segment`] is
/// added. Names are percent-encoded as one path segment each (a source id
/// may hold any character).
fn period_prefix(pipeline: &str, source: &str) -> String {
    format!("/periods/{}/{}/", segment(pipeline), segment(source))
}

/// The path of a period's page (`/periods/PIPELINE/SOURCE/KEY`), which a
/// notice links to under `serve --public-url`.
pub(crate) fn period_path(pipeline: &str, source: &str, period: &Period) -> String {
    format!(
        "{}{}",
        period_prefix(pipeline, source),
        period_segment(period)
    )
}

/// The period's [`period_key`] as a path segment.
fn period_segment(period: &Period) -> String {
    segment(&period_key(period)).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn period_keys_parse_back_to_their_period() {
        let berlin: chrono_tz::Tz = "Europe/Berlin".parse().expect("a zone");
        for (granularity, text) in [
            (Granularity::Hour, "2024-10-27T02:00:00+01:00"),
            (Granularity::Hour, "2024-10-27T02:00:00+02:00"),
            (Granularity::Day, "2024-03-31"),
            (Granularity::Week, "2024-03-04"),
            (Granularity::Month, "2024-03"),
        ] {
            let period = Period::parse(text, granularity, berlin).expect("a period");
            let key = period_key(&period);
            assert_eq!(
                Period::parse(&key, granularity, berlin),
                Ok(period),
                "{key}"
            );
        }
    }

    #[test]
    fn hrefs_keep_offsets_and_odd_names_in_one_segment() {
        let berlin: chrono_tz::Tz = "Europe/Berlin".parse().expect("a zone");
        let hour = Period::parse("2024-01-01T05", Granularity::Hour, berlin).expect("an hour");
        assert_eq!(
            format!("{}{}", period_prefix("p", "a/b c"), period_segment(&hour)),
            "/periods/p/a%2Fb%20c/2024-01-01T05:00:00%2B01:00"
        );
    }
}
