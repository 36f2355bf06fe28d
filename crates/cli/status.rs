//! `status`: prints what the engine says happened to each run key of a
//! pipeline ([`tidemark_engine::status`]), as a table or one JSON object
//! per line. No source is read, no secret is needed.

use chrono::{DateTime, Utc};
use tidemark_core::{Error, Pipeline};
use tidemark_engine::status::{StatusItem, StatusQuery};
use tidemark_engine::{History, Store};

use crate::cli::StatusArgs;
use crate::exit::Exit;
use crate::output::{self, StatusLine};
use crate::setup::Setup;

/// `status PIPELINE [--period P | --from P1 --to P2] [--only STATE] [--json]`.
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
    let given = if args.period.is_some() {
        period_story(store.as_ref(), &pipeline, query, now, json).await
    } else {
        let mut table = output::StatusTable::default();
        tidemark_engine::status::status(store.as_ref(), &pipeline, query, now, |item| {
            let line = line_of(&item);
            if json {
                output::print_status_json(&line, None);
            } else {
                table.add(&line);
            }
        })
        .await
    };
    if let Some(store) = &store {
        store.close().await;
    }
    if !json && given? == 0 {
        output::say_no_status(&pipeline, only.is_some());
    }
    Ok(Exit::Success)
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
) -> Result<usize, Error> {
    let mut items = Vec::new();
    let given =
        tidemark_engine::status::status(store, pipeline, query, now, |item| items.push(item))
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
    Ok(given)
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
