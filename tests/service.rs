//! Service mode: the ledger is the work queue (issue 12). Real `serve`
//! processes, real signals, both databases; "another host" is a process in
//! its own UTS namespace with its own host name (`unshare --uts`).

use std::collections::{BTreeMap, HashSet};
use std::fs;
use std::time::{Duration, Instant};

use crate::http::api::{ids, Api, Fault};
use crate::support::{backend_tests, Backend, Csv, Env, FifoWriter, Out};

backend_tests! {
    two_servers_share_the_queue_each_key_once: two_servers_share_the_queue_each_key_once_sqlite, two_servers_share_the_queue_each_key_once_postgres;
    killed_worker_key_is_taken_over_by_another_host: killed_worker_key_is_taken_over_by_another_host_sqlite, killed_worker_key_is_taken_over_by_another_host_postgres;
    first_signal_hands_the_key_back_and_another_process_resumes: first_signal_hands_the_key_back_and_another_process_resumes_sqlite, first_signal_hands_the_key_back_and_another_process_resumes_postgres;
    second_signal_aborts_at_once: second_signal_aborts_at_once_sqlite, second_signal_aborts_at_once_postgres;
    stopped_worker_past_its_lease_commits_nothing_more: stopped_worker_past_its_lease_commits_nothing_more_sqlite, stopped_worker_past_its_lease_commits_nothing_more_postgres;
    two_schedulers_queue_each_due_key_once: two_schedulers_queue_each_due_key_once_sqlite, two_schedulers_queue_each_due_key_once_postgres;
    scheduled_period_outranks_a_large_backfill_and_aging_still_wins: scheduled_period_outranks_a_large_backfill_and_aging_still_wins_sqlite, scheduled_period_outranks_a_large_backfill_and_aging_still_wins_postgres;
    failed_key_is_retried_at_its_backoff_times_only: failed_key_is_retried_at_its_backoff_times_only_sqlite, failed_key_is_retried_at_its_backoff_times_only_postgres;
    cancelled_keys_leave_nothing_to_drain: cancelled_keys_leave_nothing_to_drain_sqlite, cancelled_keys_leave_nothing_to_drain_postgres;
    sighup_rereads_the_pipelines_and_keeps_a_broken_one: sighup_rereads_the_pipelines_and_keeps_a_broken_one_sqlite, sighup_rereads_the_pipelines_and_keeps_a_broken_one_postgres;
}

/// Starts the fake API on a thread of its own: it runs its own runtime,
/// which cannot be started from inside the test's.
fn start_api(records: usize, hold: Option<Duration>) -> Api {
    std::thread::spawn(move || {
        let api = Api::start(move |_| records, None);
        if let Some(hold) = hold {
            api.faults(move |_| Some(Fault::Hold(hold)));
        }
        api
    })
    .join()
    .expect("start the fake API")
}

/// A pipeline `feed` reading the fake API's CSV route, one day per period.
fn feed_pipeline(env: &Env, api: &Api, extra: &str) {
    env.write(
        "pipelines/feed.toml",
        &format!(
            r#"name = "feed"
export_type = "feed_daily"
version = "1"

[period]
granularity = "day"
start = "2024-01-01"

[[sources]]
id = "api"
transport = "http"
format = "csv"
url = "{base}/none"
query = {{ day = "{{period.start:%Y-%m-%d}}" }}

[fields]
id = {{ type = "text", required = true }}
day = {{ type = "date" }}
amount = {{ type = "decimal" }}

[load]
table = "feed"
key = ["id"]

[retry]
max_attempts = 3
base_delay = "10ms"
max_delay = "1s"
{extra}
"#,
            base = api.base
        ),
    );
}

/// `backfill feed --enqueue` over `days` January/February 2024 days.
fn enqueue_days(env: &Env, days: u32, extra: &[&str]) -> Out {
    let to = chrono::NaiveDate::from_ymd_opt(2024, 1, 1).unwrap()
        + chrono::Duration::days(i64::from(days) - 1);
    let to = to.format("%Y-%m-%d").to_string();
    let mut args = vec![
        "backfill",
        "feed",
        "--from",
        "2024-01-01",
        "--to",
        &to,
        "--enqueue",
    ];
    args.extend_from_slice(extra);
    let out = env.tidemark(&args);
    out.expect_code(0, "backfill --enqueue");
    out
}

/// `(pipeline, period_start) -> (status, attempts)` from the ledger.
async fn ledger(env: &Env) -> BTreeMap<String, (String, i64)> {
    env.db
        .select(&["period_start", "status", "attempt"], "FROM _tm_runs")
        .await
        .into_iter()
        .map(|r| {
            let start = r[0].clone().unwrap_or_default();
            let status = r[1].clone().unwrap_or_default();
            let attempts = r[2].as_deref().unwrap_or("0").parse().unwrap_or(-1);
            (start, (status, attempts))
        })
        .collect()
}

// ---------------------------------------------------------------------------
// 1. Two servers share the queue
// ---------------------------------------------------------------------------

async fn two_servers_share_the_queue_each_key_once(backend: Backend) {
    let env = Env::new(backend).await;
    // Each period waits a little at the source, so both servers get work.
    let api = start_api(5, Some(Duration::from_millis(60)));
    feed_pipeline(&env, &api, "");
    let queued = enqueue_days(&env, 60, &[]);
    assert!(queued.stdout.contains("queued 60 run key(s)"), "{queued}");
    let again = enqueue_days(&env, 60, &[]);
    assert!(
        again.stdout.contains("queued 0 run key(s)"),
        "queuing is idempotent\n{again}"
    );

    let serve = ["serve", "--no-schedule", "--workers", "2", "--drain"];
    let first = env.spawn(&serve);
    let second = env.spawn(&serve);
    let (first_pid, second_pid) = (first.pid(), second.pid());
    first
        .finish(Duration::from_secs(120))
        .expect_code(0, "first server drains");
    second
        .finish(Duration::from_secs(120))
        .expect_code(0, "second server drains");

    let runs = ledger(&env).await;
    assert_eq!(runs.len(), 60);
    for (period, (status, attempts)) in &runs {
        assert_eq!((status.as_str(), *attempts), ("done", 1), "{period}");
    }
    let workers: HashSet<String> = env
        .db
        .select(&["worker"], "FROM _tm_attempts")
        .await
        .into_iter()
        .filter_map(|r| r[0].clone())
        .collect();
    let pids: HashSet<u32> = workers
        .iter()
        .filter_map(|w| w.split(':').nth(1)?.parse().ok())
        .collect();
    assert_eq!(
        pids,
        HashSet::from([first_pid, second_pid]),
        "both servers did work"
    );
    assert_eq!(
        env.db.count("FROM _tm_attempts").await,
        60,
        "one attempt per key"
    );
    assert_eq!(env.db.count("FROM feed").await, 300);
    let day = "2024-02-29";
    let stored: Vec<String> = env
        .db
        .select(
            &["id"],
            &format!("FROM feed WHERE id LIKE '{day}-%' ORDER BY id"),
        )
        .await
        .into_iter()
        .filter_map(|r| r[0].clone())
        .collect();
    assert_eq!(stored, ids(day, 5), "the table equals the source");
}

// ---------------------------------------------------------------------------
// Periods fed through a FIFO: a long period whose progress the test controls
// ---------------------------------------------------------------------------

/// Day 8 of the orders example behind a FIFO, five rows a batch.
pub(crate) struct SlowDay {
    path: std::path::PathBuf,
    export: String,
    csv: Csv,
    fifo: Option<FifoWriter>,
}

impl SlowDay {
    pub(crate) fn new(env: &Env) -> SlowDay {
        env.set_option("orders", "load", "batch_size", "5");
        let path = env.path("pipelines/data/orders/2024/01/08/orders.csv");
        let export = fs::read_to_string(&path).expect("read export");
        let csv = Csv::parse(&export);
        let fifo = Some(FifoWriter::create(&path));
        SlowDay {
            path,
            export,
            csv,
            fifo,
        }
    }

    /// Writes rows `from..to` (0-based) of the export into the FIFO, with
    /// the header before the first.
    pub(crate) fn feed(&self, from: usize, to: usize) {
        let text = Csv {
            header: self.csv.header.clone(),
            rows: self.csv.rows[from..to].to_vec(),
        }
        .to_text();
        let text = if from == 0 {
            text
        } else {
            text.split_once('\n')
                .map(|(_, rows)| rows.to_string())
                .unwrap_or_default()
        };
        if let Some(fifo) = &self.fifo {
            fifo.write(&text);
        }
    }

    /// Replaces the FIFO by the whole export as a regular file (a reader
    /// that has the FIFO open keeps it).
    pub(crate) fn make_regular(&mut self) {
        self.fifo.take();
        let _ = fs::remove_file(&self.path);
        fs::write(&self.path, &self.export).expect("write the whole export");
    }
}

/// Waits until day 8's run row has committed `batches` batches.
pub(crate) async fn wait_for_batches(env: &Env, batches: u32) {
    let deadline = Instant::now() + Duration::from_secs(30);
    let sql = format!(
        "FROM _tm_runs WHERE {}",
        env.db
            .instant_is("period_start", "2024-01-08T00:00:00+01:00")
    );
    loop {
        if env.db.table_exists("_tm_runs").await {
            let rows = env.db.select(&["batches"], &sql).await;
            if rows.first().and_then(|r| r[0].as_deref()) == Some(&batches.to_string()) {
                return;
            }
        }
        assert!(
            Instant::now() < deadline,
            "{batches} batches were not committed in time"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `order_id -> (_tm_run_id, _tm_loaded_at)` of day 8.
async fn day8_lineage(env: &Env) -> BTreeMap<String, (Option<String>, Option<String>)> {
    env.db
        .select(
            &["order_id", "_tm_run_id", "_tm_loaded_at"],
            "FROM orders WHERE order_id LIKE 'O-20240108-%'",
        )
        .await
        .into_iter()
        .map(|r| {
            (
                r[0].clone().unwrap_or_default(),
                (r[1].clone(), r[2].clone()),
            )
        })
        .collect()
}

fn day8_entry(env: &Env) -> serde_json::Value {
    env.status_of("orders", "2024-01-08")
        .expect("day 8 in the ledger")
}

async fn attempts_of_day8(env: &Env) -> Vec<(String, String)> {
    env.db
        .select(&["status", "resumed"], "FROM _tm_attempts ORDER BY attempt")
        .await
        .into_iter()
        .map(|r| {
            (
                r[0].clone().unwrap_or_default(),
                r[1].clone().unwrap_or_default(),
            )
        })
        .collect()
}

fn is_true(text: &str) -> bool {
    matches!(text, "1" | "true" | "t")
}

// ---------------------------------------------------------------------------
// 2. kill -9 of a worker: another host takes the key over
// ---------------------------------------------------------------------------

async fn killed_worker_key_is_taken_over_by_another_host(backend: Backend) {
    let env = Env::orders(backend).await;
    let mut day = SlowDay::new(&env);
    let queued = env.tidemark(&[
        "backfill",
        "orders",
        "--from",
        "2024-01-08",
        "--to",
        "2024-01-08",
        "--enqueue",
    ]);
    queued.expect_code(0, "enqueue day 8");
    let worker = [
        "--lease-ttl",
        "3s",
        "serve",
        "--no-schedule",
        "--workers",
        "1",
        "--poll-interval",
        "200ms",
    ];
    let first = env.spawn(&worker);
    day.feed(0, 12);
    wait_for_batches(&env, 2).await;
    let committed = day8_lineage(&env).await;
    assert_eq!(committed.len(), 10);
    first.kill9();
    let killed = Instant::now();
    day.make_regular();

    let second = env.spawn_on_host("tm-other-host", &worker);
    let done = env.wait_for_status("orders", "2024-01-08", Duration::from_secs(30), |e| {
        e["status"] == "done"
    });
    let took = killed.elapsed();
    assert!(
        took >= Duration::from_secs(1) && took < Duration::from_secs(3 + 1 + 4),
        "taken over once the 3 s lease ran out, plus a poll: {took:?}"
    );
    second.signal("TERM");
    second
        .finish(Duration::from_secs(30))
        .expect_code(0, "the other host stops");
    assert_eq!(done["attempts"], 2);
    assert_eq!(env.db.count("FROM orders").await, 20, "no duplicates");
    let attempts = attempts_of_day8(&env).await;
    assert_eq!(attempts[0].0, "lost");
    assert_eq!(attempts[1].0, "done");
    assert!(
        is_true(&attempts[1].1),
        "resumed from the checkpoint: {attempts:?}"
    );
    let after = day8_lineage(&env).await;
    for (id, before) in &committed {
        assert_eq!(
            after.get(id),
            Some(before),
            "{id} was committed before the kill: not written again"
        );
    }
}

// ---------------------------------------------------------------------------
// 3. SIGTERM: the key goes back to the queue; a second process resumes it
// ---------------------------------------------------------------------------

async fn first_signal_hands_the_key_back_and_another_process_resumes(backend: Backend) {
    let env = Env::orders(backend).await;
    env.tidemark(&["migrate"]).expect_code(0, "migrate");
    let mut day = SlowDay::new(&env);
    let run = env.spawn(&["run", "orders", "--period", "2024-01-08"]);
    day.feed(0, 12);
    wait_for_batches(&env, 2).await;
    run.signal("TERM");
    run.wait_for_stderr("stopping", Duration::from_secs(10));
    let signalled = Instant::now();
    // The batch in flight finishes reading and commits; then the run stops.
    day.feed(12, 15);
    let out = run.finish(Duration::from_secs(25));
    out.expect_code(0, "a first SIGTERM exits 0");
    assert!(
        signalled.elapsed() < Duration::from_secs(20),
        "within the shutdown timeout\n{out}"
    );
    assert!(out.stderr.contains("interrupted"), "{out}");
    let entry = day8_entry(&env);
    assert_eq!(
        entry["status"], "pending",
        "handed back to the queue: {entry}"
    );
    assert_eq!(entry["error_class"], "interrupted");
    assert!(entry["lease_owner"].is_null(), "lease released: {entry}");
    assert_eq!(entry["rows_read"], 15);
    let committed = day8_lineage(&env).await;
    assert_eq!(committed.len(), 15);
    assert_eq!(attempts_of_day8(&env).await[0].0, "interrupted");

    // Another process (another worker id) resumes at once.
    day.make_regular();
    let resumed = env.tidemark(&["run", "orders", "--period", "2024-01-08"]);
    resumed.expect_code(0, "the next run");
    assert!(
        resumed.elapsed < Duration::from_secs(10),
        "no lease to wait out\n{resumed}"
    );
    let entry = day8_entry(&env);
    assert_eq!(
        (entry["status"].as_str(), entry["attempts"].as_i64()),
        (Some("done"), Some(2))
    );
    assert!(
        is_true(&attempts_of_day8(&env).await[1].1),
        "resumed from the checkpoint"
    );
    assert_eq!(env.db.count("FROM orders").await, 20);
    let after = day8_lineage(&env).await;
    for (id, before) in &committed {
        assert_eq!(
            after.get(id),
            Some(before),
            "{id} was committed before the signal"
        );
    }
}

async fn second_signal_aborts_at_once(backend: Backend) {
    for (signal, code) in [("TERM", 143), ("INT", 130)] {
        let env = Env::orders(backend).await;
        env.tidemark(&["migrate"]).expect_code(0, "migrate");
        let mut day = SlowDay::new(&env);
        let run = env.spawn(&["run", "orders", "--period", "2024-01-08"]);
        day.feed(0, 12);
        wait_for_batches(&env, 2).await;
        run.signal(signal);
        run.wait_for_stderr("stopping", Duration::from_secs(10));
        let second = Instant::now();
        run.signal(signal);
        let out = run.finish(Duration::from_secs(10));
        out.expect_code(code, &format!("a second SIG{signal}"));
        assert!(second.elapsed() < Duration::from_secs(1), "at once\n{out}");
        // The uncommitted batch rolled back; the next run takes over.
        assert_eq!(day8_lineage(&env).await.len(), 10);
        day.make_regular();
        env.tidemark(&["run", "orders", "--period", "2024-01-08"])
            .expect_code(0, "the next run after an abort");
        assert_eq!(env.db.count("FROM orders").await, 20);
    }
}

// ---------------------------------------------------------------------------
// 4. SIGSTOP past the lease: the stopped worker commits nothing more
// ---------------------------------------------------------------------------

async fn stopped_worker_past_its_lease_commits_nothing_more(backend: Backend) {
    let env = Env::orders(backend).await;
    env.tidemark(&["migrate"]).expect_code(0, "migrate");
    let mut day = SlowDay::new(&env);
    let stopped = env.spawn(&[
        "--lease-ttl",
        "2s",
        "run",
        "orders",
        "--period",
        "2024-01-08",
    ]);
    day.feed(0, 12);
    wait_for_batches(&env, 2).await;
    stopped.signal("STOP");
    tokio::time::sleep(Duration::from_secs(3)).await;
    let fifo = day.fifo.take();
    let _ = fs::remove_file(&day.path);
    fs::write(&day.path, &day.export).expect("write the export");
    let other = env.spawn_on_host(
        "tm-other-host",
        &[
            "--lease-ttl",
            "2s",
            "run",
            "orders",
            "--period",
            "2024-01-08",
        ],
    );
    other
        .finish(Duration::from_secs(30))
        .expect_code(0, "the other host takes over");
    let finished = day8_lineage(&env).await;
    assert_eq!(finished.len(), 20);

    stopped.signal("CONT");
    // The stopped run's source goes on: it reads, then tries to commit.
    if let Some(fifo) = fifo {
        day.fifo = Some(fifo);
        day.feed(12, 20);
        if let Some(fifo) = day.fifo.take() {
            fifo.close(Duration::from_secs(10));
        }
    }
    let out = stopped.finish(Duration::from_secs(30));
    out.expect_code(75, "the stopped worker lost its lease");
    assert!(out.stderr.contains("lease lost"), "{out}");
    assert_eq!(
        day8_lineage(&env).await,
        finished,
        "it committed nothing more"
    );
    let entry = day8_entry(&env);
    assert_eq!(
        (entry["status"].as_str(), entry["attempts"].as_i64()),
        (Some("done"), Some(2))
    );
}

// ---------------------------------------------------------------------------
// 5. Scheduling
// ---------------------------------------------------------------------------

/// `feed` with a schedule, starting `days` days before today (UTC).
fn scheduled_feed(env: &Env, api: &Api, days: i64) -> String {
    let start = (chrono::Utc::now() - chrono::Duration::days(days))
        .format("%Y-%m-%d")
        .to_string();
    feed_pipeline(env, api, "\n[schedule]\nevery = \"1h\"\n");
    env.edit_pipeline("feed", |t| {
        t.replace("start = \"2024-01-01\"", &format!("start = \"{start}\""))
    });
    start
}

async fn two_schedulers_queue_each_due_key_once(backend: Backend) {
    let env = Env::new(backend).await;
    let api = start_api(3, Some(Duration::from_millis(30)));
    scheduled_feed(&env, &api, 12);
    env.tidemark(&["migrate"]).expect_code(0, "migrate");
    let serve = ["serve", "--workers", "2", "--drain"];
    let first = env.spawn(&serve);
    let second = env.spawn(&serve);
    first
        .finish(Duration::from_secs(120))
        .expect_code(0, "first drains");
    second
        .finish(Duration::from_secs(120))
        .expect_code(0, "second drains");
    let runs = ledger(&env).await;
    assert!(runs.len() >= 11, "every due day was queued: {}", runs.len());
    for (period, (status, attempts)) in &runs {
        assert_eq!(
            (status.as_str(), *attempts),
            ("done", 1),
            "{period}: queued and run once"
        );
    }
    assert_eq!(
        env.db.count("FROM _tm_attempts").await,
        i64::try_from(runs.len()).unwrap()
    );
    assert_eq!(api.hits().len(), runs.len(), "each day fetched once");
    let by: HashSet<String> = env
        .db
        .select(&["enqueued_by"], "FROM _tm_runs")
        .await
        .into_iter()
        .filter_map(|r| r[0].clone())
        .collect();
    assert_eq!(by, HashSet::from(["schedule".to_string()]));
}

async fn scheduled_period_outranks_a_large_backfill_and_aging_still_wins(backend: Backend) {
    let env = Env::new(backend).await;
    let api = start_api(2, Some(Duration::from_millis(20)));
    feed_pipeline(&env, &api, "");
    // A second pipeline on a schedule, due once (yesterday).
    let start = (chrono::Utc::now() - chrono::Duration::days(1))
        .format("%Y-%m-%d")
        .to_string();
    let sched = fs::read_to_string(env.path("pipelines/feed.toml"))
        .unwrap()
        .replace("name = \"feed\"", "name = \"sched\"")
        .replace("table = \"feed\"", "table = \"sched\"")
        .replace("start = \"2024-01-01\"", &format!("start = \"{start}\""))
        + "\n[schedule]\nevery = \"1h\"\n";
    env.write("pipelines/hourly.toml", &sched);
    enqueue_days(&env, 120, &["--priority", "0"]);
    // One backfill key has waited two days: aging puts it before anything.
    let aged = "2024-06-01";
    env.tidemark(&[
        "backfill",
        "feed",
        "--from",
        aged,
        "--to",
        aged,
        "--enqueue",
    ])
    .expect_code(0, "enqueue the aged key");
    let two_days_ago = match backend {
        Backend::Sqlite => "strftime('%Y-%m-%dT%H:%M:%fZ', 'now', '-2 days')",
        Backend::Postgres => "now() - interval '2 days'",
    };
    env.db
        .execute(&format!(
            "UPDATE _tm_runs SET queue_rank = {two_days_ago} WHERE period_start LIKE '{aged}%'"
        ))
        .await;
    let serve = env.spawn(&["serve", "--workers", "1", "--drain"]);
    serve
        .finish(Duration::from_secs(180))
        .expect_code(0, "drains");
    let scheduled = env_times(&env, "pipeline = 'sched'").await;
    let backfill = env_times(&env, "pipeline = 'feed'").await;
    assert_eq!(scheduled.len(), 1, "one scheduled period");
    assert_eq!(backfill.len(), 121);
    let last_backfill = backfill.iter().max().unwrap();
    assert!(
        scheduled[0] < *last_backfill,
        "the scheduled period finished before the backfill did"
    );
    let aged_started = env_started(&env, &format!("period_start LIKE '{aged}%'")).await;
    let sched_started = env_started(&env, "pipeline = 'sched'").await;
    assert!(
        aged_started < sched_started,
        "the aged backfill key was claimed first"
    );
}

async fn env_times(env: &Env, filter: &str) -> Vec<String> {
    env.db
        .select(&["finished_at"], &format!("FROM _tm_runs WHERE {filter}"))
        .await
        .into_iter()
        .filter_map(|r| r[0].clone())
        .map(|t| crate::support::norm_timestamp(&t))
        .collect()
}

async fn env_started(env: &Env, filter: &str) -> String {
    crate::support::norm_timestamp(
        &env.db
            .select(&["started_at"], &format!("FROM _tm_runs WHERE {filter}"))
            .await[0][0]
            .clone()
            .expect("started"),
    )
}

// ---------------------------------------------------------------------------
// 6. Failed keys back off across fires
// ---------------------------------------------------------------------------

async fn failed_key_is_retried_at_its_backoff_times_only(backend: Backend) {
    let env = Env::orders(backend).await;
    // Due at the injected clock: only 2024-01-02, and its export is gone.
    env.set_option("orders", "period", "start", "\"2024-01-02\"");
    fs::remove_file(env.path("pipelines/data/orders/2024/01/02/orders.csv"))
        .expect("remove export");
    let t0 = chrono::DateTime::parse_from_rfc3339("2024-01-03T10:00:00Z").unwrap();
    let at = |secs: i64| (t0 + chrono::Duration::seconds(secs)).to_rfc3339();
    let sync_at = |secs: i64| {
        let now = at(secs);
        let out = env.tidemark_env(&[("TIDEMARK_NOW", &now)], &["sync", "orders"]);
        (out, env.status_of("orders", "2024-01-02"))
    };
    // The back-off is the database's clock (issue 19): `TIDEMARK_NOW`
    // moves what is due, not when a failed key may run again.
    for (secs, attempts) in [(0, 1), (30, 1), (61, 1), (423, 1)] {
        let (out, entry) = sync_at(secs);
        let entry = entry.expect("ledger entry");
        assert_eq!(entry["attempts"], attempts, "sync at t0+{secs}s\n{out}");
        assert_eq!(entry["status"], "failed");
        assert!(entry["not_before"].is_string(), "{entry}");
    }
    // Once the back-off has passed (by the database's clock: moved back
    // here, as no test can move that clock), the next sync retries, and the
    // wait doubles: two minutes after the second failure.
    let past = match backend {
        Backend::Sqlite => "'2000-01-01T00:00:00.000Z'",
        Backend::Postgres => "'2000-01-01T00:00:00Z'::timestamptz",
    };
    env.db
        .execute(&format!("UPDATE _tm_runs SET not_before = {past}"))
        .await;
    let (out, entry) = sync_at(430);
    assert_eq!(entry.expect("entry")["attempts"], 2, "retried\n{out}");
    let waits = env
        .db
        .select(&[&elapsed_secs(backend)], "FROM _tm_runs")
        .await;
    let wait: f64 = waits[0][0].as_deref().unwrap_or("0").parse().unwrap();
    assert!(
        (119.0..=121.0).contains(&wait),
        "2 minutes after the second failure: {wait} s"
    );
    // An operator retries at once.
    let forced = env.tidemark_env(
        &[("TIDEMARK_NOW", &at(431))],
        &["run", "orders", "--period", "2024-01-02"],
    );
    forced.expect_code(1, "still failing, but attempted");
    assert_eq!(
        env.status_of("orders", "2024-01-02").unwrap()["attempts"],
        3
    );
}

/// Seconds from a failure (`finished_at`) to its `not_before`, in SQL.
fn elapsed_secs(backend: Backend) -> String {
    match backend {
        Backend::Sqlite => "(julianday(not_before) - julianday(finished_at)) * 86400.0".to_string(),
        Backend::Postgres => "EXTRACT(EPOCH FROM (not_before - finished_at))".to_string(),
    }
}

// ---------------------------------------------------------------------------
// 7. cancel
// ---------------------------------------------------------------------------

async fn cancelled_keys_leave_nothing_to_drain(backend: Backend) {
    let env = Env::new(backend).await;
    let api = start_api(2, None);
    feed_pipeline(&env, &api, "");
    enqueue_days(&env, 10, &[]);
    let out = env.tidemark(&[
        "cancel",
        "feed",
        "--from",
        "2024-01-03",
        "--to",
        "2024-01-04",
    ]);
    out.expect_code(0, "cancel a range");
    assert!(out.stdout.contains("cancelled 2 pending"), "{out}");
    let out = env.tidemark(&["cancel", "feed"]);
    assert!(out.stdout.contains("cancelled 8 pending"), "{out}");
    let runs = ledger(&env).await;
    assert!(runs.values().all(|(s, _)| s == "cancelled"), "{runs:?}");
    let serve = env.spawn(&["serve", "--no-schedule", "--drain"]);
    let out = serve.finish(Duration::from_secs(30));
    out.expect_code(0, "nothing to drain");
    assert!(api.hits().is_empty(), "no source was read");
    assert_eq!(env.db.count("FROM _tm_attempts").await, 0);
}

// ---------------------------------------------------------------------------
// 9. SIGHUP
// ---------------------------------------------------------------------------

async fn sighup_rereads_the_pipelines_and_keeps_a_broken_one(backend: Backend) {
    let env = Env::new(backend).await;
    let api = start_api(2, None);
    feed_pipeline(&env, &api, "");
    let serve = env.spawn(&["serve", "--no-schedule", "--poll-interval", "100ms"]);
    serve.wait_for_stderr("serving", Duration::from_secs(20));
    let done = |day: &str| {
        env.wait_for_status("feed", day, Duration::from_secs(30), |e| {
            e["status"] == "done"
        })
    };

    // An edit takes effect after SIGHUP.
    env.edit_pipeline("feed", |t| t.replace("version = \"1\"", "version = \"2\""));
    serve.signal("HUP");
    serve.wait_for_stderr("SIGHUP: pipeline files re-read", Duration::from_secs(10));
    env.tidemark(&[
        "backfill",
        "feed",
        "--from",
        "2024-01-01",
        "--to",
        "2024-01-01",
        "--enqueue",
    ])
    .expect_code(0, "enqueue");
    assert_eq!(done("2024-01-01")["handler_version"], "2");

    // A broken file is logged with its file and key, its old definition kept.
    env.edit_pipeline("feed", |t| {
        t.replace("version = \"2\"", "version = \"3\"\nbogus_key = 1")
    });
    serve.signal("HUP");
    serve.wait_for_stderr("keeping its previous definition", Duration::from_secs(10));
    let log = serve.output_so_far().stderr;
    assert!(
        log.contains("feed.toml") && log.contains("bogus_key"),
        "{log}"
    );
    // Queued again while the file is broken (`backfill --enqueue` would
    // refuse the file, so through the ledger): the kept definition runs it.
    env.db
        .execute(
            "UPDATE _tm_runs SET status = 'pending', queue_rank = created_at WHERE period_start LIKE '2024-01-01%'",
        )
        .await;
    // (`status` reads the pipeline file too, which is broken: ask the ledger.)
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let rows = env
            .db
            .select(&["status", "attempt", "handler_version"], "FROM _tm_runs")
            .await;
        let row: Vec<&str> = rows[0].iter().map(|c| c.as_deref().unwrap_or("")).collect();
        if row[..2] == ["done", "2"] {
            assert_eq!(row[2], "2", "the previous definition ran");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the key was not run again: {row:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    serve.signal("TERM");
    serve
        .finish(Duration::from_secs(30))
        .expect_code(0, "stops on SIGTERM");
}
