//! What `/metrics` reads from the ledger at scrape time: aggregates over
//! `_tm_runs` and `_tm_attempts`, so the runs of every process count,
//! killed ones included (a process cannot report its own SIGKILL).
//!
//! The state of the run keys (periods by state, the queue, freshness) is
//! read whole at each scrape, from indexes. Attempts only grow, and a
//! scraper reads them by when they ended ([`attempts_between`]): once up to
//! a settled mark, then only what ended since, so a scrape does not read
//! the whole history again. Nothing is grouped by period or run id: the
//! result grows with pipelines and sources, never with periods.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use tidemark_core::Error;

use super::driver::{Arg, Dialect, Driver, LedgerTx, Record};
use super::workers::unix_seconds;
use super::{AttemptStatus, Counts, RunStatus};

/// Upper bounds (seconds) of `tidemark_run_duration_seconds`' buckets.
pub const DURATION_BUCKETS: [f64; 10] = [
    1.0, 5.0, 15.0, 30.0, 60.0, 300.0, 900.0, 1800.0, 3600.0, 14400.0,
];

/// Upper bounds (seconds) of `tidemark_queue_wait_seconds`' buckets.
pub const WAIT_BUCKETS: [f64; 9] = [
    1.0, 10.0, 60.0, 300.0, 900.0, 3600.0, 14400.0, 43200.0, 86400.0,
];

/// Observations of a histogram: per bucket (non-cumulative, the last one
/// past every bound), their count and sum.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Observed {
    /// Observations in each bucket: `bounds.len() + 1` entries.
    pub buckets: Vec<u64>,
    /// How many.
    pub count: u64,
    /// Their sum.
    pub sum: f64,
}

impl Observed {
    /// Adds `other`'s observations (same bounds).
    pub fn add(&mut self, other: &Observed) {
        if self.buckets.len() < other.buckets.len() {
            self.buckets.resize(other.buckets.len(), 0);
        }
        for (mine, theirs) in self.buckets.iter_mut().zip(&other.buckets) {
            *mine += theirs;
        }
        self.count += other.count;
        self.sum += other.sum;
    }
}

/// Run keys of one pipeline and source in one state (one entry per export
/// type: a reader sums them).
#[derive(Debug, Clone)]
pub struct PeriodCount {
    /// Pipeline.
    pub pipeline: String,
    /// Source id.
    pub source: String,
    /// The run keys' state.
    pub status: RunStatus,
    /// How many.
    pub keys: u64,
}

/// Attempts of one pipeline and source that ended alike, and what the
/// attempt before each (of the same run key) was, when there was one.
#[derive(Debug, Clone, PartialEq)]
pub struct AttemptGroup {
    /// Pipeline.
    pub pipeline: String,
    /// Source id.
    pub source: String,
    /// How they ended.
    pub status: AttemptStatus,
    /// How the attempt before each ended (`None`: a first attempt, or the
    /// one before was pruned): a retry of a failed, lost or interrupted one.
    pub previous: Option<AttemptStatus>,
    /// The failure class of that previous attempt, when it failed.
    pub previous_class: Option<String>,
    /// How many (marks did not run, and are left out).
    pub attempts: u64,
    /// The row counts of the runs they finished (`done` or `failed`
    /// attempts: their counts are the run's, resumed batches included, so
    /// an interrupted attempt's are counted by the one that finished it).
    pub counts: Counts,
    /// Their run time.
    pub duration: Observed,
    /// Queue wait (enqueue to claim) of the ones claimed from the queue.
    pub wait: Observed,
}

impl AttemptGroup {
    /// Whether `other` is the same group (all but the numbers alike).
    pub fn same_group(&self, other: &AttemptGroup) -> bool {
        self.pipeline == other.pipeline
            && self.source == other.source
            && self.status == other.status
            && self.previous == other.previous
            && self.previous_class == other.previous_class
    }

    /// Adds `other`'s numbers.
    pub fn add(&mut self, other: &AttemptGroup) {
        self.attempts += other.attempts;
        let c = &mut self.counts;
        let o = &other.counts;
        c.rows_read += o.rows_read;
        c.rows_inserted += o.rows_inserted;
        c.rows_updated += o.rows_updated;
        c.rows_unchanged += o.rows_unchanged;
        c.rows_deleted += o.rows_deleted;
        c.rows_rejected += o.rows_rejected;
        self.duration.add(&other.duration);
        self.wait.add(&other.wait);
    }
}

/// The work queue of one pipeline.
#[derive(Debug, Clone)]
pub struct QueueDepth {
    /// Pipeline.
    pub pipeline: String,
    /// Keys pending.
    pub pending: u64,
    /// Unix seconds of the oldest pending key's enqueue, if known.
    pub oldest_enqueued: Option<f64>,
}

/// How far one pipeline and source is done without a gap.
#[derive(Debug, Clone)]
pub struct Freshness {
    /// Pipeline.
    pub pipeline: String,
    /// Source id.
    pub source: String,
    /// Unix seconds of the end of the newest period up to which every
    /// recorded period is done.
    pub done_through: f64,
}

/// The ledger's state for `/metrics`, as of `now` (the database's clock,
/// in Unix seconds). Attempts are read apart, by when they ended
/// (`attempts_between`), so a scraper reads each one once.
#[derive(Debug, Clone, Default)]
pub struct LedgerMetrics {
    /// The database's clock when read.
    pub now: f64,
    /// The database's clock a settling margin ago, as the ledger stores
    /// times: attempts that ended up to it are final (see
    /// [`SETTLE_MARGIN_SECONDS`]).
    pub settled: String,
    /// `tidemark_periods`.
    pub periods: Vec<PeriodCount>,
    /// `tidemark_queue_pending`, `tidemark_queue_oldest_pending_seconds`.
    pub queue: Vec<QueueDepth>,
    /// `tidemark_freshness_seconds`.
    pub freshness: Vec<Freshness>,
    /// Sources whose shared rate bucket is paused now (`Retry-After`), as
    /// `(pipeline, source)`: PostgreSQL's `_tm_rate_buckets`; SQLite keeps
    /// its buckets in the one process that owns the file.
    pub paused: Vec<(String, String)>,
    /// `tidemark_notices`: the outbox's notices as `(pipeline, status,
    /// count)` (docs/ledger.md "Notices").
    pub notices: Vec<(String, String, u64)>,
}

/// How long after its end an attempt's row is taken as final for counting:
/// longer than any transaction that stamps `finished_at` stays open, so no
/// attempt that ended before the mark can still appear behind it.
pub const SETTLE_MARGIN_SECONDS: f64 = 60.0;

/// `SUM(CASE WHEN expr <= bound ...)` for each bound: cumulative counts.
fn bucket_sums(expr: &str, bounds: &[f64], prefix: &str) -> String {
    bounds
        .iter()
        .enumerate()
        .map(|(i, b)| {
            format!(
                "CAST(SUM(CASE WHEN {expr} <= {b:?} THEN 1 ELSE 0 END) AS BIGINT) AS {prefix}{i}"
            )
        })
        .collect::<Vec<_>>()
        .join(",\n       ")
}

/// In the order of the index `_tm_runs_metrics`, so it is read once,
/// in order, and never sorted (export types are summed by the reader).
fn periods_sql() -> String {
    "SELECT pipeline, source, export_type, status, COUNT(*) AS n FROM _tm_runs
     GROUP BY status, pipeline, source, export_type"
        .to_string()
}

/// A stored time bound given as the ledger's own text.
fn stamp(d: Dialect, param: &str) -> String {
    match d {
        Dialect::Postgres => format!("CAST({param} AS TIMESTAMPTZ)"),
        Dialect::Sqlite => param.to_string(),
    }
}

/// Attempts that ended after the lower bound and up to the upper one
/// (each a parameter when given, `$1` first), grouped. A statement per
/// shape, so each plans as a range of the `finished_at` index.
fn attempts_sql(d: Dialect, lower: bool, upper: bool) -> String {
    let duration = format!(
        "{} - {}",
        unix_seconds(d, "a.finished_at"),
        unix_seconds(d, "a.started_at")
    );
    let wait = format!(
        "CASE WHEN a.queued_at IS NOT NULL THEN {} - {} END",
        unix_seconds(d, "a.started_at"),
        unix_seconds(d, "a.queued_at")
    );
    let finishing = format!(
        "a.status IN ('{}', '{}')",
        AttemptStatus::Done.as_str(),
        AttemptStatus::Failed.as_str()
    );
    let sums = Counts::COLUMNS[..6]
        .iter()
        .map(|c| format!("CAST(SUM(CASE WHEN {finishing} THEN a.{c} ELSE 0 END) AS BIGINT) AS {c}"))
        .collect::<Vec<_>>()
        .join(", ");
    let mut bounds = String::new();
    if lower {
        bounds.push_str(&format!(" AND a.finished_at > {}", stamp(d, "$1")));
    }
    if upper {
        let param = if lower { "$2" } else { "$1" };
        bounds.push_str(&format!(" AND a.finished_at <= {}", stamp(d, param)));
    }
    format!(
        "SELECT r.pipeline AS pipeline, r.source AS source, a.status AS status,
                p.status AS previous, p.error_class AS previous_class,
                COUNT(*) AS n, {sums},
                COUNT(*) AS duration_n,
                CAST(COALESCE(SUM({duration}), 0) AS DOUBLE PRECISION) AS duration_sum,
                {duration_buckets},
                COUNT({wait}) AS wait_n,
                CAST(COALESCE(SUM({wait}), 0) AS DOUBLE PRECISION) AS wait_sum,
                {wait_buckets}
         FROM _tm_attempts AS a
         JOIN _tm_runs AS r ON r.id = a.run_ref
         LEFT JOIN _tm_attempts AS p ON p.run_ref = a.run_ref AND p.attempt = a.attempt - 1
         WHERE a.finished_at IS NOT NULL AND a.marked IS NULL{bounds}
         GROUP BY r.pipeline, r.source, a.status, p.status, p.error_class",
        duration_buckets = bucket_sums(&duration, &DURATION_BUCKETS, "d"),
        wait_buckets = bucket_sums(&wait, &WAIT_BUCKETS, "w"),
    )
}

fn queue_sql(d: Dialect) -> String {
    format!(
        "SELECT pipeline, COUNT(*) AS n, MIN({oldest}) AS oldest
         FROM _tm_runs WHERE status = '{pending}' GROUP BY pipeline",
        oldest = unix_seconds(d, "enqueued_at"),
        pending = RunStatus::Pending.as_str(),
    )
}

/// The first period not done of each pipeline, source and export type:
/// from the partial index over the few keys not done.
fn first_open_sql() -> String {
    format!(
        "SELECT pipeline, source, export_type, MIN(period_start) AS first_open
         FROM _tm_runs WHERE status <> '{}' GROUP BY pipeline, source, export_type",
        RunStatus::Done.as_str()
    )
}

/// The end of the newest done period before `$4` (none: of all), of one
/// pipeline `$1`, source `$2` and export type `$3`: one look-up in the run
/// key's unique index. Period starts compare as the ledger's text, which
/// sorts in time for one pipeline (its fixed timezone), but for the hour
/// a DST fall-back repeats.
fn done_through_sql(d: Dialect, before: bool) -> String {
    let before = if before { " AND period_start < $4" } else { "" };
    format!(
        "SELECT {end} AS done_through FROM _tm_runs
         WHERE pipeline = $1 AND source = $2 AND export_type = $3{before}
         ORDER BY period_start DESC LIMIT 1",
        end = unix_seconds(d, "period_end"),
    )
}

fn clock_sql(d: Dialect) -> String {
    format!(
        "SELECT {now} AS now, {settled} AS settled",
        now = unix_seconds(d, d.now()),
        settled = d.now_minus_secs(&format!("{SETTLE_MARGIN_SECONDS:?}")),
    )
}

/// Reads the ledger's state (everything but the attempts).
pub(crate) async fn ledger_metrics<D: Driver>(driver: &D) -> Result<LedgerMetrics, Error> {
    let d = D::DIALECT;
    let mut m = LedgerMetrics::default();
    let mut tx = driver.begin_read().await?;
    tx.fetch_each(&clock_sql(d), &[], |row| {
        m.now = row.float("now")?;
        m.settled = row.text("settled")?;
        Ok(())
    })
    .await?;
    let mut keys = BTreeSet::new();
    tx.fetch_each(&periods_sql(), &[], |row| {
        keys.insert((
            row.text("pipeline")?,
            row.text("source")?,
            row.text("export_type")?,
        ));
        m.periods.push(PeriodCount {
            pipeline: row.text("pipeline")?,
            source: row.text("source")?,
            status: row.state("status")?,
            keys: count(&row, "n")?,
        });
        Ok(())
    })
    .await?;
    tx.fetch_each(&queue_sql(d), &[], |row| {
        m.queue.push(QueueDepth {
            pipeline: row.text("pipeline")?,
            pending: count(&row, "n")?,
            oldest_enqueued: row.opt_float("oldest")?,
        });
        Ok(())
    })
    .await?;
    m.freshness = freshness::<D>(&mut tx, keys).await?;
    if d == Dialect::Postgres {
        let paused = "SELECT pipeline, source FROM _tm_rate_buckets WHERE paused_until > now()";
        tx.fetch_each(paused, &[], |row| {
            m.paused.push((row.text("pipeline")?, row.text("source")?));
            Ok(())
        })
        .await?;
    }
    let notices =
        "SELECT pipeline, status, COUNT(*) AS n FROM _tm_notices GROUP BY pipeline, status";
    tx.fetch_each(notices, &[], |row| {
        m.notices.push((
            row.text("pipeline")?,
            row.text("status")?,
            count(&row, "n")?,
        ));
        Ok(())
    })
    .await?;
    tx.commit().await?;
    Ok(m)
}

/// Per pipeline and source, the newest period up to which every recorded
/// one is done (the latest over its export types); `keys` are the
/// pipeline, source and export type of every run key.
async fn freshness<D: Driver>(
    tx: &mut D::Tx,
    keys: BTreeSet<(String, String, String)>,
) -> Result<Vec<Freshness>, Error> {
    let mut first_open: HashMap<(String, String, String), String> = HashMap::new();
    tx.fetch_each(&first_open_sql(), &[], |row| {
        let key = (
            row.text("pipeline")?,
            row.text("source")?,
            row.text("export_type")?,
        );
        first_open.insert(key, row.text("first_open")?);
        Ok(())
    })
    .await?;
    let (bounded, unbounded) = (
        done_through_sql(D::DIALECT, true),
        done_through_sql(D::DIALECT, false),
    );
    let mut newest: BTreeMap<(String, String), f64> = BTreeMap::new();
    for key in keys {
        let (pipeline, source, export_type) = &key;
        let before = first_open.get(&key).map(String::as_str);
        let args = [
            Arg::Text(pipeline),
            Arg::Text(source),
            Arg::Text(export_type),
            Arg::OptText(before),
        ];
        let (sql, args) = match before {
            Some(_) => (&bounded, &args[..]),
            None => (&unbounded, &args[..3]),
        };
        let mut through = None;
        tx.fetch_each(sql, args, |row| {
            through = row.opt_float("done_through")?;
            Ok(())
        })
        .await?;
        if let Some(through) = through {
            let entry = newest
                .entry((pipeline.clone(), source.clone()))
                .or_insert(through);
            *entry = entry.max(through);
        }
    }
    Ok(newest
        .into_iter()
        .map(|((pipeline, source), done_through)| Freshness {
            pipeline,
            source,
            done_through,
        })
        .collect())
}

/// The attempts that ended after `after` (`None`: from the first) and up
/// to `until` (`None`: to the last), both the ledger's own time text
/// ([`LedgerMetrics::settled`]), grouped.
pub(crate) async fn attempts_between<D: Driver>(
    driver: &D,
    after: Option<&str>,
    until: Option<&str>,
) -> Result<Vec<AttemptGroup>, Error> {
    let sql = attempts_sql(D::DIALECT, after.is_some(), until.is_some());
    let args: Vec<Arg<'_>> = after.into_iter().chain(until).map(Arg::Text).collect();
    let mut groups = Vec::new();
    let mut tx = driver.begin_read().await?;
    tx.fetch_each(&sql, &args, |row| {
        groups.push(attempt_group(&row)?);
        Ok(())
    })
    .await?;
    tx.commit().await?;
    Ok(groups)
}

fn count(row: &Record, name: &str) -> Result<u64, Error> {
    Ok(u64::try_from(row.opt_int(name)?.unwrap_or(0)).unwrap_or(0))
}

/// Cumulative bucket columns `{letter}0..` plus the total `{prefix}_n` and
/// `{prefix}_sum`, as non-cumulative buckets.
fn observed(row: &Record, prefix: &str, letter: &str, bounds: usize) -> Result<Observed, Error> {
    let total = count(row, &format!("{prefix}_n"))?;
    let mut buckets = Vec::with_capacity(bounds + 1);
    let mut below = 0;
    for i in 0..bounds {
        let cumulative = count(row, &format!("{letter}{i}"))?;
        buckets.push(cumulative.saturating_sub(below));
        below = below.max(cumulative);
    }
    buckets.push(total.saturating_sub(below));
    Ok(Observed {
        buckets,
        count: total,
        sum: row.opt_float(&format!("{prefix}_sum"))?.unwrap_or(0.0),
    })
}

fn attempt_group(row: &Record) -> Result<AttemptGroup, Error> {
    let mut values = [None; Counts::COLUMNS.len()];
    for (value, column) in values.iter_mut().zip(&Counts::COLUMNS[..6]) {
        *value = row.opt_int(column)?;
    }
    let previous = row
        .opt_text("previous")?
        .map(|s| s.parse().map_err(|e: super::UnknownState| corrupt(&e)))
        .transpose()?;
    Ok(AttemptGroup {
        pipeline: row.text("pipeline")?,
        source: row.text("source")?,
        status: row.state("status")?,
        previous,
        previous_class: row.opt_text("previous_class")?,
        attempts: count(row, "n")?,
        counts: Counts::from_values(values),
        duration: observed(row, "duration", "d", DURATION_BUCKETS.len())?,
        wait: observed(row, "wait", "w", WAIT_BUCKETS.len())?,
    })
}

fn corrupt(e: &super::UnknownState) -> Error {
    Error::Database {
        message: format!("ledger column `status` of an attempt holds an {e}"),
        transient: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_are_made_non_cumulative() {
        let mut total = Observed {
            buckets: vec![1, 0, 2],
            count: 3,
            sum: 4.0,
        };
        total.add(&Observed {
            buckets: vec![0, 1, 0],
            count: 1,
            sum: 1.5,
        });
        assert_eq!(total.buckets, vec![1, 1, 2]);
        assert_eq!(total.count, 4);
    }
}
