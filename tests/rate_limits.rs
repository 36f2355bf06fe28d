//! Issue 12, step 4 (test 8): a source's `rate_limit` holds for every
//! process reading it. On PostgreSQL that is one bucket row in the ledger
//! database shared by three processes; a `429 Retry-After` from the source
//! pauses every one of them. On SQLite one process owns the file and its
//! in-process bucket does the same for its concurrent periods.
//!
//! The fake API (`tests/http/api.rs`) logs each request's arrival time; the
//! assertions are about those times, as the source sees them.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::http::api::{Api, Fault, Hit};
use crate::support::{Backend, Env, Out};

const PER_SECOND: usize = 4;
const BURST: usize = 1;
/// Records per day: fewer than a page, so each period is one request.
const RECORDS: usize = 5;

/// Arrival times carry a little scheduling and network jitter on top of
/// the bucket's pacing (the token is granted, then the request travels),
/// so a window is one second less this tolerance. Measured: the first
/// requests after a Retry-After pause arrived up to 110 ms after their
/// grants (two granted at the pause's end arrived together 0.11 s later,
/// the next one on time), on an idle 2-core machine. A window of 0.85 s
/// still holds at most 5 grants of a shared 4/s bucket with burst 1 (3
/// intervals of 0.25 s plus the burst), against 15 for three unshared ones.
const JITTER: Duration = Duration::from_millis(150);

/// The fake API; started off the test's runtime (it blocks on its own).
fn start_api() -> Api {
    std::thread::spawn(|| Api::start(|_| RECORDS, None))
        .join()
        .expect("the fake API starts")
}

fn pipeline(api: &Api) -> String {
    format!(
        r#"name = "orders"
export_type = "orders_daily"

[period]
granularity = "day"

[[sources]]
id = "api"
transport = "http"
url = "{base}/page"
format = "json"
query = {{ day = "{{period.start:%Y-%m-%d}}" }}
records = "/data"
pagination = {{ style = "page", size_param = "per_page", size = 10 }}
rate_limit = {{ per_second = {PER_SECOND}, burst = {BURST} }}

[fields]
id = {{ type = "text", required = true }}
day = {{ type = "date" }}
amount = {{ type = "decimal" }}

[load]
table = "orders"
key = ["id"]

[retry]
max_attempts = 6
base_delay = "10ms"
max_delay = "5s"
"#,
        base = api.base
    )
}

/// A working folder with the pipeline, its database migrated and the
/// destination table created (so the processes under test only read).
async fn setup(backend: Backend, api: &Api) -> Env {
    let env = Env::new(backend).await;
    env.write("pipelines/orders.toml", &pipeline(api));
    env.tidemark(&["migrate"]).expect_code(0, "migrate");
    env
}

/// `backfill` of April 2024's days `from..=to` in `processes` processes at
/// once, splitting the days evenly; every process must exit 0.
fn backfill_in(env: &Env, processes: usize, days: usize, extra: &[&str]) -> Vec<Out> {
    let per = days / processes;
    let running: Vec<_> = (0..processes)
        .map(|p| {
            let from = format!("2024-04-{:02}", p * per + 1);
            let to = format!("2024-04-{:02}", (p + 1) * per);
            let mut args = vec!["backfill", "orders", "--from", &from, "--to", &to];
            args.extend_from_slice(extra);
            env.spawn(&args)
        })
        .collect();
    running
        .into_iter()
        .map(|r| {
            let out = r.finish(Duration::from_secs(60));
            out.expect_code(0, "backfill under a shared rate limit");
            out
        })
        .collect()
}

/// The most requests that arrived within any one second.
fn busiest_second(hits: &[Hit]) -> usize {
    let window = Duration::from_secs(1) - JITTER;
    hits.iter()
        .map(|h| {
            hits.iter()
                .filter(|o| o.at >= h.at && o.at.duration_since(h.at) < window)
                .count()
        })
        .max()
        .unwrap_or(0)
}

/// The day's process, from its number in April.
fn process_of(hit: &Hit, per: usize) -> usize {
    let day: usize = hit.day[8..].parse().expect("a day of April");
    (day - 1) / per
}

async fn all_days_done(env: &Env, days: usize) {
    assert_eq!(
        env.db.count("FROM orders").await,
        i64::try_from(days * RECORDS).unwrap()
    );
    let done = env.db.count("FROM _tm_runs WHERE status = 'done'").await;
    assert_eq!(done, i64::try_from(days).unwrap(), "every period done");
}

#[tokio::test]
async fn three_processes_share_one_rate_limit() {
    let api = start_api();
    let env = setup(Backend::Postgres, &api).await;
    // Eight days each: at 4 requests a second the three processes' 24
    // requests span 6 s, far more than the processes' start-up skew, so
    // they overlap even when a tiny period costs almost nothing (with 5
    // days each, one process could finish its block before another's
    // first request).
    let (processes, days) = (3, 24);
    let started = Instant::now();
    backfill_in(&env, processes, days, &[]);
    let elapsed = started.elapsed();
    all_days_done(&env, days).await;

    let hits = api.hits();
    assert_eq!(hits.len(), days, "one request per period, none retried");
    let busiest = busiest_second(&hits);
    let span = hits.last().unwrap().at.duration_since(hits[0].at);
    eprintln!(
        "test 8: {} requests from {processes} processes over {span:?} (commands {elapsed:?}); busiest second: {busiest}",
        hits.len()
    );
    assert!(
        busiest <= PER_SECOND + BURST,
        "{busiest} requests within one second, across the processes"
    );
    // Alone, each process would send its 8 requests within 1.5 s; sharing
    // one bucket, the 24 take at least (24 - 5) / 4 s together.
    let shared = Duration::from_secs_f64((days - PER_SECOND - BURST) as f64 / PER_SECOND as f64);
    assert!(
        span >= shared - JITTER,
        "{span:?}: the processes did not share the bucket"
    );
    // The processes really ran side by side: requests of at least two of
    // them interleave. (Not all three: the bucket is not fair, and under
    // load one process's first lease can come after the others' last.)
    let per = days / processes;
    let interleaved = (0..processes)
        .filter(|&p| {
            let mine: Vec<&Hit> = hits.iter().filter(|h| process_of(h, per) == p).collect();
            let others_after = hits
                .iter()
                .any(|h| process_of(h, per) != p && h.at > mine[0].at);
            let others_before = hits
                .iter()
                .any(|h| process_of(h, per) != p && h.at < mine[mine.len() - 1].at);
            others_after && others_before
        })
        .count();
    assert!(
        interleaved >= 2,
        "the processes ran one after another: {:?}",
        hits.iter().map(|h| &h.day).collect::<Vec<_>>()
    );
    let bucket = env
        .db
        .select(&["per_second", "burst"], "FROM _tm_rate_buckets")
        .await;
    assert_eq!(
        bucket,
        vec![vec![Some("4".to_string()), Some("1".to_string())]],
        "one bucket row for the source"
    );
}

/// One `429 Retry-After: 3` to the third request; every process (or, on
/// SQLite, every period of the one process) then waits it out.
async fn retry_after_pauses(backend: Backend, processes: usize, extra: &[&str]) {
    let api = start_api();
    let env = setup(backend, &api).await;
    let seen = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&seen);
    api.faults(move |_| {
        (counter.fetch_add(1, Ordering::SeqCst) == 2)
            .then(|| Fault::Status(429, Some("3".into()), "slow down".into()))
    });
    let days = 9;
    backfill_in(&env, processes, days, extra);
    all_days_done(&env, days).await;

    let hits = api.hits();
    assert_eq!(hits.len(), days + 1, "one retry of the throttled request");
    let throttled = hits
        .iter()
        .position(|h| h.status == 429 || h.fault.is_some())
        .expect("the 429 was sent");
    assert_eq!(hits[throttled].retry_after.as_deref(), Some("3"));
    let next = &hits[throttled + 1];
    let gap = next.at.duration_since(hits[throttled].done);
    eprintln!("test 8: after the 429, the next request came {gap:?} later ({backend:?}, {processes} process(es))");
    assert!(
        gap >= Duration::from_millis(2800),
        "a request arrived {gap:?} after the 429 (day {})",
        next.day
    );
    assert!(
        busiest_second(&hits) <= PER_SECOND + BURST,
        "more than {} requests within a second: {}",
        PER_SECOND + BURST,
        timeline(&hits)
    );
}

/// `+0.000s day 2024-04-01 200, ...`: each request's arrival after the
/// first, for failure messages.
fn timeline(hits: &[Hit]) -> String {
    let first = hits.first().map(|h| h.at);
    hits.iter()
        .map(|h| {
            let at = first.map_or(Duration::ZERO, |f| h.at.duration_since(f));
            format!("+{:.3}s {} {}", at.as_secs_f64(), h.day, h.status)
        })
        .collect::<Vec<_>>()
        .join(", ")
}

#[tokio::test]
async fn retry_after_pauses_every_worker_of_the_source() {
    retry_after_pauses(Backend::Postgres, 3, &[]).await;
}

#[tokio::test]
async fn retry_after_pauses_every_period_of_one_process_sqlite() {
    retry_after_pauses(Backend::Sqlite, 1, &["--concurrency", "4"]).await;
}
