//! `status --from/--to/--only`: the ledger read over a range, with the
//! periods it has no row for shown as `missing`, in the order of the
//! periods' instants (a DST fall-back day has two 02:00 hours, whose text
//! sorts the wrong way round).

use std::time::{Duration, Instant};

use serde_json::Value as Json;

use crate::support::{backend_tests, Backend, Env, FifoWriter, BIN};

backend_tests! {
    status_over_a_range_shows_missing_periods_in_time_order: status_over_a_range_shows_missing_periods_in_time_order_sqlite, status_over_a_range_shows_missing_periods_in_time_order_postgres;
    status_only_selects_one_state: status_only_selects_one_state_sqlite, status_only_selects_one_state_postgres;
    status_period_tells_a_lost_attempt_and_its_resumption: status_period_tells_a_lost_attempt_and_its_resumption_sqlite, status_period_tells_a_lost_attempt_and_its_resumption_postgres;
    status_summary_counts_the_table_and_tells_freshness: status_summary_counts_the_table_and_tells_freshness_sqlite, status_summary_counts_the_table_and_tells_freshness_postgres;
    status_calendar_has_one_cell_per_period: status_calendar_has_one_cell_per_period_sqlite, status_calendar_has_one_cell_per_period_postgres;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_on_a_terminal_draws_the_calendar_in_colour_unless_no_color() {
    status_on_a_terminal_draws_the_calendar_in_colour_unless_no_color_run().await;
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

// ---------------------------------------------------------------------------
// The summary line and the calendar (issue 21 item 3)
// ---------------------------------------------------------------------------

/// "Now" of the daily tests: 2024-01-01 through 2024-01-11 are due (lag
/// 1 h), 2024-01-12 is not.
const DAILY_NOW: &str = "2024-01-12T12:00:00Z";

/// A daily pipeline whose day files must exist, with a ledger of every
/// kind of day over 2024-01-01..14: done (01, 02, 04, 05, 08), failed
/// (03 and 09: no file), marked skipped (06), never run (07, 10, 11:
/// missing) and not due (12, 13, 14).
async fn daily_ledger(backend: Backend) -> Env {
    let mut env = Env::new(backend).await;
    env.set_var("TIDEMARK_NOW", DAILY_NOW);
    env.write(
        "pipelines/d.toml",
        r#"name = "d"
export_type = "t"

[period]
granularity = "day"
timezone = "UTC"
start = "2024-01-01"
lag = "1h"

[[sources]]
id = "s"
transport = "file"
format = "csv"
path = "data/{period.start:%Y-%m-%d}.csv"
missing = "error"

[fields]
id = { type = "text", required = true }

[load]
table = "d"
key = ["id"]

[retry]
max_attempts = 1
"#,
    );
    for day in ["01", "02", "04", "05", "08"] {
        env.write(
            format!("pipelines/data/2024-01-{day}.csv"),
            &format!("id\n{day}-a\n{day}-b\n"),
        );
    }
    for (from, to) in [("2024-01-01", "2024-01-05"), ("2024-01-08", "2024-01-09")] {
        env.tidemark(&["backfill", "d", "--from", from, "--to", to])
            .expect_code(1, "a day without its file fails");
    }
    env.tidemark(&[
        "mark",
        "d",
        "--period",
        "2024-01-06",
        "--as",
        "skipped",
        "--note",
        "closed",
    ])
    .expect_code(0, "mark");
    env
}

/// The STATUS column of each table line, by period start's day.
fn table_states(stdout: &str) -> Vec<(String, String)> {
    stdout
        .lines()
        .filter(|l| l.starts_with("2024-"))
        .map(|l| {
            let mut words = l.split_whitespace();
            let start = words.next().unwrap_or_default();
            let state = words.nth(1).unwrap_or_default();
            (start[..10].to_string(), state.to_string())
        })
        .collect()
}

/// The number before `what` in the summary line (`3 done`, `2 missing`).
fn summary_count(summary: &str, what: &str) -> usize {
    let at = summary
        .find(&format!(" {what}"))
        .unwrap_or_else(|| panic!("no {what:?} in {summary}"));
    summary[..at]
        .rsplit(|c: char| !c.is_ascii_digit())
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no count before {what:?} in {summary}"))
}

fn summary_line(stdout: &str) -> String {
    let summaries: Vec<&str> = stdout
        .lines()
        .filter(|l| l.starts_with("summary: "))
        .collect();
    assert_eq!(summaries.len(), 1, "one summary line\n{stdout}");
    assert!(
        stdout.trim_end().ends_with(summaries[0]),
        "the summary is the last line\n{stdout}"
    );
    summaries[0].to_string()
}

async fn status_summary_counts_the_table_and_tells_freshness(backend: Backend) {
    let env = daily_ledger(backend).await;
    let range = ["status", "d", "--from", "2024-01-01", "--to", "2024-01-14"];
    let out = env.tidemark(&range);
    out.expect_code(0, "status over the range");
    let states = table_states(&out.stdout);
    let day = |d: &str| {
        states
            .iter()
            .find(|(start, _)| start == d)
            .map(|(_, s)| s.as_str())
            .unwrap_or_else(|| panic!("no line for {d}\n{out}"))
    };
    assert_eq!(states.len(), 14, "one line per day\n{out}");
    assert_eq!(day("2024-01-07"), "missing", "never run and due\n{out}");
    assert_eq!(day("2024-01-11"), "missing", "{out}");
    assert_eq!(day("2024-01-12"), "not_due", "{out}");
    assert_eq!(day("2024-01-03"), "failed", "{out}");
    assert_eq!(day("2024-01-06"), "done", "marked: a done row\n{out}");

    // The summary's counts are the table's.
    let summary = summary_line(&out.stdout);
    let count = |state: &str| states.iter().filter(|(_, s)| s == state).count();
    assert_eq!(
        summary_count(&summary, "run key(s)"),
        states.len(),
        "{summary}"
    );
    for (table, said) in [
        ("done", "done ("),
        ("failed", "failed ("),
        ("running", "running,"),
        ("pending", "pending,"),
        ("cancelled", "cancelled,"),
        ("missing", "missing,"),
        ("not_due", "not due;"),
    ] {
        assert_eq!(
            summary_count(&summary, said),
            count(table),
            "{table} in {summary}\n{out}"
        );
    }
    assert_eq!(
        (
            count("done"),
            count("failed"),
            count("missing"),
            count("not_due")
        ),
        (6, 2, 3, 3),
        "{out}"
    );
    assert_eq!(summary_count(&summary, "marked"), 1, "{summary}");
    assert_eq!(
        summary_count(&summary, "backing off"),
        2,
        "both failures are within their back-off: {summary}"
    );
    // Done without a gap through 02 (03 failed): now (12T12:00) minus the
    // end of 02 (03T00:00).
    assert!(
        summary.ends_with("freshness 9d 12h (every period done through 2024-01-03T00:00:00Z)"),
        "{summary}"
    );

    // `--only failed` lists exactly the failed days; the summary counts
    // those lines, the freshness stays the range's.
    let mut only = range.to_vec();
    only.extend(["--only", "failed"]);
    let out = env.tidemark(&only);
    out.expect_code(0, "status --only failed");
    let failed: Vec<(String, String)> = table_states(&out.stdout);
    assert_eq!(
        failed,
        [
            ("2024-01-03".to_string(), "failed".to_string()),
            ("2024-01-09".to_string(), "failed".to_string())
        ],
        "{out}"
    );
    let summary = summary_line(&out.stdout);
    assert_eq!(summary_count(&summary, "run key(s)"), 2, "{summary}");
    assert_eq!(summary_count(&summary, "failed ("), 2, "{summary}");
    assert_eq!(summary_count(&summary, "done ("), 0, "{summary}");
    assert!(
        summary.contains("done through 2024-01-03T00:00:00Z"),
        "{summary}"
    );
    only.push("--json");
    let out = env.tidemark(&only);
    out.expect_code(0, "status --only failed --json");
    let json = out.json_lines();
    let days: Vec<&str> = json
        .iter()
        .map(|l| l["period_start"].as_str().unwrap_or_default())
        .collect();
    assert_eq!(
        days,
        ["2024-01-03T00:00:00Z", "2024-01-09T00:00:00Z"],
        "--json: one object per run key, no summary\n{out}"
    );
    assert!(json.iter().all(|l| l["status"] == "failed"), "{out}");

    // Without a range (the ledger's rows only) the summary is there too.
    let out = env.tidemark(&["status", "d"]);
    out.expect_code(0, "status of the ledger");
    let summary = summary_line(&out.stdout);
    assert_eq!(summary_count(&summary, "run key(s)"), 8, "{summary}");
}

/// The calendar's rows: `(label, cells)` between its column header and
/// its legend, each cell the glyph in its two columns (`' '` for none).
fn calendar_rows(stdout: &str) -> Vec<(String, Vec<char>)> {
    let mut lines = stdout
        .lines()
        .skip_while(|l| !l.starts_with("calendar of d"));
    assert!(lines.next().is_some(), "a calendar\n{stdout}");
    let header = lines.next().unwrap_or_default();
    assert!(header.trim_start().starts_with("Mo Tu We"), "{stdout}");
    lines
        .take_while(|l| !l.trim_start().starts_with("legend:"))
        .map(|l| {
            let label = l[2..12].to_string();
            let cells = l.as_bytes()[14..]
                .chunks(3)
                .map(|cell| char::from(cell[1]))
                .collect();
            (label, cells)
        })
        .collect()
}

async fn status_calendar_has_one_cell_per_period(backend: Backend) {
    let env = daily_ledger(backend).await;
    let range = ["status", "d", "--from", "2024-01-01", "--to", "2024-01-14"];

    // Not a terminal: no calendar unless asked for.
    let out = env.tidemark(&range);
    assert!(!out.stdout.contains("calendar of"), "{out}");

    let mut forced = range.to_vec();
    forced.extend(["--calendar", "always", "--color", "never"]);
    let out = env.tidemark(&forced);
    out.expect_code(0, "status --calendar always");
    assert!(!out.stdout.contains('\x1b'), "no colours\n{out}");
    let rows = calendar_rows(&out.stdout);
    // 2024-01-01 is a Monday: two full weeks.
    let labels: Vec<&str> = rows.iter().map(|(l, _)| l.as_str()).collect();
    assert_eq!(labels, ["2024-01-01", "2024-01-08"], "{out}");
    let cells: Vec<char> = rows.iter().flat_map(|(_, c)| c.clone()).collect();
    assert_eq!(
        cells.iter().filter(|c| **c != ' ').count(),
        14,
        "one cell per period\n{out}"
    );
    let cell = |day: usize| cells[day - 1];
    assert!(
        matches!(cell(3), 'F' | 'f'),
        "03 failed: {:?}\n{out}",
        cell(3)
    );
    assert!(matches!(cell(9), 'F' | 'f'), "09 failed\n{out}");
    for (day, glyph) in [(1, '#'), (6, 'M'), (7, '?'), (11, '?'), (12, '.')] {
        assert_eq!(cell(day), glyph, "2024-01-{day:02}\n{out}");
    }
    let failed_cells = cells.iter().filter(|c| matches!(c, 'F' | 'f')).count();
    assert_eq!(failed_cells, 2, "exactly the failed days\n{out}");
    let legend: String = out
        .stdout
        .lines()
        .skip_while(|l| !l.trim_start().starts_with("legend:"))
        .take(2)
        .collect();
    for entry in [
        "# done",
        "M marked",
        "F failed",
        "f failed, backing off",
        "? missing",
        ". not due",
    ] {
        assert!(legend.contains(entry), "{entry:?} in {legend}");
    }
    // The table and its summary follow the calendar.
    assert_eq!(table_states(&out.stdout).len(), 14, "{out}");
    summary_line(&out.stdout);

    // Forced colours: each cell a chip; the failed one red.
    let mut coloured = range.to_vec();
    coloured.extend(["--calendar", "always", "--color", "always"]);
    let out = env.tidemark(&coloured);
    out.expect_code(0, "status --color always");
    assert!(
        out.stdout.contains("\x1b[30;42m #\x1b[0m"),
        "a done chip\n{out}"
    );
    assert!(
        out.stdout.contains("\x1b[30;101m f\x1b[0m") || out.stdout.contains("\x1b[97;41m F\x1b[0m"),
        "a failed chip\n{out}"
    );
}

/// Runs `status d ARGS` with stdout on a terminal (a pty of `script`),
/// with `NO_COLOR` set when `no_color`; what the terminal showed.
fn on_terminal(env: &Env, no_color: bool, args: &[&str]) -> String {
    let command = format!(
        "{BIN} --database-url '{}' status d {}",
        env.db.url(),
        args.join(" ")
    );
    let mut script = std::process::Command::new("script");
    script
        .args(["-qec", &command, "/dev/null"])
        .current_dir(env.path(""))
        .env("TIDEMARK_NOW", DAILY_NOW)
        .env_remove("TIDEMARK_DATABASE_URL")
        .env_remove("NO_COLOR")
        .stdin(std::process::Stdio::null());
    if no_color {
        script.env("NO_COLOR", "1");
    }
    let out = script.output().expect("script (util-linux) runs");
    assert!(out.status.success(), "{out:?}");
    String::from_utf8_lossy(&out.stdout).replace("\r\n", "\n")
}

/// On a terminal, a range gets its calendar without being asked, in
/// colour; `NO_COLOR` keeps the calendar and drops the colours; a single
/// period gets none.
async fn status_on_a_terminal_draws_the_calendar_in_colour_unless_no_color_run() {
    let env = daily_ledger(Backend::Sqlite).await;
    let range = ["--from", "2024-01-01", "--to", "2024-01-14"];
    let shown = on_terminal(&env, false, &range);
    assert!(shown.contains("calendar of d, source s:"), "{shown}");
    assert!(
        shown.contains("\x1b[30;42m #\x1b[0m"),
        "a done chip\n{shown}"
    );
    assert_eq!(calendar_rows(&strip_colours(&shown)).len(), 2, "{shown}");

    let plain = on_terminal(&env, true, &range);
    assert!(plain.contains("calendar of d, source s:"), "{plain}");
    assert!(!plain.contains('\x1b'), "NO_COLOR: letters only\n{plain}");
    let cells: usize = calendar_rows(&plain)
        .iter()
        .map(|(_, c)| c.iter().filter(|c| **c != ' ').count())
        .sum();
    assert_eq!(cells, 14, "{plain}");

    let one = on_terminal(&env, false, &["--period", "2024-01-03"]);
    assert!(!one.contains("calendar of"), "{one}");
    assert!(one.contains("summary: 1 run key(s)"), "{one}");
}

/// `text` without its ANSI SGR sequences (`ESC [ ... m`).
fn strip_colours(text: &str) -> String {
    let mut plain = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\x1b' {
            chars.by_ref().find(|c| *c == 'm');
        } else {
            plain.push(c);
        }
    }
    plain
}
