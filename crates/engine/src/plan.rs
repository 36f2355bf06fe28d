//! Which run keys a command takes up, and how: the open-period rule, the
//! selection of `backfill --only`, and `sync`'s due periods with their
//! forced re-runs (lookback, provisional). Decided here once, for the real
//! commands, the scheduler and their dry runs alike; what a claim then does
//! with a key is the ledger's claim rules, which a dry run previews with
//! the same code.
//!
//! A plan streams ([`Planner`]): the periods are walked, and a page of at
//! most [`PAGE_KEYS`] run keys is planned at a time, with the ledger rows of
//! exactly those keys read for it (one indexed lookup each). However many
//! periods a range or a `sync` spans (an hourly pipeline from 1900 has over
//! a million), planning holds one page (ADR 0014).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use chrono::{DateTime, SecondsFormat, Utc};
use tidemark_core::{Error, Period, Pipeline, RunKey};
use tidemark_load::{Enqueue, EnqueuedBy, KeyRef, KeyRow, LedgerEntry, QueueKey, RunStatus, Store};

/// A selection of run keys by their state in the ledger (`backfill
/// --only`; docs/ledger.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Only {
    /// Failed keys: run again from the start.
    Failed,
    /// Periods with no ledger row: never run.
    Missing,
    /// Done under another handler version or other `[fields]`: re-run
    /// (forced); unchanged rows are not written again.
    Stale,
    /// Every period, done ones re-run (like `force`).
    All,
}

impl Only {
    /// The selection's name (`failed`, `missing`, `stale`, `all`).
    pub fn name(self) -> &'static str {
        match self {
            Only::Failed => "failed",
            Only::Missing => "missing",
            Only::Stale => "stale",
            Only::All => "all",
        }
    }
}

/// Run keys per page of a plan: what planning holds at once (the page's
/// keys, their ledger rows, and the jobs or queued keys made of them), and
/// the keys one enqueue transaction carries.
pub const PAGE_KEYS: usize = tidemark_load::ENQUEUE_CHUNK;

/// The periods `--from` to `--to` (or one `--period`) name, both included;
/// walked, never collected.
#[derive(Debug, Clone, Copy)]
pub struct PeriodRange {
    /// The first period.
    pub from: Period,
    /// The last period (included).
    pub to: Period,
}

impl PeriodRange {
    /// One period.
    pub fn one(period: Period) -> PeriodRange {
        PeriodRange {
            from: period,
            to: period,
        }
    }

    /// Its periods, in order.
    pub fn periods(&self) -> impl Iterator<Item = Period> {
        Period::range_inclusive(self.from, self.to)
    }
}

/// What a command asks for, before the ledger is consulted.
#[derive(Debug, Clone)]
pub enum Ask {
    /// `run` (one period) or `backfill` (a range): every source's key of
    /// each period, narrowed by `--only`.
    Periods {
        /// The periods.
        range: PeriodRange,
        /// Only the keys in this state.
        only: Option<Only>,
        /// Run done keys again.
        force: bool,
    },
    /// `sync`: the due periods not done yet, plus forced re-runs of the
    /// last `lookback` done ones and of provisional ones now due.
    Sync {
        /// Run done keys again.
        force: bool,
        /// Lift the back-off: run failed keys whose `not_before` has not
        /// passed too (`sync --now`).
        now: bool,
    },
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
    /// The run key.
    pub key: RunKey,
    /// Its source.
    pub source: String,
    /// What the command does with it.
    pub intent: Intent,
    /// Its period is still open (the run was allowed with `--allow-open`):
    /// a done run is recorded as provisional.
    pub provisional: bool,
    /// Its ledger row as the plan read it (none: no row, or not read).
    pub row: Option<KeyRow>,
}

/// The keys of a plan's page to put into the work queue: those to claim
/// as usual (new, or back from failed or cancelled), and those to claim
/// forced (done keys to run again). Keys the plan leaves alone are not
/// queued.
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

/// How a plan's keys enter the queue.
pub struct QueueAs {
    /// The queue priority.
    pub priority: i64,
    /// Who queued the keys.
    pub by: EnqueuedBy,
    /// States from which a key the plan claims as usual is queued again.
    pub fresh_from: &'static [RunStatus],
    /// States from which a key the plan forces is queued again.
    pub forced_from: &'static [RunStatus],
    /// The scheduler: a failed key is queued again only once its back-off
    /// has passed by the database's clock (see [`Enqueue::respect_backoff`]).
    pub respect_backoff: bool,
}

/// Queues what `plan` plans, a page at a time, each page in its own
/// transaction as it is planned (ADR 0014): a failure leaves the pages
/// before it queued, and the same command run again queues the rest
/// (queuing is idempotent). `on_page` hears how many keys each page newly
/// queued. Returns (queued, keys the plan would claim); the statistics are
/// refreshed once at the end, even after a failure.
pub async fn enqueue_plan(
    store: &Store,
    plan: &mut Planner,
    how: &QueueAs,
    mut on_page: impl FnMut(u64),
) -> Result<(u64, u64), Error> {
    let pipeline = Arc::clone(plan.pipeline());
    let (mut queued, mut considered) = (0, 0);
    let result = async {
        while let Some(page) = plan.next_page().await? {
            let (fresh, forced) = queue_keys(&page);
            considered += (fresh.len() + forced.len()) as u64;
            let mut page_queued = 0;
            for (keys, requeue) in [(&fresh, how.fresh_from), (&forced, how.forced_from)] {
                if keys.is_empty() {
                    continue;
                }
                let batch = Enqueue {
                    pipeline: &pipeline.spec.name,
                    export_type: &pipeline.spec.export_type,
                    keys,
                    priority: how.priority,
                    by: how.by,
                    requeue,
                    respect_backoff: how.respect_backoff,
                };
                page_queued +=
                    crate::run::retry(&pipeline.retry, "queue keys", || store.enqueue(&batch))
                        .await?;
            }
            queued += page_queued;
            on_page(page_queued);
        }
        Ok::<_, Error>(())
    }
    .await;
    store.enqueued(queued).await;
    result.map(|()| (queued, considered))
}

/// `run`/`backfill` refuse a period that is still open (its end plus `lag`
/// has not passed at `now`) unless `allow_open`: a usage error naming the
/// instant it becomes due, raised before any database is opened. Periods
/// become due in order, so the open ones are the range's tail: when its
/// last period is due nothing is walked.
pub fn refuse_open(
    pipeline: &Pipeline,
    range: PeriodRange,
    flag: &str,
    now: DateTime<Utc>,
    allow_open: bool,
) -> Result<(), Error> {
    if allow_open || pipeline.is_due(&range.to, now) {
        return Ok(());
    }
    let mut open = range.periods().skip_while(|p| pipeline.is_due(p, now));
    let Some(first) = open.next() else {
        return Ok(());
    };
    let count = 1 + open.count();
    let due = pipeline.due_at(&first).map_or_else(
        || "never (its end plus lag is past the year 9999)".to_string(),
        |at| format!("at {}", at.to_rfc3339_opts(SecondsFormat::Secs, true)),
    );
    let which = if count == 1 {
        format!("period {} is still open", first.label())
    } else {
        format!(
            "{count} periods are still open, the first {}",
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

/// A plan, made a page at a time: [`Planner::next_page`] walks the next
/// periods, reads the ledger rows of their keys (when the selection or a
/// preview needs them, and there is a ledger) and decides each key.
///
/// The order of the keys is the order the commands have always shown:
/// `run`/`backfill` by period, then source; `sync` by source, then period.
/// Each page is read on its own (a short read, no transaction held across
/// pages), so a command that runs what it plans can plan as it goes.
pub struct Planner {
    store: Option<Store>,
    pipeline: Arc<Pipeline>,
    sources: Vec<String>,
    ask: Ask,
    now: DateTime<Utc>,
    /// Read every page's ledger rows (dry runs preview each claim), not
    /// only when the selection depends on them.
    read_rows: bool,
    /// The next period to plan (of the current source, for `sync`).
    next: Option<Period>,
    /// `sync`: the index of the source being planned.
    source: usize,
    /// `sync`: per source, the starts of its last `lookback` done due
    /// periods; found once, before the first page.
    lookback: Option<Vec<HashSet<String>>>,
}

impl Planner {
    /// The plan of `ask` for `pipeline`'s `sources` at `now`. No store means
    /// no ledger yet. `previews`: read the ledger rows of every key.
    pub fn new(
        store: Option<Store>,
        pipeline: Arc<Pipeline>,
        sources: Vec<String>,
        ask: Ask,
        now: DateTime<Utc>,
        previews: bool,
    ) -> Result<Planner, Error> {
        let next = match &ask {
            Ask::Periods { range, .. } => Some(range.from),
            Ask::Sync { .. } => pipeline.due_periods(now)?.next(),
        };
        Ok(Planner {
            read_rows: store.is_some() && (previews || ask.reads_ledger()),
            store,
            pipeline,
            sources,
            ask,
            now,
            next,
            source: 0,
            lookback: None,
        })
    }

    /// The pipeline planned.
    pub fn pipeline(&self) -> &Arc<Pipeline> {
        &self.pipeline
    }

    /// The next page of the plan; `None` once every key is planned. A
    /// failed ledger read is tried again with the pipeline's retries.
    pub async fn next_page(&mut self) -> Result<Option<Vec<Planned>>, Error> {
        match self.ask.clone() {
            Ask::Periods { range, only, force } => {
                let per_page = (PAGE_KEYS / self.sources.len().max(1)).max(1);
                let periods = self.take_periods(per_page, |p| p.start() <= range.to.start());
                if periods.is_empty() {
                    return Ok(None);
                }
                let sources = self.sources.clone();
                let mut rows = self.read(&periods, &sources).await?;
                let fingerprint = self.pipeline.fields_fingerprint();
                let mut page = Vec::with_capacity(periods.len() * sources.len());
                for (period, start) in periods {
                    for source in &sources {
                        let mut row = rows.remove(&(source.clone(), start.clone()));
                        if let Some(row) = &mut row {
                            row.entry
                                .judge_staleness(&self.pipeline.spec.version, &fingerprint);
                        }
                        page.push(Planned {
                            key: key(&self.pipeline, source, period),
                            source: source.clone(),
                            intent: select(only, force, row.as_ref().map(|r| &r.entry)),
                            provisional: !self.pipeline.is_due(&period, self.now),
                            row,
                        });
                    }
                }
                Ok(Some(page))
            }
            Ask::Sync { force, now } => self.sync_page(force, now).await,
        }
    }

    /// Up to `n` periods from `next` that pass `within`, with their starts.
    fn take_periods(
        &mut self,
        n: usize,
        within: impl Fn(&Period) -> bool,
    ) -> Vec<(Period, String)> {
        let mut periods = Vec::new();
        while periods.len() < n {
            match self.next.take() {
                Some(period) if within(&period) => {
                    periods.push((period, period.start_rfc3339()));
                    self.next = Some(period.next());
                }
                _ => break,
            }
        }
        periods
    }

    /// `sync`'s next page: due periods of the current source, then of the
    /// next source from `period.start`.
    async fn sync_page(&mut self, force: bool, lift: bool) -> Result<Option<Vec<Planned>>, Error> {
        if self.lookback.is_none() {
            self.lookback = Some(self.find_lookback().await?);
        }
        let (pipeline, now) = (Arc::clone(&self.pipeline), self.now);
        loop {
            let Some(source) = self.sources.get(self.source).cloned() else {
                return Ok(None);
            };
            let periods = self.take_periods(PAGE_KEYS, |p| pipeline.is_due(p, now));
            if periods.is_empty() {
                self.source += 1;
                self.next = pipeline.due_periods(now)?.next();
                continue;
            }
            let mut rows = self.read(&periods, std::slice::from_ref(&source)).await?;
            let again = self
                .lookback
                .as_ref()
                .and_then(|l| l.get(self.source))
                .cloned()
                .unwrap_or_default();
            let mut page = Vec::with_capacity(periods.len());
            for (period, start) in periods {
                let row = rows.remove(&(source.clone(), start.clone()));
                let entry = row.as_ref().map(|r| &r.entry);
                page.push(Planned {
                    key: key(&pipeline, &source, period),
                    source: source.clone(),
                    intent: sync_intent(entry, again.contains(&start), force, lift),
                    provisional: false,
                    row,
                });
            }
            return Ok(Some(page));
        }
    }

    /// The ledger rows of `periods` × `sources` that exist, by (source,
    /// period start); none without a ledger or when not needed.
    async fn read(
        &self,
        periods: &[(Period, String)],
        sources: &[String],
    ) -> Result<HashMap<(String, String), KeyRow>, Error> {
        let Some(store) = self.store.as_ref().filter(|_| self.read_rows) else {
            return Ok(HashMap::new());
        };
        let keys: Vec<KeyRef<'_>> = periods
            .iter()
            .flat_map(|(_, start)| {
                sources.iter().map(move |source| KeyRef {
                    source,
                    period_start: start,
                })
            })
            .collect();
        let spec = &self.pipeline.spec;
        let rows = crate::run::retry(&self.pipeline.retry, "read the ledger", || {
            store.key_rows(&spec.name, &spec.export_type, &keys)
        })
        .await?;
        Ok(rows
            .into_iter()
            .map(|row| {
                (
                    (row.entry.source.clone(), row.entry.period_start.clone()),
                    row,
                )
            })
            .collect())
    }

    /// Per source, the starts of the last `lookback` done periods among the
    /// due ones: read latest first, a few more than needed at a time (rows
    /// of periods that are not due, or no longer a period's start after a
    /// change of granularity or timezone, do not count), until found.
    async fn find_lookback(&self) -> Result<Vec<HashSet<String>>, Error> {
        let want = usize::try_from(self.pipeline.spec.period.lookback).unwrap_or(usize::MAX);
        let mut found = vec![HashSet::new(); self.sources.len()];
        let Some(store) = self.store.as_ref().filter(|_| want > 0) else {
            return Ok(found);
        };
        let spec = &self.pipeline.spec;
        let limit = i64::try_from(want + 16).unwrap_or(i64::MAX);
        for (source, starts) in self.sources.iter().zip(found.iter_mut()) {
            let mut offset = 0;
            'pages: loop {
                let page = crate::run::retry(&self.pipeline.retry, "read the ledger", || {
                    store.done_starts(&spec.name, &spec.export_type, source, limit, offset)
                })
                .await?;
                let full = i64::try_from(page.len()).is_ok_and(|n| n == limit);
                for start in page {
                    if self.is_due_start(&start) {
                        starts.insert(start);
                        if starts.len() == want {
                            break 'pages;
                        }
                    }
                }
                if !full {
                    break;
                }
                offset += limit;
            }
        }
        Ok(found)
    }

    /// Whether `start` (as stored) is the start of one of the due periods.
    fn is_due_start(&self, start: &str) -> bool {
        let (Ok(at), Some(first)) = (
            DateTime::parse_from_rfc3339(start),
            self.pipeline.first_period,
        ) else {
            return false;
        };
        let spec = &self.pipeline.spec.period;
        let period = Period::from_start(spec.granularity, spec.timezone, at.with_timezone(&Utc));
        period.start_rfc3339() == start
            && period.start() >= first.start()
            && self.pipeline.is_due(&period, self.now)
    }
}

fn key(pipeline: &Pipeline, source: &str, period: Period) -> RunKey {
    RunKey::new(
        &pipeline.spec.name,
        source,
        &pipeline.spec.export_type,
        period,
    )
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

/// A ledger row's state in a few words; a marked period says so (`marked
/// skipped: NOTE`): it was never loaded by tidemark, and `sync` leaves it.
pub(crate) fn describe(entry: &LedgerEntry) -> String {
    if let (RunStatus::Done, Some(marked)) = (entry.status, &entry.marked) {
        return format!(
            "marked {marked}: {}",
            entry.mark_note.as_deref().unwrap_or("")
        );
    }
    match (entry.status, &entry.error_class, &entry.finished_at) {
        (RunStatus::Done, _, Some(at)) => format!("done at {at}"),
        (RunStatus::Failed, Some(class), _) => format!("failed: {class}"),
        (status, _, _) => status.to_string(),
    }
}

/// What `sync` does with a due key: `again` says it is one of the last
/// `lookback` done periods; `lift`: a failed key's back-off is lifted.
fn sync_intent(entry: Option<&LedgerEntry>, again: bool, force: bool, lift: bool) -> Intent {
    let done = entry.filter(|e| e.status == RunStatus::Done);
    match (entry, done) {
        (_, Some(_)) if force => Intent::Claim(Some(Forced::Flag)),
        (_, Some(e)) if e.provisional => Intent::Claim(Some(Forced::Provisional)),
        (_, Some(_)) if again => Intent::Claim(Some(Forced::Lookback)),
        (_, Some(e)) => Intent::Leave(describe(e)),
        (None, None) => Intent::Claim(None),
        (Some(e), None) => undone(e, force, lift),
    }
}

/// What `sync` does with a due key that is not done: a failed one runs
/// again once its backoff (`not_before`: 1 min, doubling, at most 24 h) has
/// passed by the database's clock, which stored it (`TIDEMARK_NOW` moves
/// only what is due), so a permanently failing source is not read at every
/// fire; a cancelled one stays out until an operator runs or queues it; a
/// pending or running one is claimed (the claim rules then resume or hold
/// it). `lift` (`sync --now`) runs a failed key whatever its back-off.
fn undone(entry: &LedgerEntry, force: bool, lift: bool) -> Intent {
    match entry.status {
        RunStatus::Failed if !force && !lift && entry.backing_off => Intent::Leave(format!(
            "{}; retried from {} (sync --now runs it now)",
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
            error_class: (status == RunStatus::Failed)
                .then(|| tidemark_core::ErrorClass::Parse.into()),
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
            marked: None,
            mark_note: None,
        }
    }

    #[test]
    fn an_open_period_is_refused_naming_when_it_is_due() {
        let p = pipeline("");
        let day = p.period("2024-01-05").unwrap();
        let before = at("2024-01-06T01:59:59Z");
        let error = refuse_open(&p, PeriodRange::one(day), "--period", before, false).unwrap_err();
        let shown = error.to_string();
        assert!(
            shown.contains("period 2024-01-05 is still open")
                && shown.contains("due at 2024-01-06T02:00:00Z")
                && shown.contains("--allow-open"),
            "{shown}"
        );
        assert_eq!(error.class(), tidemark_core::ErrorClass::Config);
        assert!(refuse_open(&p, PeriodRange::one(day), "--period", before, true).is_ok());
        assert!(refuse_open(
            &p,
            PeriodRange::one(day),
            "--period",
            at("2024-01-06T02:00:00Z"),
            false
        )
        .is_ok());
    }

    #[test]
    fn only_selects_by_ledger_state() {
        let p = pipeline("");
        let entries = [
            Some(entry(&p, "2024-01-01", RunStatus::Done, false)),
            Some(entry(&p, "2024-01-02", RunStatus::Failed, false)),
            None,
        ];
        let intents = |only, force| -> Vec<Intent> {
            entries
                .iter()
                .map(|e| select(only, force, e.as_ref()))
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
        let provisional = entry(&p, "2024-01-01", RunStatus::Done, true);
        let done = entry(&p, "2024-01-02", RunStatus::Done, false);
        assert_eq!(
            sync_intent(Some(&provisional), false, false, false),
            Intent::Claim(Some(Forced::Provisional))
        );
        assert_eq!(
            sync_intent(Some(&done), false, false, false),
            Intent::Leave("done at 2024-01-02T05:00:00.000Z".into())
        );
        assert_eq!(
            sync_intent(Some(&done), true, false, false),
            Intent::Claim(Some(Forced::Lookback))
        );
        assert_eq!(
            sync_intent(Some(&done), true, true, false),
            Intent::Claim(Some(Forced::Flag))
        );
        assert_eq!(sync_intent(None, false, false, false), Intent::Claim(None));
    }

    #[test]
    fn a_range_whose_last_period_is_due_walks_nothing() {
        let p = pipeline("");
        let range = PeriodRange {
            from: p.period("2024-01-01").unwrap(),
            to: p.period("2024-03-01").unwrap(),
        };
        let now = at("2024-03-02T01:00:00Z");
        let error = refuse_open(&p, range, "--to", now, false).unwrap_err();
        assert!(
            error
                .to_string()
                .contains("period 2024-03-01 is still open"),
            "{error}"
        );
        let before = at("2024-02-28T03:00:00Z");
        let error = refuse_open(&p, range, "--to", before, false).unwrap_err();
        assert!(
            error
                .to_string()
                .contains("3 periods are still open, the first 2024-02-28"),
            "{error}"
        );
        assert!(refuse_open(&p, range, "--to", at("2024-03-02T02:00:00Z"), false).is_ok());
    }
}
