//! `GET /`: per pipeline and source, one cell per period over a range,
//! coloured by its state ([`PeriodState`]), each a link to its period's
//! page; the workers panel; a legend.
//!
//! The range is the last 90 due periods by default; `?last=N` asks for
//! another count, `?from=P&to=P` for a range (`?from=P` alone: N periods
//! from P; `?to=P` alone: N periods up to P), `?pipeline=NAME` for one
//! pipeline. At most [`MAX_PERIODS`] periods per pipeline: a longer range
//! is cut, and the page says so.
//!
//! One ledger read per pipeline for the whole range, of only the columns
//! a cell needs ([`tidemark_load::Store::grid_each`]); the periods the
//! ledger has no row for are `missing` (or `not-due`): never a query per
//! cell.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use chrono::{DateTime, Utc};
use maud::{html, Markup};
use serde::Deserialize;
use tidemark_core::{Error, Period, Pipeline};
use tidemark_load::{stale_reason, RunStatus, StartRange};

use super::{layout, period_prefix, period_segment};
use crate::story::PeriodState;
use crate::web::WebState;

/// Periods shown when the query names no count.
pub const DEFAULT_PERIODS: usize = 90;
/// The most periods shown per pipeline.
pub const MAX_PERIODS: usize = 10_000;

/// Cells per chunk of a row: the browser lays out and paints only the
/// chunks on screen (`content-visibility: auto`), so a row of 10,000
/// periods costs little more than the screenful shown.
const CHUNK: usize = 100;

/// The query string of `/`; every field is text, so a bad value is told on
/// the page rather than refused by the extractor.
#[derive(Debug, Default, Deserialize)]
pub(super) struct GridQuery {
    last: Option<String>,
    from: Option<String>,
    to: Option<String>,
    pipeline: Option<String>,
}

/// The first and last period shown.
type Range = (Period, Period);

/// The rows of a section: the pipeline's current export type first, then
/// by source and export type.
type Rows = BTreeMap<(bool, String, String), Row>;

/// One cell.
struct Cell {
    state: PeriodState,
    href: String,
    title: String,
}

/// One row: a source (and export type, when the ledger holds rows of
/// another one than the pipeline's current).
#[derive(Default)]
struct Row {
    cells: Vec<Cell>,
    counts: BTreeMap<&'static str, usize>,
}

/// What one pipeline's section shows.
struct Section {
    name: String,
    range: Option<Range>,
    notes: Vec<String>,
    rows: Rows,
    error: Option<String>,
}

pub(super) async fn index(
    State(state): State<WebState>,
    query: Result<Query<GridQuery>, QueryRejection>,
) -> Markup {
    let query = query.map(|Query(q)| q).unwrap_or_default();
    let now = state.view.engine().now();
    let (count, mut notes) = count_of(query.last.as_deref());
    let mut sections = Vec::new();
    for pipeline in state.view.pipelines() {
        if query
            .pipeline
            .as_deref()
            .is_some_and(|name| name != pipeline.spec.name)
        {
            continue;
        }
        sections.push(section(&state, &pipeline, &query, count, now).await);
    }
    if let Some(name) = query.pipeline.as_deref() {
        if sections.is_empty() {
            notes.push(format!("no pipeline named {name:?} is served"));
        }
    }
    let body = html! {
        h1 { "Periods" }
        (range_form(&query, count))
        @for note in &notes { p.note { (note) } }
        @for s in &sections { (render_section(s)) }
        (legend())
        (crate::web::workers::panel(&state).await)
    };
    layout("periods", body)
}

/// The count of periods asked by `?last=`, bounded, with a note when the
/// text was refused or cut.
fn count_of(last: Option<&str>) -> (usize, Vec<String>) {
    let Some(text) = last.filter(|t| !t.trim().is_empty()) else {
        return (DEFAULT_PERIODS, Vec::new());
    };
    match text.trim().parse::<usize>() {
        Ok(0) | Err(_) => (
            DEFAULT_PERIODS,
            vec![format!(
                "last={text:?} is not a count of periods from 1 to {MAX_PERIODS}; showing {DEFAULT_PERIODS}"
            )],
        ),
        Ok(n) if n > MAX_PERIODS => (
            MAX_PERIODS,
            vec![format!("last={n} is more than {MAX_PERIODS}; showing {MAX_PERIODS}")],
        ),
        Ok(n) => (n, Vec::new()),
    }
}

async fn section(
    state: &WebState,
    pipeline: &Arc<Pipeline>,
    query: &GridQuery,
    count: usize,
    now: DateTime<Utc>,
) -> Section {
    let mut section = Section {
        name: pipeline.spec.name.clone(),
        range: None,
        notes: Vec::new(),
        rows: BTreeMap::new(),
        error: None,
    };
    let range = match range_of(pipeline, query, count, now) {
        Ok(Some((range, cut))) => {
            if cut {
                section.notes.push(format!(
                    "the range is cut to its first {MAX_PERIODS} periods"
                ));
            }
            range
        }
        Ok(None) => {
            section.notes.push("no period is due yet".to_string());
            return section;
        }
        Err(e) => {
            section.error = Some(e.to_string());
            return section;
        }
    };
    section.range = Some(range);
    match cells_of(state, pipeline, range, now).await {
        Ok(rows) => section.rows = rows,
        Err(e) => section.error = Some(e.to_string()),
    }
    section
}

/// A period of the range, with what every row's cell of it shows.
struct Shown {
    period: Period,
    label: String,
    segment: String,
}

/// A recorded key's state, and its `not_before` when retrying.
type Recorded = (PeriodState, Option<String>);

/// The rows of a section: one read of the ledger over the range (only what
/// a cell needs), then one cell per period of the range and source, from
/// the rows read or, where the ledger has none, `missing` or `not-due`.
async fn cells_of(
    state: &WebState,
    pipeline: &Pipeline,
    (from, to): (Period, Period),
    now: DateTime<Utc>,
) -> Result<Rows, Error> {
    let periods: Vec<Shown> = Period::range_inclusive(from, to)
        .map(|period| Shown {
            label: period.label(),
            segment: period_segment(&period),
            period,
        })
        .collect();
    let (first, last) = (from.start_rfc3339(), to.start_rfc3339());
    let range = StartRange {
        from: Some(&first),
        to: Some(&last),
    };
    let current = &pipeline.spec.export_type;
    let fields = pipeline.fields_fingerprint();
    let mut stale_of: HashMap<(Option<String>, Option<String>), bool> = HashMap::new();
    let mut recorded: HashMap<(String, String), HashMap<i64, Recorded>> = HashMap::new();
    let store = state.view.engine().store();
    store
        .grid_each(&pipeline.spec.name, range, |row| {
            let Ok(at) = DateTime::parse_from_rfc3339(&row.period_start) else {
                return Ok(());
            };
            let stale = row.status == RunStatus::Done
                && *stale_of
                    .entry((row.handler_version.clone(), row.fields_fingerprint.clone()))
                    .or_insert_with(|| {
                        stale_reason(
                            row.handler_version.as_deref(),
                            row.fields_fingerprint.as_deref(),
                            &pipeline.spec.version,
                            &fields,
                        )
                        .is_some()
                    });
            let cell_state = PeriodState::of_row(&row, stale);
            let until = (cell_state == PeriodState::Retrying)
                .then_some(row.not_before)
                .flatten();
            recorded
                .entry((row.source, row.export_type))
                .or_default()
                .insert(at.timestamp(), (cell_state, until));
            Ok(())
        })
        .await?;
    let mut sources = crate::catalog::source_ids(pipeline, None)?;
    sources.sort();
    for source in sources {
        recorded.entry((source, current.clone())).or_default();
    }
    let mut rows = BTreeMap::new();
    for ((source, export), keys) in recorded {
        let row = row_of(pipeline, &periods, &source, &export, &keys, now);
        rows.insert((&export != current, source, export), row);
    }
    Ok(rows)
}

/// One row of cells over `periods`.
fn row_of(
    pipeline: &Pipeline,
    periods: &[Shown],
    source: &str,
    export: &str,
    keys: &HashMap<i64, Recorded>,
    now: DateTime<Utc>,
) -> Row {
    let mut row = Row::default();
    let suffix = if export == pipeline.spec.export_type {
        String::new()
    } else {
        format!(
            "?export={}",
            percent_encoding::utf8_percent_encode(export, percent_encoding::NON_ALPHANUMERIC)
        )
    };
    let prefix = period_prefix(&pipeline.spec.name, source);
    for shown in periods {
        let (state, until) = match keys.get(&shown.period.start().timestamp()) {
            Some((state, until)) => (*state, until.as_deref()),
            None if pipeline.is_due(&shown.period, now) => (PeriodState::Missing, None),
            None => (PeriodState::NotDue, None),
        };
        let mut title = format!("{} {state}", shown.label);
        if let Some(until) = until {
            title.push_str(" until ");
            title.push_str(until);
        }
        let href = format!("{prefix}{}{suffix}", shown.segment);
        *row.counts.entry(state.as_str()).or_default() += 1;
        row.cells.push(Cell { state, href, title });
    }
    row
}

/// The periods a section shows, and whether the asked range was cut.
/// `None`: no period is due yet (and none was asked).
fn range_of(
    pipeline: &Pipeline,
    query: &GridQuery,
    count: usize,
    now: DateTime<Utc>,
) -> Result<Option<(Range, bool)>, Error> {
    let text = |t: &Option<String>| t.clone().filter(|t| !t.trim().is_empty());
    match (text(&query.from), text(&query.to)) {
        (Some(from), Some(to)) => {
            let (from, to) = pipeline.period_range_named(("from", &from), ("to", &to))?;
            let last = Period::range_inclusive(from, to)
                .take(MAX_PERIODS)
                .last()
                .unwrap_or(from);
            Ok(Some(((from, last), last != to)))
        }
        (Some(from), None) => {
            let from = pipeline.period_arg("from", &from)?;
            let last = std::iter::successors(Some(from), |p| Some(p.next()))
                .take(count)
                .last()
                .unwrap_or(from);
            Ok(Some(((from, last), false)))
        }
        (None, Some(to)) => {
            let to = pipeline.period_arg("to", &to)?;
            Ok(Some(((back(&to, count, None), to), false)))
        }
        (None, None) => Ok(last_due(pipeline, now)
            .map(|to| ((back(&to, count, pipeline.first_period), to), false))),
    }
}

/// The last period due at `now`, if any is (none before `period.start`).
fn last_due(pipeline: &Pipeline, now: DateTime<Utc>) -> Option<Period> {
    let lag = chrono::Duration::from_std(pipeline.lag).ok()?;
    let at = now.checked_sub_signed(lag)?;
    let spec = &pipeline.spec.period;
    let mut period = Period::containing_instant(spec.granularity, spec.timezone, at);
    if !pipeline.is_due(&period, now) {
        period = previous(&period)?;
    }
    match pipeline.first_period {
        Some(first) if first.start() > period.start() => None,
        _ => Some(period),
    }
}

/// The first of the `count` periods ending with `to`, not before `first`.
fn back(to: &Period, count: usize, first: Option<Period>) -> Period {
    let mut period = *to;
    for _ in 1..count {
        if first.is_some_and(|f| f.start() >= period.start()) {
            break;
        }
        match previous(&period) {
            Some(p) => period = p,
            None => break,
        }
    }
    period
}

/// The period before `period`, if the calendar has one.
fn previous(period: &Period) -> Option<Period> {
    let before = period
        .start()
        .with_timezone(&Utc)
        .checked_sub_signed(chrono::Duration::seconds(1))?;
    let p = Period::containing_instant(period.granularity(), period.timezone(), before);
    (p.start() < period.start()).then_some(p)
}

fn range_form(query: &GridQuery, count: usize) -> Markup {
    let value = |t: &Option<String>| t.clone().unwrap_or_default();
    html! {
        form.range method="get" action="/" {
            label { "last " input type="number" name="last" min="1" max=(MAX_PERIODS) value=(count); }
            label { " or from " input type="text" name="from" placeholder="2024-01-01" value=(value(&query.from)); }
            label { " to " input type="text" name="to" placeholder="2024-03-31" value=(value(&query.to)); }
            @if let Some(p) = &query.pipeline { input type="hidden" name="pipeline" value=(p); }
            " " button type="submit" { "Show" }
        }
    }
}

fn render_section(s: &Section) -> Markup {
    html! {
        section.pipeline id={"p-" (s.name)} {
            h2 {
                a href={"/?pipeline=" (percent_encoding::utf8_percent_encode(&s.name, percent_encoding::NON_ALPHANUMERIC))} { (s.name) }
                @if let Some((from, to)) = &s.range {
                    span.range { " " (from.label()) " to " (to.label()) }
                }
            }
            @for note in &s.notes { p.note { (note) } }
            @if let Some(error) = &s.error { p.error { (error) } }
            @for ((_, source, export), row) in &s.rows {
                div.row {
                    div.source {
                        span.name { (source) }
                        @if s.rows.keys().any(|(_, _, e)| e != export) { span.export { " (" (export) ")" } }
                        span.counts {
                            @for (state, n) in &row.counts {
                                span.count { span class={"swatch s-" (state)} {} (n) " " (state) }
                            }
                        }
                    }
                    div.cells {
                        @for chunk in row.cells.chunks(CHUNK) {
                            span.chunk {
                                @for cell in chunk {
                                    a class={"cell s-" (cell.state)} href=(cell.href) title=(cell.title) {}
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

fn legend() -> Markup {
    html! {
        section.legend {
            h2 { "Legend" }
            ul {
                @for state in PeriodState::ALL {
                    li { span class={"swatch s-" (state)} {} b { (state) } ": " (state.meaning()) }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_are_bounded_and_bad_text_is_told() {
        assert_eq!(count_of(None).0, DEFAULT_PERIODS);
        assert_eq!(count_of(Some("7")), (7, Vec::new()));
        let (n, notes) = count_of(Some("999999"));
        assert_eq!(n, MAX_PERIODS);
        assert_eq!(notes.len(), 1);
        for bad in ["0", "-3", "lots", "1e9"] {
            let (n, notes) = count_of(Some(bad));
            assert_eq!((n, notes.len()), (DEFAULT_PERIODS, 1), "{bad}");
        }
    }

    fn daily() -> Pipeline {
        Pipeline::parse(
            r#"name = "p"
export_type = "t"

[period]
granularity = "day"
timezone = "UTC"
start = "2024-01-01"

[[sources]]
id = "s"
transport = "file"
format = "csv"
path = "data/{period.start:%Y-%m-%d}.csv"

[fields]
id = { type = "text", required = true }

[load]
table = "p"
key = ["id"]
"#,
            std::path::Path::new("pipelines/p.toml"),
        )
        .expect("a pipeline")
    }

    fn query(from: Option<&str>, to: Option<&str>) -> GridQuery {
        GridQuery {
            from: from.map(str::to_string),
            to: to.map(str::to_string),
            ..GridQuery::default()
        }
    }

    fn labels(range: Option<(Range, bool)>) -> Option<(String, String, bool)> {
        range.map(|((from, to), cut)| (from.label(), to.label(), cut))
    }

    #[test]
    fn ranges_are_the_last_due_periods_or_the_asked_ones_bounded() {
        let p = daily();
        let now = "2024-02-01T12:00:00Z".parse().expect("a time");
        let range = |q: GridQuery, n: usize| labels(range_of(&p, &q, n, now).expect("a range"));
        let day = |from: &str, to: &str, cut: bool| Some((from.into(), to.into(), cut));
        // The last due periods, never before period.start.
        assert_eq!(
            range(query(None, None), 7),
            day("2024-01-25", "2024-01-31", false)
        );
        assert_eq!(
            range(query(None, None), 90),
            day("2024-01-01", "2024-01-31", false)
        );
        assert_eq!(
            range(query(Some("2024-03-01"), None), 3),
            day("2024-03-01", "2024-03-03", false)
        );
        assert_eq!(
            range(query(None, Some("2024-03-01")), 3),
            day("2024-02-28", "2024-03-01", false)
        );
        assert_eq!(
            range(query(Some("2000-01-01"), Some("2099-12-31")), 90),
            day("2000-01-01", "2027-05-18", true)
        );
        assert!(range_of(&p, &query(Some("2024-02-01"), Some("2024-01-01")), 90, now).is_err());
        assert!(range_of(&p, &query(Some("soon"), None), 90, now).is_err());
        let early = "2023-06-01T00:00:00Z".parse().expect("a time");
        assert_eq!(
            labels(range_of(&p, &query(None, None), 90, early).expect("ok")),
            None
        );
    }

    #[test]
    fn previous_steps_back_across_a_dst_change() {
        let berlin: chrono_tz::Tz = "Europe/Berlin".parse().expect("a zone");
        let g = tidemark_core::Granularity::Hour;
        let second = Period::parse("2024-10-27T02:00:00+01:00", g, berlin).expect("an hour");
        let first = previous(&second).expect("an hour before");
        assert_eq!(first.start_rfc3339(), "2024-10-27T02:00:00+02:00");
        assert_eq!(
            back(&second, 3, None).start_rfc3339(),
            "2024-10-27T01:00:00+02:00"
        );
        assert_eq!(back(&second, 3, Some(first)), first);
    }
}
