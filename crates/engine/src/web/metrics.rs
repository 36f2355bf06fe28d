//! `/metrics`: the Prometheus text exposition, through prometheus-client.
//!
//! The ledger-derived families are read from the database at scrape time
//! ([`tidemark_load::Store::ledger_metrics`], cached for at most
//! [`WebOptions::metrics_max_age`](super::WebOptions)), so runs of other
//! processes and killed runs count. Every family is zero-filled for every
//! configured pipeline and source (and each label value), so a series
//! exists before its first event and `rate()`/`increase()` see it start.
//! No label holds a period, run id, URL or secret: only pipeline and
//! source ids (configuration), fixed state names and worker ids.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::{EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;
use tidemark_core::period::Granularity;
use tidemark_core::{Error, ErrorClass, Pipeline};
use tidemark_load::{
    AttemptGroup, AttemptStatus, LedgerMetrics, Observed, RunStatus, Store, WorkerEntry,
    WorkerState, DURATION_BUCKETS, WAIT_BUCKETS,
};

use super::WebState;
use crate::rate_stats::{rate_stats, RateStat};

/// The content type of the text exposition format.
const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// How long a scrape waits for the database before answering 503.
const SCRAPE_TIMEOUT: Duration = Duration::from_secs(5);

/// The `outcome` values of `tidemark_runs_total`.
const OUTCOMES: [&str; 5] = ["done", "failed", "held", "lease_lost", "interrupted"];

/// The `kind` values of `tidemark_rows_total`.
const ROW_KINDS: [&str; 6] = [
    "read",
    "inserted",
    "updated",
    "unchanged",
    "deleted",
    "rejected",
];

/// What one scrape shows of the ledger.
#[derive(Debug)]
struct Snapshot {
    /// The run keys' state.
    ledger: LedgerMetrics,
    /// Every attempt that ended, grouped.
    attempts: Vec<AttemptGroup>,
}

/// The attempts already counted: every one that ended up to `until`.
#[derive(Debug, Default)]
struct Settled {
    until: Option<String>,
    groups: Vec<AttemptGroup>,
}

/// The ledger as `/metrics` last read it, kept for at most `max_age`, and
/// the attempts counted so far: each refresh reads only the attempts that
/// ended since the last settled mark.
///
/// While someone scrapes, a background task refreshes the snapshot before
/// it is `max_age` old, so a scrape never waits for the ledger's queries
/// (they read every run key's index entry: tens of milliseconds per
/// 100,000 keys); it stops once nobody has scraped for [`IDLE_AFTER`].
/// `max_age` 0 reads the ledger at every scrape.
#[derive(Debug)]
pub(crate) struct MetricsCache {
    max_age: Duration,
    snapshot: Mutex<Option<(Instant, Arc<Snapshot>)>>,
    /// Held by the one refresh under way.
    settled: tokio::sync::Mutex<Settled>,
    last_scrape: Mutex<Instant>,
    refresher: AtomicBool,
}

/// No scrape for this long: the background refresh stops.
const IDLE_AFTER: Duration = Duration::from_secs(120);

fn merge(into: &mut Vec<AttemptGroup>, groups: &[AttemptGroup]) {
    for group in groups {
        match into.iter_mut().find(|g| g.same_group(group)) {
            Some(mine) => mine.add(group),
            None => into.push(group.clone()),
        }
    }
}

impl MetricsCache {
    pub(crate) fn new(max_age: Duration) -> MetricsCache {
        MetricsCache {
            max_age,
            snapshot: Mutex::new(None),
            settled: tokio::sync::Mutex::new(Settled::default()),
            last_scrape: Mutex::new(Instant::now()),
            refresher: AtomicBool::new(false),
        }
    }

    /// The snapshot if younger than `max_age`.
    fn cached(&self) -> Option<Arc<Snapshot>> {
        let snapshot = self.snapshot.lock().unwrap_or_else(PoisonError::into_inner);
        snapshot
            .as_ref()
            .filter(|(at, _)| at.elapsed() < self.max_age)
            .map(|(_, s)| Arc::clone(s))
    }

    /// What a scrape shows: the cached snapshot while it is younger than
    /// `max_age`, else a fresh one (waiting for a refresh under way).
    async fn read(self: &Arc<Self>, store: &Store) -> Result<Arc<Snapshot>, Error> {
        *self
            .last_scrape
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Instant::now();
        if !self.max_age.is_zero() && !self.refresher.swap(true, Ordering::SeqCst) {
            tokio::spawn(Arc::clone(self).keep_fresh(store.clone()));
        }
        if let Some(snapshot) = self.cached() {
            return Ok(snapshot);
        }
        self.refresh(store, true).await
    }

    /// Begins the first read in the background when the server starts: it
    /// counts the whole attempt history once (seconds for 500,000
    /// attempts), which the first scrape would otherwise wait for.
    pub(crate) fn warm(self: &Arc<Self>, store: Store) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let cache = Arc::clone(self);
        runtime.spawn(async move {
            if let Err(e) = cache.refresh(&store, true).await {
                tracing::debug!(error = %e, "cannot read the ledger for /metrics yet");
            }
        });
    }

    /// Refreshes before the snapshot ages past `max_age`, until nobody
    /// has scraped for [`IDLE_AFTER`].
    async fn keep_fresh(self: Arc<Self>, store: Store) {
        loop {
            tokio::time::sleep(self.max_age.mul_f64(0.7)).await;
            let idle = self
                .last_scrape
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .elapsed();
            if idle > IDLE_AFTER {
                self.refresher.store(false, Ordering::SeqCst);
                return;
            }
            if let Err(e) = self.refresh(&store, false).await {
                tracing::debug!(error = %e, "cannot refresh /metrics from the ledger");
            }
        }
    }

    /// Reads the ledger. `reuse`: a snapshot made meanwhile by another
    /// refresh (this one waited for it) is fresh enough.
    async fn refresh(&self, store: &Store, reuse: bool) -> Result<Arc<Snapshot>, Error> {
        let mut settled = self.settled.lock().await;
        if reuse {
            if let Some(snapshot) = self.cached() {
                return Ok(snapshot);
            }
        }
        let ledger = store.ledger_metrics().await?;
        let attempts = attempts(store, &mut settled, &ledger.settled).await?;
        let fresh = Arc::new(Snapshot { ledger, attempts });
        *self.snapshot.lock().unwrap_or_else(PoisonError::into_inner) =
            Some((Instant::now(), Arc::clone(&fresh)));
        Ok(fresh)
    }
}

/// Every attempt that ended: the settled ones (read once, the first time
/// all of them), plus those that ended after `mark`, read again at every
/// refresh until they settle.
async fn attempts(
    store: &Store,
    settled: &mut Settled,
    mark: &str,
) -> Result<Vec<AttemptGroup>, Error> {
    // A database clock that went back never moves the mark back: no
    // attempt is counted twice.
    let advance = settled.until.as_deref().map_or(true, |until| mark > until);
    if advance {
        let newly = store
            .attempt_metrics(settled.until.as_deref(), Some(mark))
            .await?;
        merge(&mut settled.groups, &newly);
        settled.until = Some(mark.to_string());
    }
    let recent = store
        .attempt_metrics(settled.until.as_deref(), None)
        .await?;
    let mut all = settled.groups.clone();
    merge(&mut all, &recent);
    Ok(all)
}

pub(super) async fn metrics(State(state): State<WebState>) -> Response {
    let store = state.view.engine().store();
    let read = async {
        let snapshot = state.metrics.read(store).await?;
        let workers = store.workers().await?;
        Ok::<_, Error>((snapshot, workers))
    };
    let (snapshot, workers) = match tokio::time::timeout(SCRAPE_TIMEOUT, read).await {
        Ok(Ok(read)) => read,
        Ok(Err(e)) => return unavailable(&format!("cannot read the ledger: {e}")),
        Err(_) => return unavailable("the database did not answer within 5 s"),
    };
    let configured = Configured::of(&state.view.pipelines());
    let registry = registry(&configured, &snapshot, &workers, &rate_stats());
    let mut body = String::new();
    match encode(&mut body, &registry) {
        Ok(()) => ([(header::CONTENT_TYPE, CONTENT_TYPE)], body).into_response(),
        Err(_) => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
    }
}

fn unavailable(why: &str) -> Response {
    tracing::warn!(reason = why, "/metrics unavailable");
    (StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n")).into_response()
}

/// One configured pipeline, as the families need it.
struct ConfiguredPipeline {
    sources: Vec<String>,
    period_seconds: f64,
    /// Unix seconds of its first period's start, if it names one.
    first_start: Option<f64>,
}

/// The pipelines this service serves now.
struct Configured(BTreeMap<String, ConfiguredPipeline>);

impl Configured {
    fn of(pipelines: &[Arc<Pipeline>]) -> Configured {
        Configured(
            pipelines
                .iter()
                .map(|p| {
                    let configured = ConfiguredPipeline {
                        sources: p.spec.sources.iter().map(|s| s.id().to_string()).collect(),
                        period_seconds: nominal_seconds(p.spec.period.granularity),
                        first_start: p.first_period.map(|f| unix(f.start().timestamp())),
                    };
                    (p.spec.name.clone(), configured)
                })
                .collect(),
        )
    }

    fn pairs(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0
            .iter()
            .flat_map(|(p, c)| c.sources.iter().map(move |s| (p.as_str(), s.as_str())))
    }
}

#[allow(clippy::cast_precision_loss)] // Unix seconds, far below 2^53
fn unix(seconds: i64) -> f64 {
    seconds as f64
}

#[allow(clippy::cast_precision_loss)] // counts, far below 2^53
fn float(n: u64) -> f64 {
    n as f64
}

/// The nominal length of one period: months and DST days vary, alert rules
/// need one number (a month is the Gregorian average, 30.436875 days).
fn nominal_seconds(granularity: Granularity) -> f64 {
    match granularity {
        Granularity::Hour => 3600.0,
        Granularity::Day => 86_400.0,
        Granularity::Week => 604_800.0,
        Granularity::Month => 2_629_746.0,
    }
}

type Labels = Vec<(&'static str, String)>;

/// A family of series whose values were computed before encoding: the
/// ledger is the state, this is its picture at one scrape.
#[derive(Debug)]
struct Series {
    kind: MetricType,
    /// A histogram's bucket bounds.
    bounds: &'static [f64],
    values: BTreeMap<Labels, Value>,
}

#[derive(Debug, Clone)]
enum Value {
    Number(f64),
    Histogram(Observed),
}

impl Series {
    fn new(kind: MetricType) -> Series {
        Series {
            kind,
            bounds: &[],
            values: BTreeMap::new(),
        }
    }

    fn histogram(bounds: &'static [f64]) -> Series {
        Series {
            bounds,
            ..Series::new(MetricType::Histogram)
        }
    }

    /// Adds `n` to the series (creating it at 0).
    fn add(&mut self, labels: Labels, n: f64) {
        match self.values.entry(labels).or_insert(Value::Number(0.0)) {
            Value::Number(v) => *v += n,
            Value::Histogram(_) => {}
        }
    }

    /// Sets the series to `n`.
    fn set(&mut self, labels: Labels, n: f64) {
        self.values.insert(labels, Value::Number(n));
    }

    /// Adds observations to a histogram series (creating it empty).
    fn observe(&mut self, labels: Labels, observed: &Observed) {
        let empty = Observed {
            buckets: vec![0; self.bounds.len() + 1],
            count: 0,
            sum: 0.0,
        };
        if let Value::Histogram(h) = self.values.entry(labels).or_insert(Value::Histogram(empty)) {
            h.add(observed);
        }
    }
}

impl EncodeMetric for Series {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        for (labels, value) in &self.values {
            let mut series = encoder.encode_family(labels)?;
            match (value, self.kind) {
                (Value::Number(n), MetricType::Counter) => {
                    series.encode_counter::<NoLabelSet, _, f64>(n, None)?;
                }
                (Value::Number(n), _) => series.encode_gauge(n)?,
                (Value::Histogram(h), _) => {
                    let buckets: Vec<(f64, u64)> = self
                        .bounds
                        .iter()
                        .copied()
                        .chain([f64::MAX])
                        .zip(h.buckets.iter().copied())
                        .collect();
                    series.encode_histogram::<NoLabelSet>(h.sum, h.count, &buckets, None)?;
                }
            }
        }
        Ok(())
    }

    fn metric_type(&self) -> MetricType {
        self.kind
    }
}

fn ps(pipeline: &str, source: &str) -> Labels {
    vec![
        ("pipeline", pipeline.to_string()),
        ("source", source.to_string()),
    ]
}

fn ps_with(pipeline: &str, source: &str, name: &'static str, value: &str) -> Labels {
    let mut labels = ps(pipeline, source);
    labels.push((name, value.to_string()));
    labels
}

fn p(pipeline: &str) -> Labels {
    vec![("pipeline", pipeline.to_string())]
}

/// Every `(pipeline, source)` the configuration or the ledger names.
fn all_pairs(configured: &Configured, ledger: &LedgerMetrics) -> BTreeSet<(String, String)> {
    let mut pairs: BTreeSet<(String, String)> = configured
        .pairs()
        .map(|(p, s)| (p.to_string(), s.to_string()))
        .collect();
    pairs.extend(
        ledger
            .periods
            .iter()
            .map(|c| (c.pipeline.clone(), c.source.clone())),
    );
    pairs
}

/// The `outcome` an attempt's end counts as, if it ended.
fn outcome(status: AttemptStatus) -> Option<&'static str> {
    match status {
        AttemptStatus::Running => None,
        AttemptStatus::Done => Some("done"),
        AttemptStatus::Failed => Some("failed"),
        AttemptStatus::Lost => Some("lease_lost"),
        AttemptStatus::Interrupted => Some("interrupted"),
    }
}

/// Why an attempt was a retry: how the attempt before it ended (a done
/// one before it makes it a forced re-run, not a retry).
fn cause(status: AttemptStatus, class: Option<&str>) -> Option<String> {
    match status {
        AttemptStatus::Failed => Some(class.unwrap_or("unknown").to_string()),
        AttemptStatus::Lost => Some("lease_lost".to_string()),
        AttemptStatus::Interrupted => Some("interrupted".to_string()),
        AttemptStatus::Done | AttemptStatus::Running => None,
    }
}

/// The `cause` values of `tidemark_retries_total`.
fn causes() -> impl Iterator<Item = &'static str> {
    ErrorClass::ALL
        .into_iter()
        .map(ErrorClass::as_str)
        .chain(["lease_lost", "interrupted"])
}

fn registry(
    configured: &Configured,
    snapshot: &Snapshot,
    workers: &[WorkerEntry],
    rates: &[RateStat],
) -> Registry {
    let ledger = &snapshot.ledger;
    let pairs = all_pairs(configured, ledger);
    let mut registry = Registry::default();
    let mut build = Series::new(MetricType::Gauge);
    build.set(
        vec![("version", env!("CARGO_PKG_VERSION").to_string())],
        1.0,
    );
    registry.register(
        "tidemark_build_info",
        "tidemark's version (always 1)",
        build,
    );
    runs_and_rows(&mut registry, &pairs, &snapshot.attempts);
    queue(&mut registry, configured, ledger, &snapshot.attempts);
    periods(&mut registry, configured, &pairs, ledger);
    worker_families(&mut registry, workers);
    rate_families(&mut registry, configured, ledger, rates);
    notice_family(&mut registry, configured, ledger);
    registry
}

/// `tidemark_notices`: the outbox's notices by pipeline and delivery state
/// (0 for every configured pipeline, so an alert on `dead` has a series).
fn notice_family(registry: &mut Registry, configured: &Configured, ledger: &LedgerMetrics) {
    let mut notices = Series::new(MetricType::Gauge);
    let labels = |pipeline: &str, status: &str| {
        vec![
            ("pipeline", pipeline.to_string()),
            ("status", status.to_string()),
        ]
    };
    for pipeline in configured.0.keys() {
        for status in ["pending", "sent", "dead"] {
            notices.set(labels(pipeline, status), 0.0);
        }
    }
    for (pipeline, status, n) in &ledger.notices {
        #[allow(clippy::cast_precision_loss)] // counts far below 2^53
        notices.set(labels(pipeline, status), *n as f64);
    }
    registry.register(
        "tidemark_notices",
        "Notices in the outbox by delivery state: pending, sent (until pruned), dead (given up)",
        notices,
    );
}

/// `tidemark_runs_total`, `tidemark_rows_total`, `tidemark_retries_total`
/// and `tidemark_run_duration_seconds`.
fn runs_and_rows(
    registry: &mut Registry,
    pairs: &BTreeSet<(String, String)>,
    attempts: &[AttemptGroup],
) {
    let mut runs = Series::new(MetricType::Counter);
    let mut rows = Series::new(MetricType::Counter);
    let mut retries = Series::new(MetricType::Counter);
    let mut durations = Series::histogram(&DURATION_BUCKETS);
    for (pl, src) in pairs {
        for o in OUTCOMES {
            runs.add(ps_with(pl, src, "outcome", o), 0.0);
        }
        for k in ROW_KINDS {
            rows.add(ps_with(pl, src, "kind", k), 0.0);
        }
        for c in causes() {
            retries.add(ps_with(pl, src, "cause", c), 0.0);
        }
        durations.observe(ps(pl, src), &Observed::default());
    }
    for g in attempts {
        if let Some(o) = outcome(g.status) {
            runs.add(
                ps_with(&g.pipeline, &g.source, "outcome", o),
                float(g.attempts),
            );
        }
        if let Some(c) = g
            .previous
            .and_then(|p| cause(p, g.previous_class.as_deref()))
        {
            retries.add(
                ps_with(&g.pipeline, &g.source, "cause", &c),
                float(g.attempts),
            );
        }
        durations.observe(ps(&g.pipeline, &g.source), &g.duration);
        let c = &g.counts;
        let values = [
            c.rows_read,
            c.rows_inserted,
            c.rows_updated,
            c.rows_unchanged,
            c.rows_deleted,
            c.rows_rejected,
        ];
        for (kind, n) in ROW_KINDS.into_iter().zip(values) {
            rows.add(ps_with(&g.pipeline, &g.source, "kind", kind), float(n));
        }
    }
    registry.register(
        "tidemark_runs",
        "Attempts that ended, by outcome (from the ledger: every process's, killed ones included)",
        runs,
    );
    registry.register(
        "tidemark_rows",
        "Rows of every run that finished (done or failed), by kind",
        rows,
    );
    registry.register(
        "tidemark_retries",
        "Attempts that retried a failed, lost or interrupted one, by how that one ended",
        retries,
    );
    registry.register(
        "tidemark_run_duration_seconds",
        "Run time of the attempts that ended",
        durations,
    );
}

/// `tidemark_queue_pending`, `tidemark_queue_oldest_pending_seconds` and
/// `tidemark_queue_wait_seconds`.
fn queue(
    registry: &mut Registry,
    configured: &Configured,
    ledger: &LedgerMetrics,
    attempts: &[AttemptGroup],
) {
    let mut pending = Series::new(MetricType::Gauge);
    let mut oldest = Series::new(MetricType::Gauge);
    let mut wait = Series::histogram(&WAIT_BUCKETS);
    let pipelines: BTreeSet<&str> = configured
        .0
        .keys()
        .map(String::as_str)
        .chain(ledger.periods.iter().map(|c| c.pipeline.as_str()))
        .collect();
    for pl in pipelines {
        pending.set(p(pl), 0.0);
        oldest.set(p(pl), 0.0);
        wait.observe(p(pl), &Observed::default());
    }
    for q in &ledger.queue {
        pending.set(p(&q.pipeline), float(q.pending));
        let age = q
            .oldest_enqueued
            .map_or(0.0, |at| (ledger.now - at).max(0.0));
        oldest.set(p(&q.pipeline), age);
    }
    for g in attempts {
        wait.observe(p(&g.pipeline), &g.wait);
    }
    registry.register(
        "tidemark_queue_pending",
        "Run keys waiting in the work queue",
        pending,
    );
    registry.register(
        "tidemark_queue_oldest_pending_seconds",
        "Age of the oldest pending key's enqueue (0 when none)",
        oldest,
    );
    registry.register(
        "tidemark_queue_wait_seconds",
        "Time from a key's enqueue to its claim, per attempt claimed from the queue",
        wait,
    );
}

/// `tidemark_periods`, `tidemark_freshness_seconds` and
/// `tidemark_period_length_seconds`.
fn periods(
    registry: &mut Registry,
    configured: &Configured,
    pairs: &BTreeSet<(String, String)>,
    ledger: &LedgerMetrics,
) {
    let mut periods = Series::new(MetricType::Gauge);
    for (pl, src) in pairs {
        for status in RunStatus::ALL {
            periods.set(ps_with(pl, src, "status", status.as_str()), 0.0);
        }
    }
    for c in &ledger.periods {
        periods.add(
            ps_with(&c.pipeline, &c.source, "status", c.status.as_str()),
            float(c.keys),
        );
    }
    let mut freshness = Series::new(MetricType::Gauge);
    // Nothing done yet: as stale as the first period's start.
    for (pl, src) in configured.pairs() {
        if let Some(first) = configured.0.get(pl).and_then(|c| c.first_start) {
            freshness.set(ps(pl, src), (ledger.now - first).max(0.0));
        }
    }
    for f in &ledger.freshness {
        freshness.set(
            ps(&f.pipeline, &f.source),
            (ledger.now - f.done_through).max(0.0),
        );
    }
    let mut length = Series::new(MetricType::Gauge);
    for (pl, c) in &configured.0 {
        length.set(p(pl), c.period_seconds);
    }
    registry.register(
        "tidemark_periods",
        "Run keys in the ledger, by state",
        periods,
    );
    registry.register(
        "tidemark_freshness_seconds",
        "Now minus the end of the newest period up to which every recorded period is done",
        freshness,
    );
    registry.register(
        "tidemark_period_length_seconds",
        "Nominal length of one period of the pipeline",
        length,
    );
}

/// `tidemark_workers` and `tidemark_worker_last_seen_timestamp_seconds`.
fn worker_families(registry: &mut Registry, workers: &[WorkerEntry]) {
    let mut states = Series::new(MetricType::Gauge);
    let mut last_seen = Series::new(MetricType::Gauge);
    for state in [WorkerState::Live, WorkerState::Dead] {
        states.set(vec![("state", state.as_str().to_string())], 0.0);
    }
    for w in workers.iter().filter(|w| w.state != WorkerState::Stopped) {
        states.add(vec![("state", w.state.as_str().to_string())], 1.0);
        last_seen.set(vec![("worker", w.worker.clone())], w.last_seen_unix);
    }
    registry.register(
        "tidemark_workers",
        "Workers in the ledger not stopped, live or dead (silent past their lease)",
        states,
    );
    registry.register(
        "tidemark_worker_last_seen_timestamp_seconds",
        "When each worker not stopped last renewed its presence (Unix seconds)",
        last_seen,
    );
}

/// `tidemark_rate_limit_wait_seconds_total` and `tidemark_rate_limit_paused`.
fn rate_families(
    registry: &mut Registry,
    configured: &Configured,
    ledger: &LedgerMetrics,
    rates: &[RateStat],
) {
    let mut waited = Series::new(MetricType::Counter);
    let mut paused = Series::new(MetricType::Gauge);
    for (pl, src) in configured.pairs() {
        waited.add(ps(pl, src), 0.0);
        paused.set(ps(pl, src), 0.0);
    }
    for r in rates {
        waited.add(ps(&r.pipeline, &r.source), r.waited_seconds);
        if r.paused {
            paused.set(ps(&r.pipeline, &r.source), 1.0);
        }
    }
    for (pl, src) in &ledger.paused {
        paused.set(ps(pl, src), 1.0);
    }
    registry.register(
        "tidemark_rate_limit_wait_seconds",
        "Seconds this process's requests waited for their source's rate limit",
        waited,
    );
    registry.register(
        "tidemark_rate_limit_paused",
        "1 while the source asked to be left alone (Retry-After), else 0",
        paused,
    );
}
