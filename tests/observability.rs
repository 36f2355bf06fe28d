//! `serve --listen`: `/metrics` agrees with the ledger (parsed with a real
//! exposition parser), its labels stay clean and bounded, a worker killed
//! with SIGKILL is seen dead by another serve, `/readyz` follows the
//! database and `/healthz` the service's loops (issue 21).

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::support::{backend_tests, Backend, Env, FifoWriter, Running};

/// The secret the `http_orders` example reads; it must never become a label.
const SECRET: &str = "tm-obs-secret-7f3c9a1e55";

/// A small daily pipeline over CSV files, with room for one reject a day.
const PIPELINE: &str = r#"
name = "p"
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
v = { type = "int" }

[load]
table = "p"
key = ["id"]
batch_size = 5
max_rejects = 3
"#;

/// An HTTP answer: status and body.
pub(crate) struct Answer {
    pub(crate) status: u16,
    pub(crate) body: String,
}

/// `GET path` on `addr` (HTTP/1.1, one request per connection), or `None`
/// when nothing listens there yet.
async fn get(addr: SocketAddr, path: &str) -> Option<Answer> {
    let mut stream = TcpStream::connect(addr).await.ok()?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.ok()?;
    let mut raw = Vec::new();
    tokio::time::timeout(Duration::from_secs(20), stream.read_to_end(&mut raw))
        .await
        .ok()?
        .ok()?;
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n")?;
    let status = head.split_whitespace().nth(1)?.parse().ok()?;
    Some(Answer {
        status,
        body: body.to_string(),
    })
}

/// `GET path`, which must answer.
pub(crate) async fn must_get(addr: SocketAddr, path: &str) -> Answer {
    get(addr, path)
        .await
        .unwrap_or_else(|| panic!("GET {path} on {addr}: no answer"))
}

/// A free port on the loopback address.
pub(crate) fn free_addr() -> SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a free port");
    listener.local_addr().expect("local addr")
}

/// Waits until `addr` answers `/readyz` with 200.
pub(crate) async fn wait_ready(addr: SocketAddr, serve: &Running) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(answer) = get(addr, "/readyz").await {
            if answer.status == 200 {
                return;
            }
        }
        assert!(
            Instant::now() < deadline,
            "serve on {addr} not ready in 30 s\n{}",
            serve.output_so_far()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// One sample: metric name (as exposed) and labels.
pub(crate) type Key = (String, BTreeMap<String, String>);

/// The exposition, parsed by `prometheus-parse`: every sample's value
/// (a histogram as its `_count`, kept under `NAME_count`).
pub(crate) fn parse(text: &str) -> BTreeMap<Key, f64> {
    let lines = text.lines().map(|l| Ok(l.to_string()));
    let scrape = prometheus_parse::Scrape::parse(lines).expect("a valid exposition");
    let mut samples = BTreeMap::new();
    for s in scrape.samples {
        let labels: BTreeMap<String, String> = s
            .labels
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let (name, value) = match s.value {
            prometheus_parse::Value::Counter(v)
            | prometheus_parse::Value::Gauge(v)
            | prometheus_parse::Value::Untyped(v) => (s.metric, v),
            prometheus_parse::Value::Histogram(buckets) => {
                let inf = buckets
                    .iter()
                    .find(|b| b.less_than.is_infinite())
                    .map_or(0.0, |b| b.count);
                (format!("{}_bucket_inf", s.metric), inf)
            }
            prometheus_parse::Value::Summary(_) => continue,
        };
        samples.insert((name, labels), value);
    }
    samples
}

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// The value of one series, which must exist.
pub(crate) fn value(samples: &BTreeMap<Key, f64>, name: &str, pairs: &[(&str, &str)]) -> f64 {
    let key = (name.to_string(), labels(pairs));
    *samples
        .get(&key)
        .unwrap_or_else(|| panic!("no series {name}{pairs:?} in /metrics"))
}

/// One integer the ledger answers (`CAST(... AS TEXT)` of the query).
async fn ledger_number(env: &Env, sql: &str) -> f64 {
    let rows = env.db.rows(sql).await;
    rows.first()
        .and_then(|r| r[0].as_deref())
        .map_or(0.0, |n| n.parse().expect("a number"))
}

/// Backfills days 1-7 of `p`, crashes day 8 mid-period (kill -9 after two
/// committed batches) and resumes it, then runs days 10-12 through the
/// queue (`backfill --enqueue`, `serve --drain`).
async fn backfill_with_a_crash(env: &Env) {
    env.write("pipelines/p.toml", PIPELINE);
    for day in 1..=7 {
        let mut rows: Vec<String> = (1..=6).map(|i| format!("d{day}r{i},{i}")).collect();
        if day == 3 {
            rows.push("bad,not-a-number".to_string());
        }
        env.write(
            format!("pipelines/data/2024-01-{day:02}.csv"),
            &format!("id,v\n{}\n", rows.join("\n")),
        );
    }
    let lease = ["--lease-ttl", "3s"];
    env.tidemark(
        &[
            &lease[..],
            &[
                "backfill",
                "p",
                "--from",
                "2024-01-01",
                "--to",
                "2024-01-07",
            ],
        ]
        .concat(),
    )
    .expect_code(0, "backfill days 1-7");

    let rows: Vec<String> = (1..=20).map(|i| format!("r{i:02},{i}")).collect();
    let path = env.path("pipelines/data/2024-01-08.csv");
    let fifo = FifoWriter::create(&path);
    let run1 = env.spawn(&[&lease[..], &["run", "p", "--period", "2024-01-08"]].concat());
    let run1_pid = run1.pid();
    fifo.write(&format!("id,v\n{}\n", rows[..12].join("\n")));
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let batches = env
            .db
            .rows(
                "SELECT CAST(batches AS TEXT) FROM _tm_runs WHERE period_start LIKE '2024-01-08%'",
            )
            .await;
        if batches.first().and_then(|r| r[0].as_deref()) == Some("2") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "two batches not committed: {batches:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    run1.kill9();
    drop(fifo);
    std::fs::remove_file(&path).expect("remove the FIFO");
    env.write(
        "pipelines/data/2024-01-08.csv",
        &format!("id,v\n{}\n", rows.join("\n")),
    );
    env.tidemark(&[&lease[..], &["run", "p", "--period", "2024-01-08"]].concat())
        .expect_code(0, "the resumed run after kill -9");

    for day in 9..=12 {
        env.write(
            format!("pipelines/data/2024-01-{day:02}.csv"),
            &format!("id,v\nq{day},{day}\n"),
        );
    }
    env.tidemark(&[
        "backfill",
        "p",
        "--from",
        "2024-01-09",
        "--to",
        "2024-01-12",
        "--enqueue",
    ])
    .expect_code(0, "backfill --enqueue");
    let drain = env.spawn(&[&lease[..], &["serve", "--no-schedule", "--drain"]].concat());
    drain
        .finish(Duration::from_secs(60))
        .expect_code(0, "serve --drain works the queue");

    // The run killed with -9 recorded itself as a worker, and is dead once
    // its lease has passed: a dead worker is counted below.
    let deadline = Instant::now() + Duration::from_secs(10);
    let killed =
        format!("SELECT state FROM tidemark_v1_workers WHERE worker LIKE '%:{run1_pid}:%'");
    loop {
        let state = env.db.rows(&killed).await;
        if state == vec![vec![Some("dead".to_string())]] {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the killed run is not dead: {state:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// After a backfill with a crashed and resumed period, every counter and
/// ledger gauge of `/metrics` equals the ledger's own sums; no label value
/// is a date, a run id, a URL or a secret; the series do not grow when the
/// periods grow tenfold.
async fn metrics_equal_the_ledger(backend: Backend) {
    let mut env = Env::new(backend).await;
    env.set_var("SHOP_API_TOKEN", SECRET);
    env.copy_example("http_orders");
    backfill_with_a_crash(&env).await;
    // The first days' attempts ended an hour ago: settled, so the scraper
    // counts them once and the rest as recent, and reads on from its mark.
    let back = match backend {
        Backend::Sqlite => {
            |c: &str| format!("{c} = strftime('%Y-%m-%dT%H:%M:%fZ', julianday({c}) - 1 / 24.0)")
        }
        Backend::Postgres => |c: &str| format!("{c} = {c} - interval '1 hour'"),
    };
    env.db
        .execute(&format!(
            "UPDATE _tm_attempts SET {}, {}
             WHERE run_ref IN (SELECT id FROM _tm_runs WHERE period_start < '2024-01-06')",
            back("started_at"),
            back("finished_at")
        ))
        .await;

    let addr = free_addr();
    let listen = addr.to_string();
    let serve = env.spawn(&[
        "--lease-ttl",
        "3s",
        "serve",
        "--no-schedule",
        "--listen",
        &listen,
        "--metrics-max-age",
        "0s",
    ]);
    wait_ready(addr, &serve).await;
    let health = must_get(addr, "/healthz").await;
    assert_eq!(health.status, 200, "/healthz: {}", health.body);

    let answer = must_get(addr, "/metrics").await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    let m = parse(&answer.body);
    let ps = [("pipeline", "p"), ("source", "s")];

    // Attempts, by outcome, from the attempt history.
    for (outcome, status) in [
        ("done", "done"),
        ("failed", "failed"),
        ("lease_lost", "lost"),
        ("interrupted", "interrupted"),
    ] {
        let want = ledger_number(
            &env,
            &format!(
                "SELECT CAST(COUNT(*) AS TEXT) FROM _tm_attempts
                 WHERE status = '{status}' AND marked IS NULL"
            ),
        )
        .await;
        let got = value(
            &m,
            "tidemark_runs_total",
            &[ps[0], ps[1], ("outcome", outcome)],
        );
        assert_eq!(got, want, "tidemark_runs_total{{outcome={outcome}}}");
    }
    assert_eq!(
        value(
            &m,
            "tidemark_runs_total",
            &[ps[0], ps[1], ("outcome", "done")]
        ),
        12.0
    );
    assert_eq!(
        value(
            &m,
            "tidemark_runs_total",
            &[ps[0], ps[1], ("outcome", "lease_lost")]
        ),
        1.0
    );
    assert_eq!(
        value(
            &m,
            "tidemark_runs_total",
            &[ps[0], ps[1], ("outcome", "held")]
        ),
        0.0
    );

    // Rows, by kind: the counts of every run that finished (its last
    // attempt's, resumed batches included), summed over the history.
    for kind in [
        "read",
        "inserted",
        "updated",
        "unchanged",
        "deleted",
        "rejected",
    ] {
        let want = ledger_number(
            &env,
            &format!(
                "SELECT CAST(SUM(rows_{kind}) AS TEXT) FROM _tm_attempts
                 WHERE status IN ('done', 'failed') AND marked IS NULL"
            ),
        )
        .await;
        let current = ledger_number(
            &env,
            &format!("SELECT CAST(SUM(rows_{kind}) AS TEXT) FROM _tm_runs WHERE pipeline = 'p'"),
        )
        .await;
        assert_eq!(
            want, current,
            "no period ran twice: the history sums as the runs do"
        );
        let got = value(&m, "tidemark_rows_total", &[ps[0], ps[1], ("kind", kind)]);
        assert_eq!(got, want, "tidemark_rows_total{{kind={kind}}}");
    }
    assert_eq!(
        value(
            &m,
            "tidemark_rows_total",
            &[ps[0], ps[1], ("kind", "rejected")]
        ),
        1.0
    );
    assert_eq!(
        value(&m, "tidemark_rows_total", &[ps[0], ps[1], ("kind", "read")]),
        6.0 * 7.0 + 1.0 + 20.0 + 4.0
    );

    // The lost attempt was retried: its cause is the lost lease.
    let retried = ledger_number(
        &env,
        "SELECT CAST(COUNT(*) AS TEXT) FROM _tm_attempts AS a
         JOIN _tm_attempts AS b ON b.run_ref = a.run_ref AND b.attempt = a.attempt - 1
         WHERE b.status = 'lost' AND a.finished_at IS NOT NULL",
    )
    .await;
    assert_eq!(retried, 1.0);
    assert_eq!(
        value(
            &m,
            "tidemark_retries_total",
            &[ps[0], ps[1], ("cause", "lease_lost")]
        ),
        retried
    );

    // Periods by state.
    for status in ["pending", "running", "done", "failed", "cancelled"] {
        let want = ledger_number(
            &env,
            &format!("SELECT CAST(COUNT(*) AS TEXT) FROM _tm_runs WHERE pipeline = 'p' AND status = '{status}'"),
        )
        .await;
        let got = value(&m, "tidemark_periods", &[ps[0], ps[1], ("status", status)]);
        assert_eq!(got, want, "tidemark_periods{{status={status}}}");
    }

    // Durations: one observation per attempt that ended.
    let ended = ledger_number(
        &env,
        "SELECT CAST(COUNT(*) AS TEXT) FROM _tm_attempts WHERE finished_at IS NOT NULL AND marked IS NULL",
    )
    .await;
    assert_eq!(value(&m, "tidemark_run_duration_seconds_count", &ps), ended);
    assert_eq!(
        value(&m, "tidemark_run_duration_seconds_bucket_inf", &ps),
        ended
    );

    // The queue: empty now; four attempts claimed from it, each with a wait.
    assert_eq!(value(&m, "tidemark_queue_pending", &[ps[0]]), 0.0);
    assert_eq!(
        value(&m, "tidemark_queue_oldest_pending_seconds", &[ps[0]]),
        0.0
    );
    let queued = ledger_number(
        &env,
        "SELECT CAST(COUNT(*) AS TEXT) FROM _tm_attempts WHERE queued_at IS NOT NULL",
    )
    .await;
    assert_eq!(queued, 4.0, "every drained key records when it was queued");
    assert_eq!(
        value(&m, "tidemark_queue_wait_seconds_count", &[ps[0]]),
        queued
    );

    // Freshness: every day through the 12th is done.
    let fresh = value(&m, "tidemark_freshness_seconds", &ps);
    let thirteenth = chrono::DateTime::parse_from_rfc3339("2024-01-13T00:00:00Z").expect("a time");
    let want = (chrono::Utc::now().timestamp() - thirteenth.timestamp()) as f64;
    assert!((fresh - want).abs() < 120.0, "freshness {fresh} vs {want}");
    assert_eq!(
        value(&m, "tidemark_period_length_seconds", &[ps[0]]),
        86_400.0
    );

    // Workers: as the ledger's view judges them.
    for state in ["live", "dead"] {
        let want = ledger_number(
            &env,
            &format!(
                "SELECT CAST(COUNT(*) AS TEXT) FROM tidemark_v1_workers WHERE state = '{state}'"
            ),
        )
        .await;
        assert_eq!(
            value(&m, "tidemark_workers", &[("state", state)]),
            want,
            "workers {state}"
        );
    }
    assert!(
        value(&m, "tidemark_workers", &[("state", "live")]) >= 1.0,
        "this serve is live"
    );
    assert!(
        value(&m, "tidemark_workers", &[("state", "dead")]) >= 1.0,
        "the run killed with -9 is dead"
    );
    let seen: BTreeSet<String> = m
        .keys()
        .filter(|(name, _)| name == "tidemark_worker_last_seen_timestamp_seconds")
        .filter_map(|(_, l)| l.get("worker").cloned())
        .collect();
    let not_stopped: BTreeSet<String> = env
        .db
        .rows("SELECT worker FROM tidemark_v1_workers WHERE state <> 'stopped'")
        .await
        .into_iter()
        .filter_map(|r| r[0].clone())
        .collect();
    assert_eq!(seen, not_stopped);
    assert_eq!(
        value(
            &m,
            "tidemark_build_info",
            &[("version", env!("CARGO_PKG_VERSION"))]
        ),
        1.0
    );

    // Zero-filled for every configured pipeline and source.
    let http = [("pipeline", "http_orders"), ("source", "shop_eu")];
    assert_eq!(
        value(
            &m,
            "tidemark_runs_total",
            &[http[0], http[1], ("outcome", "done")]
        ),
        0.0
    );
    assert_eq!(
        value(&m, "tidemark_rate_limit_wait_seconds_total", &http),
        0.0
    );
    assert_eq!(value(&m, "tidemark_rate_limit_paused", &http), 0.0);

    assert_clean_labels(&m);
    let series = m.len();

    // Ten times the periods (marked done: quick), the same series.
    env.tidemark(&[
        "mark",
        "p",
        "--from",
        "2024-01-13",
        "--to",
        "2024-04-30",
        "--as",
        "skipped",
        "--note",
        "grow",
    ])
    .expect_code(0, "mark 109 more days");
    let again = parse(&must_get(addr, "/metrics").await.body);
    assert!(
        value(
            &again,
            "tidemark_periods",
            &[ps[0], ps[1], ("status", "done")]
        ) >= 120.0
    );
    let names = |m: &BTreeMap<Key, f64>| m.keys().cloned().collect::<BTreeSet<_>>();
    assert_eq!(names(&again), names(&m), "the series are the same set");
    // Marks did not run, and no attempt is counted twice as the scraper
    // reads on from where it stopped.
    for (name, extra) in [
        ("tidemark_runs_total", ("outcome", "done")),
        ("tidemark_runs_total", ("outcome", "lease_lost")),
        ("tidemark_rows_total", ("kind", "read")),
        ("tidemark_retries_total", ("cause", "lease_lost")),
    ] {
        let labels = [ps[0], ps[1], extra];
        assert_eq!(
            value(&again, name, &labels),
            value(&m, name, &labels),
            "{name}{extra:?}"
        );
    }
    assert_eq!(again.len(), series);
    assert_clean_labels(&again);
    serve.signal("TERM");
    serve
        .finish(Duration::from_secs(30))
        .expect_code(0, "serve stops on SIGTERM");
}

/// No label value is a date, a 32-hex run id, a URL or the secret.
fn assert_clean_labels(m: &BTreeMap<Key, f64>) {
    for (name, labels) in m.keys() {
        for value in labels.values() {
            let bytes = value.as_bytes();
            let date = bytes.windows(10).any(|w| {
                w.iter().enumerate().all(|(i, c)| match i {
                    4 | 7 => *c == b'-',
                    _ => c.is_ascii_digit(),
                })
            });
            let run_id = bytes
                .windows(32)
                .any(|w| w.iter().all(|c| c.is_ascii_hexdigit()));
            assert!(!date, "{name}: label value {value:?} holds a date");
            assert!(!run_id, "{name}: label value {value:?} holds a run id");
            assert!(
                !value.contains("://"),
                "{name}: label value {value:?} is a URL"
            );
            assert!(
                !value.contains(SECRET),
                "{name}: label value {value:?} holds the secret"
            );
        }
    }
}

/// Two serves share the ledger; one is killed with SIGKILL: within its
/// lease the other's `/metrics` counts it dead, names it in
/// `tidemark_worker_last_seen_timestamp_seconds`, and its page shows it
/// as a `worker dead` row.
async fn a_killed_serve_is_dead_on_the_other(backend: Backend) {
    let env = Env::new(backend).await;
    env.write("pipelines/p.toml", PIPELINE);
    env.tidemark(&["migrate"]).expect_code(0, "migrate");
    let ttl = Duration::from_secs(2);
    let start = |addr: SocketAddr| {
        env.spawn(&[
            "--lease-ttl",
            "2s",
            "serve",
            "--no-schedule",
            "--listen",
            &addr.to_string(),
            "--metrics-max-age",
            "0s",
        ])
    };
    let (a_addr, b_addr) = (free_addr(), free_addr());
    let a = start(a_addr);
    let b = start(b_addr);
    wait_ready(a_addr, &a).await;
    wait_ready(b_addr, &b).await;
    let m = parse(&must_get(b_addr, "/metrics").await.body);
    assert_eq!(value(&m, "tidemark_workers", &[("state", "live")]), 2.0);
    assert_eq!(value(&m, "tidemark_workers", &[("state", "dead")]), 0.0);
    assert_eq!(must_get(b_addr, "/healthz").await.status, 200);

    let a_pid = a.pid();
    a.kill9();
    let killed = Instant::now();
    let dead = loop {
        let m = parse(&must_get(b_addr, "/metrics").await.body);
        if value(&m, "tidemark_workers", &[("state", "dead")]) == 1.0 {
            break m;
        }
        assert!(
            killed.elapsed() < ttl + Duration::from_secs(3),
            "A not dead on B's /metrics {:?} after SIGKILL",
            killed.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let took = killed.elapsed();
    assert!(
        took <= ttl + Duration::from_millis(1500),
        "dead after {took:?}, lease {ttl:?}"
    );
    assert_eq!(value(&dead, "tidemark_workers", &[("state", "live")]), 1.0);
    let a_marker = format!(":{a_pid}:");
    assert!(
        dead.keys().any(
            |(name, l)| name == "tidemark_worker_last_seen_timestamp_seconds"
                && l.get("worker").is_some_and(|w| w.contains(&a_marker))
        ),
        "A's last seen is still exposed"
    );

    let page = must_get(b_addr, "/").await;
    assert_eq!(page.status, 200);
    let row = page
        .body
        .split("<tr ")
        .find(|r| r.contains("data-worker=") && r.contains(&a_marker))
        .unwrap_or_else(|| panic!("no row for A in the workers panel:\n{}", page.body));
    assert!(row.starts_with("class=\"worker dead\""), "A's row: {row}");
    let b_row = page
        .body
        .split("<tr ")
        .find(|r| r.contains(&format!(":{}:", b.pid())))
        .expect("B's row");
    assert!(
        b_row.starts_with("class=\"worker live\""),
        "B's row: {b_row}"
    );
    assert!(b_row.contains(&format!("<td class=\"pid\">{}</td>", b.pid())));

    b.signal("TERM");
    let b_pid = b.pid();
    b.finish(Duration::from_secs(30))
        .expect_code(0, "B stops on SIGTERM");
    let state = env
        .db
        .rows(&format!(
            "SELECT state FROM tidemark_v1_workers WHERE worker LIKE '%:{b_pid}:%'"
        ))
        .await;
    assert_eq!(
        state,
        vec![vec![Some("stopped".to_string())]],
        "a graceful end is recorded"
    );

    // `prune` keeps the table bounded: workers not seen for longer go.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    env.tidemark(&["prune", "--older-than", "1s"])
        .expect_code(0, "prune");
    let left = env
        .db
        .rows("SELECT CAST(COUNT(*) AS TEXT) FROM _tm_workers")
        .await;
    assert_eq!(
        left,
        vec![vec![Some("0".to_string())]],
        "dead and stopped workers pruned"
    );
}

backend_tests! {
    metrics_equal_the_ledger: metrics_equal_the_ledger_sqlite, metrics_equal_the_ledger_postgres;
    a_killed_serve_is_dead_on_the_other: a_killed_serve_is_dead_on_the_other_sqlite, a_killed_serve_is_dead_on_the_other_postgres;
}

/// A TCP proxy in front of PostgreSQL that the test can stop (every
/// connection dropped, nothing listening) and start again on the same port.
struct Proxy {
    addr: SocketAddr,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Proxy {
    async fn start(addr: SocketAddr) -> Proxy {
        let listener = TcpListener::bind(addr).await.expect("bind the proxy");
        let task = tokio::spawn(async move {
            let mut connections = tokio::task::JoinSet::new();
            loop {
                let Ok((mut client, _)) = listener.accept().await else {
                    continue;
                };
                connections.spawn(async move {
                    if let Ok(mut server) = TcpStream::connect("127.0.0.1:5432").await {
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                    }
                });
            }
        });
        Proxy {
            addr,
            task: Some(task),
        }
    }

    /// Stops listening and drops every connection (the JoinSet aborts
    /// them when the accept task is aborted).
    async fn stop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
            let _ = task.await;
        }
    }
}

/// `/readyz` is 503 within 5 s of PostgreSQL becoming unreachable (a proxy
/// between serve and the server is stopped; the server itself never is)
/// and 200 again once it is back; `/healthz` stays 200 throughout: the
/// loops still turn, and restarting the process would not bring the
/// database back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_follows_an_unreachable_postgres() {
    let env = Env::new(Backend::Postgres).await;
    env.write("pipelines/p.toml", PIPELINE);
    env.tidemark(&["migrate"]).expect_code(0, "migrate");
    let mut proxy = Proxy::start(free_addr()).await;
    let url = env.db.url();
    let through_proxy = url.replacen(":5432/", &format!(":{}/", proxy.addr.port()), 1);
    assert_ne!(
        url, through_proxy,
        "the test database URL names port 5432: {url}"
    );
    let addr = free_addr();
    let serve = env.spawn_at(
        &through_proxy,
        &["serve", "--no-schedule", "--listen", &addr.to_string()],
    );
    wait_ready(addr, &serve).await;
    assert_eq!(must_get(addr, "/healthz").await.status, 200);

    proxy.stop().await;
    let cut = Instant::now();
    loop {
        let ready = must_get(addr, "/readyz").await;
        if ready.status == 503 {
            assert!(ready.body.starts_with("not ready"), "{}", ready.body);
            break;
        }
        assert!(
            cut.elapsed() < Duration::from_secs(5),
            "/readyz still {} after 5 s",
            ready.status
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        cut.elapsed() < Duration::from_secs(5),
        "503 took {:?}",
        cut.elapsed()
    );
    let health = must_get(addr, "/healthz").await;
    assert_eq!(
        health.status, 200,
        "/healthz while the database is away: {}",
        health.body
    );

    let _proxy = Proxy::start(proxy.addr).await;
    let back = Instant::now();
    loop {
        let ready = must_get(addr, "/readyz").await;
        if ready.status == 200 {
            break;
        }
        assert!(
            back.elapsed() < Duration::from_secs(30),
            "/readyz still {}: {}",
            ready.status,
            ready.body
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(must_get(addr, "/healthz").await.status, 200);
    serve.signal("TERM");
    serve
        .finish(Duration::from_secs(30))
        .expect_code(0, "serve stops on SIGTERM");
}
