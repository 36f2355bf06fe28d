//! `status`: prints what the engine says happened to each run key of a
//! pipeline ([`tidemark_engine::status`]), as a table or one JSON object
//! per line. No source is read, no secret is needed.

use std::io::IsTerminal;

use chrono::{DateTime, Utc};
use tidemark_core::{Error, Period, Pipeline};
use tidemark_engine::status::{StatusItem, StatusQuery, StatusReport, CALENDAR_MAX_PERIODS};
use tidemark_engine::{History, Store};

use crate::cli::{StatusArgs, When};
use crate::exit::Exit;
use crate::output::{self, StatusLine};
use crate::setup::Setup;

/// `status PIPELINE [--period P | --from P1 --to P2] [--only STATE] [--json]
/// [--calendar WHEN] [--color WHEN]`: the lines, then a summary line; over a
/// range on a terminal, a calendar above them.
///
/// It only reads: the database is opened read-only (a missing SQLite file
/// is not created, an old ledger is not migrated but named, with
/// `tidemark migrate` to run), and no ledger yet means no run key yet.
pub async fn status(setup: &Setup<'_>, args: StatusArgs) -> Result<Exit, Error> {
    let global = setup.global;
    let pipeline = setup.load(&args.pipeline)?;
    let now = setup.clock.now();
    let asked = match (&args.period, &args.from, &args.to) {
        (Some(text), _, _) => {
            let period = pipeline.period_arg("--period", text)?;
            Some((period, period))
        }
        (None, Some(from), Some(to)) => Some(crate::setup::range(&pipeline, from, to)?),
        _ => None,
    };
    if args.notices {
        return notices(setup, &pipeline, asked.map(|(p, _)| p), args.json).await;
    }
    let only = args.only.map(crate::cli::StatusOnly::filter);
    let query = StatusQuery {
        range: tidemark_engine::status::expected_range(&pipeline, asked, only, now)?,
        only,
    };
    let store = setup.open_read_only().await?;
    if store.is_none() {
        tell!(
            "note: no ledger at {} yet: nothing has run against this database (status creates none)",
            tidemark_load::redact_url(&global.database_url)
        );
    }
    let json = args.json;
    let calendar = !json && args.from.is_some() && wants_calendar(&args, query.range);
    let colour = colour_on(args.color);
    let report = if args.period.is_some() {
        period_story(store.as_ref(), &pipeline, query, now, json).await
    } else if calendar {
        with_calendar(store.as_ref(), &pipeline, query, now, colour).await
    } else {
        let mut table = output::StatusTable::default();
        tidemark_engine::status::status_report(
            store.as_ref(),
            &pipeline,
            query,
            now,
            false,
            |item| {
                let line = line_of(&item);
                if json {
                    output::print_status_json(&line, None);
                } else {
                    table.add(&line);
                }
            },
        )
        .await
    };
    if let Some(store) = &store {
        store.close().await;
    }
    let report = report?;
    if !json {
        if report.summary.lines == 0 {
            output::say_no_status(&pipeline, only.is_some());
        } else {
            output::print_status_summary(&report.summary, now);
        }
    }
    Ok(Exit::Success)
}

/// Whether `--calendar` (and where stdout goes) asks for the calendar of
/// `range`: not past [`CALENDAR_MAX_PERIODS`] periods, which the table
/// tells better (said on stderr when it was asked for outright).
fn wants_calendar(args: &StatusArgs, range: Option<(Period, Period)>) -> bool {
    let asked = match args.calendar {
        When::Always => true,
        When::Never => false,
        When::Auto => std::io::stdout().is_terminal(),
    };
    let Some((from, to)) = range.filter(|_| asked) else {
        return false;
    };
    let periods = Period::range_inclusive(from, to)
        .take(CALENDAR_MAX_PERIODS + 1)
        .count();
    if periods > CALENDAR_MAX_PERIODS && args.calendar == When::Always {
        tell!("note: no calendar: the range has more than {CALENDAR_MAX_PERIODS} periods; narrow --from/--to");
    }
    periods <= CALENDAR_MAX_PERIODS
}

/// Whether the calendar is coloured: `--color`, or on a terminal when
/// NO_COLOR is not set to anything (<https://no-color.org>).
fn colour_on(when: When) -> bool {
    match when {
        When::Always => true,
        When::Never => false,
        When::Auto => {
            std::io::stdout().is_terminal()
                && std::env::var_os("NO_COLOR").map_or(true, |v| v.is_empty())
        }
    }
}

/// A range with its calendar above the table: the lines are held until
/// the calendar is whole (at most [`CALENDAR_MAX_PERIODS`] periods per
/// source, see [`wants_calendar`]).
async fn with_calendar(
    store: Option<&Store>,
    pipeline: &Pipeline,
    query: StatusQuery,
    now: DateTime<Utc>,
    colour: bool,
) -> Result<StatusReport, Error> {
    let mut items = Vec::new();
    let report =
        tidemark_engine::status::status_report(store, pipeline, query, now, true, |item| {
            items.push(item)
        })
        .await?;
    if let Some(calendars) = &report.calendars {
        crate::calendar::print(&pipeline.spec.name, calendars, colour);
    }
    let mut table = output::StatusTable::default();
    for item in &items {
        table.add(&line_of(item));
    }
    Ok(report)
}

/// One period: its lines (one per source, a handful), then each recorded
/// key's story from the attempt history ([`crate::story`]). The number of
/// lines given.
async fn period_story(
    store: Option<&Store>,
    pipeline: &Pipeline,
    query: StatusQuery,
    now: DateTime<Utc>,
    json: bool,
) -> Result<StatusReport, Error> {
    let mut items = Vec::new();
    let report =
        tidemark_engine::status::status_report(store, pipeline, query, now, false, |item| {
            items.push(item)
        })
        .await?;
    let mut stories = Vec::new();
    for item in &items {
        let history = match (item, store) {
            (StatusItem::Recorded { entry, .. }, Some(store)) => store.history(entry).await?,
            // A missing line has the fields of a recorded one: an empty story.
            _ => History::default(),
        };
        stories.push(history);
    }
    let mut table = output::StatusTable::default();
    for (item, history) in items.iter().zip(&stories) {
        if json {
            output::print_status_json(&line_of(item), Some(history));
        } else {
            table.add(&line_of(item));
        }
    }
    if !json {
        for (item, history) in items.iter().zip(&stories) {
            if let StatusItem::Recorded { entry, .. } = item {
                crate::story::print(entry, history);
            }
        }
    }
    Ok(report)
}

fn line_of(item: &StatusItem) -> StatusLine<'_> {
    match item {
        StatusItem::Recorded { entry, due_at } => StatusLine::Recorded {
            entry,
            due_at: *due_at,
        },
        StatusItem::Missing {
            pipeline,
            source,
            export_type,
            period,
            due_at,
            due,
        } => StatusLine::Missing {
            pipeline,
            source,
            export_type,
            period,
            due_at: *due_at,
            due: *due,
        },
    }
}

/// `status --notices`: the pipeline's notices (of one period, if given),
/// oldest first, with their delivery state; one JSON object per notice
/// with `--json`.
async fn notices(
    setup: &Setup<'_>,
    pipeline: &Pipeline,
    period: Option<Period>,
    json: bool,
) -> Result<Exit, Error> {
    let Some(store) = setup.open_read_only().await? else {
        say!("no notices: nothing has run against this database");
        return Ok(Exit::Success);
    };
    let start = period.map(|p| p.start_rfc3339());
    let notices = store.notices(&pipeline.spec.name, start.as_deref()).await;
    store.close().await;
    let notices = notices?;
    for n in &notices {
        if json {
            say!("{}", serde_json::to_string(n).unwrap_or_default());
        } else {
            say!(
                "{}  {:<13} {:<9} {:<10} {:<25} attempt {:<3} {:<7} tries {}{}",
                n.id,
                n.kind,
                n.target,
                n.source,
                n.period_start,
                n.attempt,
                n.status,
                n.attempts,
                n.last_error
                    .as_deref()
                    .map(|e| format!("  last error: {e}"))
                    .unwrap_or_default()
            );
        }
    }
    if !json {
        let count = |status: &str| notices.iter().filter(|n| n.status == status).count();
        say!(
            "{} notice(s): {} sent, {} pending, {} dead",
            notices.len(),
            count("sent"),
            count("pending"),
            count("dead")
        );
    }
    Ok(Exit::Success)
}
