//! `status --from/--to/--only`: the ledger read over a range, with the
//! periods it has no row for shown as `missing`, in the order of the
//! periods' instants (a DST fall-back day has two 02:00 hours, whose text
//! sorts the wrong way round).

use std::time::{Duration, Instant};

use serde_json::Value as Json;

use crate::support::{backend_tests, Backend, Env, FifoWriter};

backend_tests! {
    status_over_a_range_shows_missing_periods_in_time_order: status_over_a_range_shows_missing_periods_in_time_order_sqlite, status_over_a_range_shows_missing_periods_in_time_order_postgres;
    status_only_selects_one_state: status_only_selects_one_state_sqlite, status_only_selects_one_state_postgres;
    status_period_tells_a_lost_attempt_and_its_resumption: status_period_tells_a_lost_attempt_and_its_resumption_sqlite, status_period_tells_a_lost_attempt_and_its_resumption_postgres;
}

/// Hourly periods in Berlin from two NDJSON sources: `a` needs a file per
/// hour of day (`missing = "error"`), `b` may have none.
fn hourly(env: &Env) {
    env.write(
        "pipelines/clicks.toml",
        r#"name = "clicks"
export_type = "clicks_hourly"

[period]
granularity = "hour"
timezone = "Europe/Berlin"
start = "2024-10-27T00"

[[sources]]
id = "a"
transport = "file"
format = "ndjson"
path = "data/a/{period.start:%H}.ndjson"
missing = "error"

[[sources]]
id = "b"
transport = "file"
format = "ndjson"
path = "data/b/{period.start:%H}.ndjson"
missing = "empty"

[fields]
id = { type = "text", required = true }

[load]
table = "clicks"
key = ["id"]

[retry]
max_attempts = 1
"#,
    );
    for hour in ["01", "02"] {
        env.write(
            format!("pipelines/data/a/{hour}.ndjson"),
            &format!("{{\"id\":\"{hour}\"}}\n"),
        );
    }
}

/// `(period_start, source, status)` of each `status --json` line.
fn lines(env: &Env, args: &[&str]) -> Vec<(String, String, String)> {
    let mut full = vec!["status", "clicks", "--json"];
    full.extend_from_slice(args);
    let out = env.tidemark(&full);
    out.expect_code(0, &full.join(" "));
    out.json_lines()
        .iter()
        .map(|l| {
            (
                field(l, "period_start"),
                field(l, "source"),
                field(l, "status"),
            )
        })
        .collect()
}

fn field(line: &Json, key: &str) -> String {
    line[key].as_str().unwrap_or_default().to_string()
}

fn expect(rows: &[(&str, &str, &str)]) -> Vec<(String, String, String)> {
    rows.iter()
        .map(|(p, s, st)| (p.to_string(), s.to_string(), st.to_string()))
        .collect()
}

async fn status_over_a_range_shows_missing_periods_in_time_order(backend: Backend) {
    let env = Env::new(backend).await;
    hourly(&env);
    // Source a for 01:00 through 03:00: the hour 02 twice (CEST, then
    // CET), 03 has no file and fails.
    env.tidemark(&[
        "backfill",
        "clicks",
        "--source",
        "a",
        "--from",
        "2024-10-27T01",
        "--to",
        "2024-10-27T03",
    ])
    .expect_code(1, "backfill of source a, 03:00 failing");

    let got = lines(&env, &["--from", "2024-10-27T00", "--to", "2024-10-27T04"]);
    assert_eq!(
        got,
        expect(&[
            ("2024-10-27T00:00:00+02:00", "a", "missing"),
            ("2024-10-27T00:00:00+02:00", "b", "missing"),
            ("2024-10-27T01:00:00+02:00", "a", "done"),
            ("2024-10-27T01:00:00+02:00", "b", "missing"),
            ("2024-10-27T02:00:00+02:00", "a", "done"),
            ("2024-10-27T02:00:00+02:00", "b", "missing"),
            ("2024-10-27T02:00:00+01:00", "a", "done"),
            ("2024-10-27T02:00:00+01:00", "b", "missing"),
            ("2024-10-27T03:00:00+01:00", "a", "failed"),
            ("2024-10-27T03:00:00+01:00", "b", "missing"),
            ("2024-10-27T04:00:00+01:00", "a", "missing"),
            ("2024-10-27T04:00:00+01:00", "b", "missing"),
        ]),
    );

    // Without a range the ledger's rows only, still in time order.
    let got = lines(&env, &[]);
    let order: Vec<&str> = got.iter().map(|(p, _, _)| p.as_str()).collect();
    assert_eq!(
        order,
        [
            "2024-10-27T01:00:00+02:00",
            "2024-10-27T02:00:00+02:00",
            "2024-10-27T02:00:00+01:00",
            "2024-10-27T03:00:00+01:00",
        ]
    );

    // A missing line has the fields of a recorded one.
    let out = env.tidemark(&["status", "clicks", "--json", "--period", "2024-10-27T01"]);
    out.expect_code(0, "status of one period");
    let json = out.json_lines();
    let keys = |line: &Json| {
        let mut keys: Vec<String> = line.as_object().expect("object").keys().cloned().collect();
        keys.sort();
        keys
    };
    assert_eq!(json.len(), 2, "{out}");
    assert_eq!(keys(&json[0]), keys(&json[1]), "{out}");
    assert_eq!(json[1]["status"], "missing");
    assert_eq!(json[1]["rows_read"], 0);

    // The table says so too.
    let out = env.tidemark(&[
        "status",
        "clicks",
        "--from",
        "2024-10-27T00",
        "--to",
        "2024-10-27T00",
    ]);
    out.expect_code(0, "status table");
    assert_eq!(
        out.stdout
            .lines()
            .filter(|l| l.contains(" missing "))
            .count(),
        2,
        "{out}"
    );

    // A range that ends before it starts is a usage error.
    env.tidemark(&[
        "status",
        "clicks",
        "--from",
        "2024-10-27T04",
        "--to",
        "2024-10-27T00",
    ])
    .expect_code(2, "--to before --from");
}

async fn status_only_selects_one_state(backend: Backend) {
    let env = Env::new(backend).await;
    hourly(&env);
    env.tidemark(&[
        "backfill",
        "clicks",
        "--from",
        "2024-10-27T01",
        "--to",
        "2024-10-27T03",
    ])
    .expect_code(1, "backfill, source a failing at 03:00");

    assert_eq!(
        lines(&env, &["--only", "failed"]),
        expect(&[("2024-10-27T03:00:00+01:00", "a", "failed")])
    );
    let done = lines(&env, &["--only", "done"]);
    assert_eq!(done.len(), 7, "{done:?}");
    assert!(done.iter().all(|(_, _, s)| s == "done"));
    assert!(lines(&env, &["--only", "pending"]).is_empty());

    // `--only missing` without a range: period.start through the last due
    // hour (TIDEMARK_NOW pins "now" to 06:30 CET: hours 00..05 are due).
    let out = env.tidemark_env(
        &[("TIDEMARK_NOW", "2024-10-27T05:30:00Z")],
        &["status", "clicks", "--json", "--only", "missing"],
    );
    out.expect_code(0, "status --only missing");
    let missing: Vec<(String, String)> = out
        .json_lines()
        .iter()
        .map(|l| (field(l, "period_start"), field(l, "source")))
        .collect();
    let expected: Vec<(String, String)> = [
        ("2024-10-27T00:00:00+02:00", "a"),
        ("2024-10-27T00:00:00+02:00", "b"),
        ("2024-10-27T04:00:00+01:00", "a"),
        ("2024-10-27T04:00:00+01:00", "b"),
        ("2024-10-27T05:00:00+01:00", "a"),
        ("2024-10-27T05:00:00+01:00", "b"),
    ]
    .iter()
    .map(|(p, s)| (p.to_string(), s.to_string()))
    .collect();
    assert_eq!(missing, expected, "{out}");

    // `--only missing` feeds `backfill --only missing`: after it, nothing
    // is missing over the same range.
    env.tidemark(&[
        "backfill",
        "clicks",
        "--from",
        "2024-10-27T00",
        "--to",
        "2024-10-27T05",
        "--only",
        "missing",
    ])
    .expect_code(1, "the hours 00, 04, 05 of source a have no file");
    assert!(lines(
        &env,
        &[
            "--from",
            "2024-10-27T00",
            "--to",
            "2024-10-27T05",
            "--only",
            "missing"
        ]
    )
    .is_empty());
}

/// `status --period` tells the period's story from the attempt history:
/// attempt 1 `lost` (its worker `kill -9`ed after two committed batches),
/// attempt 2 `resumed` from batch 2 and `done`, each with its own worker
/// (pid) and times, and the rejected record of the first batch with its
/// reason, in the table's text and in `--json`.
async fn status_period_tells_a_lost_attempt_and_its_resumption(backend: Backend) {
    let env = Env::new(backend).await;
    env.write(
        "pipelines/p.toml",
        r#"name = "p"
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
"#,
    );
    env.tidemark(&["migrate"]).expect_code(0, "migrate");
    let rows: Vec<String> = (1..=20)
        .map(|i| match i {
            3 => "r03,three".to_string(),
            _ => format!("r{i:02},{i}"),
        })
        .collect();
    let path = env.path("pipelines/data/2024-01-08.csv");
    let fifo = FifoWriter::create(&path);
    let run1 = env.spawn(&["run", "p", "--period", "2024-01-08"]);
    let pid1 = run1.pid().to_string();
    fifo.write(&format!("id,v\n{}\n", rows[..12].join("\n")));
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let batches = if env.db.table_exists("_tm_runs").await {
            env.db.select(&["batches"], "FROM _tm_runs").await
        } else {
            Vec::new()
        };
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
    let run2 = env.spawn(&["run", "p", "--period", "2024-01-08"]);
    let pid2 = run2.pid().to_string();
    run2.finish(Duration::from_secs(60))
        .expect_code(0, "the re-run after kill -9");

    let out = env.tidemark(&["status", "p", "--period", "2024-01-08", "--json"]);
    out.expect_code(0, "status --period --json");
    let lines = out.json_lines();
    assert_eq!(lines.len(), 1, "{out}");
    let line = &lines[0];
    assert_eq!(line["status"], "done", "{line}");
    let history = line["history"].as_array().expect("history");
    assert_eq!(history.len(), 2, "{line}");
    let (a1, a2) = (&history[0], &history[1]);
    assert_eq!(
        (&a1["attempt"], &a1["status"]),
        (&Json::from(1), &Json::from("lost"))
    );
    assert_eq!(a1["resumed"], false);
    assert!(
        a1["finished_at"].is_string(),
        "a lost attempt has its end: {a1}"
    );
    assert_eq!(
        (&a2["attempt"], &a2["status"]),
        (&Json::from(2), &Json::from("done"))
    );
    assert_eq!(
        (&a2["resumed"], &a2["from_batch"]),
        (&Json::from(true), &Json::from(2))
    );
    assert_eq!(a2["rows_read"], 20, "{a2}");
    assert_eq!(a2["rows_rejected"], 1, "{a2}");
    let worker_pid = |a: &Json| {
        a["worker"]
            .as_str()
            .unwrap_or("")
            .split(':')
            .nth(1)
            .map(str::to_string)
    };
    assert_eq!(
        worker_pid(a1),
        Some(pid1.clone()),
        "attempt 1 names the killed worker"
    );
    assert_eq!(
        worker_pid(a2),
        Some(pid2.clone()),
        "attempt 2 names the worker that resumed"
    );
    assert_eq!(line["rejects_total"], 1, "{line}");
    let reject = &line["rejects"][0];
    assert_eq!(
        (&reject["field"], &reject["value"]),
        (&Json::from("v"), &Json::from("three"))
    );
    assert!(
        reject["location"].as_str().is_some_and(|l| l.contains('4')),
        "the file line of r03: {reject}"
    );

    let out = env.tidemark(&["status", "p", "--period", "2024-01-08"]);
    out.expect_code(0, "status --period");
    let attempt_line = |n: &str| {
        out.stdout
            .lines()
            .find(|l| l.trim_start().starts_with(&format!("attempt {n} ")))
            .unwrap_or_else(|| panic!("no attempt {n} line\n{out}"))
            .to_string()
    };
    let (l1, l2) = (attempt_line("1"), attempt_line("2"));
    assert!(
        l1.contains("lost") && l1.contains(&format!("pid {pid1}")),
        "{l1}"
    );
    assert!(
        l2.contains("done") && l2.contains(&format!("pid {pid2}")),
        "{l2}"
    );
    assert!(l2.contains("resumed from batch 2"), "{l2}");
    assert!(out.stdout.contains("rejected 1 record(s):"), "{out}");
    assert!(out.stdout.contains("field v, value \"three\""), "{out}");

    // Other commands' output is unchanged: only `--period` adds a story.
    let out = env.tidemark(&["status", "p", "--json"]);
    assert!(out.json_lines()[0].get("history").is_none(), "{out}");
}
