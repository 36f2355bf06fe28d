//! What `/metrics` reads from the ledger at scrape time: aggregates over
//! `_tm_runs` and `_tm_attempts`, so the runs of every process count,
//! killed ones included (a process cannot report its own SIGKILL). Each
//! family is one grouped query; all run in one read transaction, so the
//! families agree with each other. Nothing is grouped by period or run id:
//! the result grows with pipelines and sources, never with periods.

use tidemark_core::Error;

use super::driver::{Dialect, Driver, LedgerTx, Record};
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

/// Run keys of one pipeline and source in one state.
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

/// The row counts of one pipeline and source: the sums over its run keys'
/// current runs (`_tm_runs`).
#[derive(Debug, Clone)]
pub struct RowSums {
    /// Pipeline.
    pub pipeline: String,
    /// Source id.
    pub source: String,
    /// The sums (`rows_expected` unused).
    pub counts: Counts,
}

/// Attempts of one pipeline and source alike in how they ended.
#[derive(Debug, Clone)]
pub struct AttemptGroup {
    /// Pipeline.
    pub pipeline: String,
    /// Source id.
    pub source: String,
    /// How they ended (or `running`).
    pub status: AttemptStatus,
    /// The failure class of failed ones.
    pub error_class: Option<String>,
    /// A later attempt of the same run key exists: each was retried.
    pub retried: bool,
    /// How many (marks are not attempts that ran, and are left out).
    pub attempts: u64,
    /// The run time of the finished ones.
    pub duration: Observed,
    /// Queue wait (enqueue to claim) of the ones claimed from the queue.
    pub wait: Observed,
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

/// Everything `/metrics` reads from the ledger, as of `now` (the
/// database's clock, in Unix seconds).
#[derive(Debug, Clone, Default)]
pub struct LedgerMetrics {
    /// The database's clock when read.
    pub now: f64,
    /// `tidemark_periods`.
    pub periods: Vec<PeriodCount>,
    /// `tidemark_rows_total`.
    pub rows: Vec<RowSums>,
    /// `tidemark_runs_total`, `tidemark_retries_total`, the durations and
    /// queue waits.
    pub attempts: Vec<AttemptGroup>,
    /// `tidemark_queue_pending`, `tidemark_queue_oldest_pending_seconds`.
    pub queue: Vec<QueueDepth>,
    /// `tidemark_freshness_seconds`.
    pub freshness: Vec<Freshness>,
    /// Sources whose shared rate bucket is paused now (`Retry-After`), as
    /// `(pipeline, source)`: PostgreSQL's `_tm_rate_buckets`; SQLite keeps
    /// its buckets in the one process that owns the file.
    pub paused: Vec<(String, String)>,
}

/// `SUM(CASE WHEN expr <= bound ...)` for each bound: cumulative counts.
fn bucket_sums(expr: &str, bounds: &[f64], prefix: &str) -> String {
    bounds
        .iter()
        .enumerate()
        .map(|(i, b)| {
            format!("CAST(SUM(CASE WHEN {expr} <= {b:?} THEN 1 ELSE 0 END) AS BIGINT) AS {prefix}{i}")
        })
        .collect::<Vec<_>>()
        .join(",\n       ")
}

fn periods_sql() -> String {
    "SELECT pipeline, source, status, COUNT(*) AS n FROM _tm_runs GROUP BY pipeline, source, status"
        .to_string()
}

fn rows_sql() -> String {
    let sums = Counts::COLUMNS[..6]
        .iter()
        .map(|c| format!("CAST(SUM({c}) AS BIGINT) AS {c}"))
        .collect::<Vec<_>>()
        .join(", ");
    format!("SELECT pipeline, source, {sums} FROM _tm_runs GROUP BY pipeline, source")
}

fn attempts_sql(d: Dialect) -> String {
    let duration = format!(
        "CASE WHEN finished_at IS NOT NULL THEN {} - {} END",
        unix_seconds(d, "finished_at"),
        unix_seconds(d, "started_at")
    );
    let wait = format!(
        "CASE WHEN queued_at IS NOT NULL THEN {} - {} END",
        unix_seconds(d, "started_at"),
        unix_seconds(d, "queued_at")
    );
    format!(
        "SELECT r.pipeline AS pipeline, r.source AS source, a.status AS status,
                a.error_class AS error_class,
                CAST(CASE WHEN a.attempt < r.attempt THEN 1 ELSE 0 END AS BIGINT) AS retried,
                COUNT(*) AS n,
                COUNT(a.duration) AS duration_n,
                CAST(COALESCE(SUM(a.duration), 0) AS DOUBLE PRECISION) AS duration_sum,
                {duration_buckets},
                COUNT(a.wait) AS wait_n,
                CAST(COALESCE(SUM(a.wait), 0) AS DOUBLE PRECISION) AS wait_sum,
                {wait_buckets}
         FROM (SELECT run_ref, attempt, status, error_class,
                      {duration} AS duration, {wait} AS wait
               FROM _tm_attempts WHERE marked IS NULL) AS a
         JOIN _tm_runs AS r ON r.id = a.run_ref
         GROUP BY r.pipeline, r.source, a.status, a.error_class,
                  CASE WHEN a.attempt < r.attempt THEN 1 ELSE 0 END",
        duration_buckets = bucket_sums("a.duration", &DURATION_BUCKETS, "d"),
        wait_buckets = bucket_sums("a.wait", &WAIT_BUCKETS, "w"),
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

fn freshness_sql(d: Dialect) -> String {
    format!(
        "WITH open_keys AS (
             SELECT pipeline, source, MIN({start}) AS first_open
             FROM _tm_runs WHERE status <> '{done}' GROUP BY pipeline, source)
         SELECT r.pipeline AS pipeline, r.source AS source, MAX({end}) AS done_through
         FROM _tm_runs AS r
         LEFT JOIN open_keys AS o ON o.pipeline = r.pipeline AND o.source = r.source
         WHERE r.status = '{done}' AND (o.first_open IS NULL OR {r_start} < o.first_open)
         GROUP BY r.pipeline, r.source",
        start = d.instant("period_start"),
        r_start = d.instant("r.period_start"),
        end = unix_seconds(d, "r.period_end"),
        done = RunStatus::Done.as_str(),
    )
}

fn now_sql(d: Dialect) -> String {
    format!("SELECT {} AS now", unix_seconds(d, d.now()))
}

/// Reads every family.
pub(crate) async fn ledger_metrics<D: Driver>(driver: &D) -> Result<LedgerMetrics, Error> {
    let d = D::DIALECT;
    let mut m = LedgerMetrics::default();
    let mut tx = driver.begin_read().await?;
    tx.fetch_each(&now_sql(d), &[], |row| {
        m.now = row.float("now")?;
        Ok(())
    })
    .await?;
    tx.fetch_each(&periods_sql(), &[], |row| {
        m.periods.push(PeriodCount {
            pipeline: row.text("pipeline")?,
            source: row.text("source")?,
            status: row.state("status")?,
            keys: count(&row, "n")?,
        });
        Ok(())
    })
    .await?;
    tx.fetch_each(&rows_sql(), &[], |row| {
        m.rows.push(row_sums(&row)?);
        Ok(())
    })
    .await?;
    tx.fetch_each(&attempts_sql(d), &[], |row| {
        m.attempts.push(attempt_group(&row)?);
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
    tx.fetch_each(&freshness_sql(d), &[], |row| {
        if let Some(done_through) = row.opt_float("done_through")? {
            m.freshness.push(Freshness {
                pipeline: row.text("pipeline")?,
                source: row.text("source")?,
                done_through,
            });
        }
        Ok(())
    })
    .await?;
    if d == Dialect::Postgres {
        let paused = "SELECT pipeline, source FROM _tm_rate_buckets WHERE paused_until > now()";
        tx.fetch_each(paused, &[], |row| {
            m.paused.push((row.text("pipeline")?, row.text("source")?));
            Ok(())
        })
        .await?;
    }
    tx.commit().await?;
    Ok(m)
}

fn count(row: &Record, name: &str) -> Result<u64, Error> {
    Ok(u64::try_from(row.opt_int(name)?.unwrap_or(0)).unwrap_or(0))
}

fn row_sums(row: &Record) -> Result<RowSums, Error> {
    let mut values = [None; Counts::COLUMNS.len()];
    for (value, column) in values.iter_mut().zip(&Counts::COLUMNS[..6]) {
        *value = row.opt_int(column)?;
    }
    Ok(RowSums {
        pipeline: row.text("pipeline")?,
        source: row.text("source")?,
        counts: Counts::from_values(values),
    })
}

/// Cumulative bucket columns `{prefix}0..` plus the total `n` and `sum`,
/// as non-cumulative buckets.
fn observed(row: &Record, prefix: &str, bounds: usize) -> Result<Observed, Error> {
    let total = count(row, &format!("{prefix}_n"))?;
    let mut buckets = Vec::with_capacity(bounds + 1);
    let mut below = 0;
    for i in 0..bounds {
        let cumulative = count(row, &format!("{}{i}", &prefix[..1]))?;
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
    Ok(AttemptGroup {
        pipeline: row.text("pipeline")?,
        source: row.text("source")?,
        status: row.state("status")?,
        error_class: row.opt_text("error_class")?,
        retried: row.int("retried")? != 0,
        attempts: count(row, "n")?,
        duration: observed(row, "duration", DURATION_BUCKETS.len())?,
        wait: observed(row, "wait", WAIT_BUCKETS.len())?,
    })
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
