//! Which run keys a command takes up, and how: the open-period rule, the
//! selection of `backfill --only`, and `sync`'s due periods with their
//! forced re-runs (lookback, provisional). Decided here once, for the real
//! commands and their dry runs alike; what a claim then does with a key is
//! the ledger's claim rules, which a dry run previews with the same code.

use std::collections::HashMap;

use chrono::{DateTime, SecondsFormat, Utc};
use tidemark_core::{Error, Period, Pipeline, RunKey};
use tidemark_load::{LedgerEntry, QueueKey, RunStatus, Store};

use crate::cli::Only;

/// What a command asks for, before the ledger is consulted.
#[derive(Debug, Clone)]
pub enum Ask {
    /// `run` (one period) or `backfill` (a range): every source's key of
    /// each period, narrowed by `--only`.
    Periods {
        periods: Vec<Period>,
        only: Option<Only>,
        force: bool,
    },
    /// `sync`: the due periods not done yet, plus forced re-runs of the
    /// last `lookback` done ones and of provisional ones now due.
    Sync { force: bool },
}

impl Ask {
    /// Whether planning needs the ledger's rows.
    fn reads_ledger(&self) -> bool {
        !matches!(self, Ask::Periods { only: None, .. })
    }
}

/// Why a done run key is run again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Forced {
    /// `--force`, or `--only all`.
    Flag,
    /// `--only stale`: done under another version or `[fields]`.
    Stale(String),
    /// Done while its period was open; `sync` re-runs it once due.
    Provisional,
    /// One of the last `lookback` done periods `sync` re-reads for late data.
    Lookback,
}

/// What the command does with one run key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Intent {
    /// Claim it (forced, when done, for the reason given); the claim rules
    /// decide the rest.
    Claim(Option<Forced>),
    /// Leave it alone, for this reason.
    Leave(String),
}

/// One run key of a command's plan.
#[derive(Debug, Clone)]
pub struct Planned {
    pub key: RunKey,
    pub source: String,
    pub intent: Intent,
    /// Its period is still open (the run was allowed with `--allow-open`):
    /// a done run is recorded as provisional.
    pub provisional: bool,
}

/// The keys of a plan to put into the work queue: those to claim as usual
/// (new, or back from failed or cancelled), and those to claim forced (done
/// keys to run again). Keys the plan leaves alone are not queued.
pub fn queue_keys(planned: &[Planned]) -> (Vec<QueueKey>, Vec<QueueKey>) {
    let (mut fresh, mut forced) = (Vec::new(), Vec::new());
    for p in planned {
        let key = QueueKey {
            source: p.source.clone(),
            period_start: p.key.period.start_rfc3339(),
            period_end: p.key.period.end_rfc3339(),
        };
        match p.intent {
            Intent::Claim(None) => fresh.push(key),
            Intent::Claim(Some(_)) => forced.push(key),
            Intent::Leave(_) => {}
        }
    }
    (fresh, forced)
}

/// `run`/`backfill` refuse a period that is still open (its end plus `lag`
/// has not passed at `now`) unless `allow_open`: a usage error naming the
/// instant it becomes due, raised before any database is opened.
pub fn refuse_open(
    pipeline: &Pipeline,
    periods: &[Period],
    flag: &str,
    now: DateTime<Utc>,
    allow_open: bool,
) -> Result<(), Error> {
    if allow_open {
        return Ok(());
    }
    let open: Vec<&Period> = periods
        .iter()
        .filter(|p| !pipeline.is_due(p, now))
        .collect();
    let Some(first) = open.first() else {
        return Ok(());
    };
    let due = pipeline.due_at(first).map_or_else(
        || "never (its end plus lag is past the year 9999)".to_string(),
        |at| format!("at {}", at.to_rfc3339_opts(SecondsFormat::Secs, true)),
    );
    let which = if open.len() == 1 {
        format!("period {} is still open", first.label())
    } else {
        format!(
            "{} periods are still open, the first {}",
            open.len(),
            first.label()
        )
    };
    Err(Error::config(
        "command line",
        flag,
        format!(
            "{which}: it becomes due {due} (its end {} plus period.lag {}); pass --allow-open to run it now as provisional (sync re-runs it once due)",
            first.end().to_rfc3339_opts(SecondsFormat::Secs, false),
            humantime::format_duration(pipeline.lag),
        ),
    ))
}

/// The plan of `ask` for `pipeline`'s `sources` at `now`. The ledger is
/// read (from `store`; no store means no ledger yet) only when the
/// selection depends on it.
pub async fn plan(
    store: Option<&Store>,
    pipeline: &Pipeline,
    sources: &[String],
    ask: &Ask,
    now: DateTime<Utc>,
) -> Result<Vec<Planned>, Error> {
    let entries = match store {
        Some(store) if ask.reads_ledger() => ledger_entries(store, pipeline, None).await?,
        _ => Vec::new(),
    };
    match ask {
        Ask::Periods {
            periods,
            only,
            force,
        } => Ok(for_periods(
            pipeline, periods, sources, *only, *force, &entries, now,
        )),
        Ask::Sync { force } => for_sync(pipeline, sources, *force, &entries, now),
    }
}

/// The ledger rows of `pipeline` (optionally of one period start), judged
/// stale or not against its current version and `[fields]`; read with the
/// pipeline's retries, like every database step of a command.
pub async fn ledger_entries(
    store: &Store,
    pipeline: &Pipeline,
    period_start: Option<&str>,
) -> Result<Vec<LedgerEntry>, Error> {
    let mut entries = crate::engine::retry(&pipeline.retry, "read the ledger", || {
        store.status(&pipeline.spec.name, period_start)
    })
    .await?;
    let fingerprint = pipeline.fields_fingerprint();
    for entry in &mut entries {
        entry.judge_staleness(&pipeline.spec.version, &fingerprint);
    }
    Ok(entries)
}

/// This export type's ledger rows by `(source, period start)`.
fn index<'a>(
    pipeline: &Pipeline,
    entries: &'a [LedgerEntry],
) -> HashMap<(&'a str, &'a str), &'a LedgerEntry> {
    entries
        .iter()
        .filter(|e| e.export_type == pipeline.spec.export_type)
        .map(|e| ((e.source.as_str(), e.period_start.as_str()), e))
        .collect()
}

fn key(pipeline: &Pipeline, source: &str, period: Period) -> RunKey {
    RunKey::new(
        &pipeline.spec.name,
        source,
        &pipeline.spec.export_type,
        period,
    )
}

fn for_periods(
    pipeline: &Pipeline,
    periods: &[Period],
    sources: &[String],
    only: Option<Only>,
    force: bool,
    entries: &[LedgerEntry],
    now: DateTime<Utc>,
) -> Vec<Planned> {
    let index = index(pipeline, entries);
    let mut plan = Vec::with_capacity(periods.len() * sources.len());
    for period in periods {
        let start = period.start_rfc3339();
        for source in sources {
            let entry = index.get(&(source.as_str(), start.as_str())).copied();
            plan.push(Planned {
                key: key(pipeline, source, *period),
                source: source.clone(),
                intent: select(only, force, entry),
                provisional: !pipeline.is_due(period, now),
            });
        }
    }
    plan
}

/// `--only` (the ledger vocabulary of docs/ledger.md): `failed` and
/// `missing` claim as usual, `stale` forces the re-run of a done key, `all`
/// forces every key like `--force`; without it every key is claimed and
/// the claim rules skip the done ones.
fn select(only: Option<Only>, force: bool, entry: Option<&LedgerEntry>) -> Intent {
    let chosen = match (only, entry) {
        (None, _) => return Intent::Claim(force.then_some(Forced::Flag)),
        (Some(Only::All), _) => return Intent::Claim(Some(Forced::Flag)),
        (Some(Only::Missing), None) => return Intent::Claim(None),
        (Some(Only::Failed), Some(e)) if e.status == RunStatus::Failed => {
            return Intent::Claim(None)
        }
        (Some(Only::Stale), Some(e)) if e.stale => {
            return Intent::Claim(Some(Forced::Stale(
                e.stale_reason.clone().unwrap_or_default(),
            )))
        }
        (Some(only), entry) => (only, entry),
    };
    let (only, entry) = chosen;
    Intent::Leave(format!(
        "not {} ({})",
        only.name(),
        entry.map_or_else(|| "missing: never run".to_string(), describe)
    ))
}

/// A ledger row's state in a few words.
fn describe(entry: &LedgerEntry) -> String {
    match (entry.status, &entry.error_class, &entry.finished_at) {
        (RunStatus::Done, _, Some(at)) => format!("done at {at}"),
        (RunStatus::Failed, Some(class), _) => format!("failed: {class}"),
        (status, _, _) => status.to_string(),
    }
}

fn for_sync(
    pipeline: &Pipeline,
    sources: &[String],
    force: bool,
    entries: &[LedgerEntry],
    now: DateTime<Utc>,
) -> Result<Vec<Planned>, Error> {
    let due = pipeline.due_periods(now)?;
    let index = index(pipeline, entries);
    let lookback = usize::try_from(pipeline.spec.period.lookback).unwrap_or(usize::MAX);
    let mut plan = Vec::new();
    for source in sources {
        let starts: Vec<String> = due.iter().map(Period::start_rfc3339).collect();
        let done: Vec<Option<&LedgerEntry>> = starts
            .iter()
            .map(|start| {
                index
                    .get(&(source.as_str(), start.as_str()))
                    .copied()
                    .filter(|e| e.status == RunStatus::Done)
            })
            .collect();
        // The last `lookback` done periods are read again for late data.
        let again: Vec<usize> = (0..due.len())
            .rev()
            .filter(|&i| done[i].is_some())
            .take(lookback)
            .collect();
        for (i, period) in due.iter().enumerate() {
            let entry = index.get(&(source.as_str(), starts[i].as_str())).copied();
            let intent = match (entry, done[i]) {
                (_, Some(_)) if force => Intent::Claim(Some(Forced::Flag)),
                (_, Some(e)) if e.provisional => Intent::Claim(Some(Forced::Provisional)),
                (_, Some(_)) if again.contains(&i) => Intent::Claim(Some(Forced::Lookback)),
                (_, Some(e)) => Intent::Leave(describe(e)),
                (None, None) => Intent::Claim(None),
                (Some(e), None) => undone(e, force),
            };
            plan.push(Planned {
                key: key(pipeline, source, *period),
                source: source.clone(),
                intent,
                provisional: false,
            });
        }
    }
    Ok(plan)
}

/// What `sync` does with a due key that is not done: a failed one runs
/// again once its backoff (`not_before`: 1 min, doubling, at most 24 h) has
/// passed by the database's clock, which stored it (`TIDEMARK_NOW` moves
/// only what is due), so a permanently failing source is not read at every
/// fire; a cancelled one stays out until an operator runs or queues it; a
/// pending or running one is claimed (the claim rules then resume or hold
/// it).
fn undone(entry: &LedgerEntry, force: bool) -> Intent {
    match entry.status {
        RunStatus::Failed if !force && entry.backing_off => Intent::Leave(format!(
            "{}; retried from {}",
            describe(entry),
            entry.not_before.as_deref().unwrap_or("?")
        )),
        RunStatus::Cancelled if !force => {
            Intent::Leave("cancelled: run or queue it to run it again".to_string())
        }
        _ => Intent::Claim(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;
    use tidemark_load::Counts;

    fn pipeline(extra: &str) -> Pipeline {
        Pipeline::parse(
            &format!(
                r#"name = "p"
export_type = "e"
version = "2"
[period]
granularity = "day"
start = "2024-01-01"
lag = "2h"
{extra}
[[sources]]
id = "s"
transport = "file"
format = "csv"
path = "x.csv"
[fields]
id = {{ type = "int", required = true }}
[load]
table = "t"
key = ["id"]
"#
            ),
            Path::new("p.toml"),
        )
        .unwrap()
    }

    fn at(text: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(text)
            .unwrap()
            .with_timezone(&Utc)
    }

    fn entry(p: &Pipeline, day: &str, status: RunStatus, provisional: bool) -> LedgerEntry {
        let period = p.period(day).unwrap();
        LedgerEntry {
            pipeline: "p".into(),
            source: "s".into(),
            export_type: "e".into(),
            period_start: period.start_rfc3339(),
            period_end: period.end_rfc3339(),
            status,
            attempts: 1,
            run_id: None,
            counts: Counts::default(),
            error_class: (status == RunStatus::Failed).then(|| "parse".into()),
            error_message: None,
            started_at: None,
            finished_at: Some(format!("{day}T05:00:00.000Z")),
            handler_version: Some("1".into()),
            provisional,
            stale: status == RunStatus::Done,
            stale_reason: (status == RunStatus::Done).then(|| "version 1 -> 2".into()),
            fields_fingerprint: None,
            lease_owner: None,
            lease_expires_at: None,
            priority: 0,
            not_before: None,
            backing_off: false,
            enqueued_by: None,
        }
    }

    #[test]
    fn an_open_period_is_refused_naming_when_it_is_due() {
        let p = pipeline("");
        let day = p.period("2024-01-05").unwrap();
        let before = at("2024-01-06T01:59:59Z");
        let error = refuse_open(&p, &[day], "--period", before, false).unwrap_err();
        let shown = error.to_string();
        assert!(
            shown.contains("period 2024-01-05 is still open")
                && shown.contains("due at 2024-01-06T02:00:00Z")
                && shown.contains("--allow-open"),
            "{shown}"
        );
        assert_eq!(error.class(), tidemark_core::ErrorClass::Config);
        assert!(refuse_open(&p, &[day], "--period", before, true).is_ok());
        assert!(refuse_open(&p, &[day], "--period", at("2024-01-06T02:00:00Z"), false).is_ok());
    }

    #[test]
    fn only_selects_by_ledger_state() {
        let p = pipeline("");
        let periods: Vec<Period> = ["2024-01-01", "2024-01-02", "2024-01-03"]
            .iter()
            .map(|d| p.period(d).unwrap())
            .collect();
        let entries = [
            entry(&p, "2024-01-01", RunStatus::Done, false),
            entry(&p, "2024-01-02", RunStatus::Failed, false),
        ];
        let now = at("2024-02-01T00:00:00Z");
        let sources = ["s".to_string()];
        let intents = |only, force| -> Vec<Intent> {
            for_periods(&p, &periods, &sources, only, force, &entries, now)
                .into_iter()
                .map(|planned| planned.intent)
                .collect()
        };
        let claim = Intent::Claim(None);
        assert_eq!(intents(None, false), vec![claim.clone(); 3]);
        assert_eq!(
            intents(None, true),
            vec![Intent::Claim(Some(Forced::Flag)); 3]
        );
        assert_eq!(
            intents(Some(Only::All), false),
            vec![Intent::Claim(Some(Forced::Flag)); 3]
        );
        let failed = intents(Some(Only::Failed), false);
        assert_eq!(failed[1], claim);
        assert!(
            matches!(&failed[0], Intent::Leave(why) if why == "not failed (done at 2024-01-01T05:00:00.000Z)")
        );
        assert!(
            matches!(&failed[2], Intent::Leave(why) if why == "not failed (missing: never run)")
        );
        let missing = intents(Some(Only::Missing), false);
        assert!(matches!(
            missing[..],
            [Intent::Leave(_), Intent::Leave(_), Intent::Claim(None)]
        ));
        let stale = intents(Some(Only::Stale), false);
        assert_eq!(
            stale[0],
            Intent::Claim(Some(Forced::Stale("version 1 -> 2".into())))
        );
        assert!(matches!(&stale[1], Intent::Leave(why) if why == "not stale (failed: parse)"));
    }

    #[test]
    fn sync_reruns_provisional_and_lookback_periods_once_due() {
        let p = pipeline("lookback = 1");
        let entries = [
            entry(&p, "2024-01-01", RunStatus::Done, true),
            entry(&p, "2024-01-02", RunStatus::Done, false),
            entry(&p, "2024-01-03", RunStatus::Done, false),
        ];
        let sources = ["s".to_string()];
        // 2024-01-04 is due at 2024-01-05T02:00Z (Europe: UTC here).
        let plan = for_sync(&p, &sources, false, &entries, at("2024-01-05T02:00:00Z")).unwrap();
        let intents: Vec<Intent> = plan.into_iter().map(|planned| planned.intent).collect();
        assert_eq!(
            intents,
            vec![
                Intent::Claim(Some(Forced::Provisional)),
                Intent::Leave("done at 2024-01-02T05:00:00.000Z".into()),
                Intent::Claim(Some(Forced::Lookback)),
                Intent::Claim(None),
            ]
        );
    }
}
