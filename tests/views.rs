//! The stable SQL views `tidemark_v1_periods` and `tidemark_v1_attempts`
//! (docs/ledger.md "Stable views", migration 0008) and the one summary line
//! each finished run logs (README "Watching it").
//!
//! The views are a promise to dashboards and SQL exporters: their columns
//! are checked against a list written here, and their rows against what
//! `status --json` says. The summary line is read back from
//! `--log-format json` and checked against the ledger.

use std::collections::BTreeMap;
use std::path::PathBuf;

use chrono::{DateTime, SecondsFormat, Utc};
use serde_json::Value as Json;

use crate::support::{backend_tests, Backend, Csv, Env, Out};

backend_tests! {
    views_say_what_status_says: views_say_what_status_says_sqlite, views_say_what_status_says_postgres;
    views_keep_their_columns: views_keep_their_columns_sqlite, views_keep_their_columns_postgres;
    run_summary_line_carries_every_count: run_summary_line_carries_every_count_sqlite, run_summary_line_carries_every_count_postgres;
}

/// `tidemark_v1_periods`, column by column: name, PostgreSQL type
/// (`information_schema.columns.data_type`), SQLite declared type
/// (`pragma_table_info`; empty for a computed column).
const PERIODS: &[(&str, &str, &str)] = &[
    ("pipeline", "text", "TEXT"),
    ("source", "text", "TEXT"),
    ("export_type", "text", "TEXT"),
    ("period_start", "text", "TEXT"),
    ("period_end", "text", "TEXT"),
    ("status", "text", "TEXT"),
    ("attempts", "bigint", "INTEGER"),
    ("run_id", "text", "TEXT"),
    ("batches", "bigint", "INTEGER"),
    ("rows_read", "bigint", "INTEGER"),
    ("rows_inserted", "bigint", "INTEGER"),
    ("rows_updated", "bigint", "INTEGER"),
    ("rows_unchanged", "bigint", "INTEGER"),
    ("rows_deleted", "bigint", "INTEGER"),
    ("rows_rejected", "bigint", "INTEGER"),
    ("rows_superseded", "bigint", "INTEGER"),
    ("rows_expected", "bigint", "INTEGER"),
    ("error_class", "text", "TEXT"),
    ("error_message", "text", "TEXT"),
    ("handler_version", "text", "TEXT"),
    ("provisional", "boolean", ""),
    ("priority", "bigint", "INTEGER"),
    ("enqueued_at", "timestamp with time zone", "TEXT"),
    ("enqueued_by", "text", "TEXT"),
    ("not_before", "timestamp with time zone", "TEXT"),
    ("failures", "bigint", "INTEGER"),
    ("lease_owner", "text", "TEXT"),
    ("lease_host", "text", "TEXT"),
    ("lease_pid", "bigint", "INTEGER"),
    ("lease_expires_at", "timestamp with time zone", "TEXT"),
    ("started_at", "timestamp with time zone", "TEXT"),
    ("finished_at", "timestamp with time zone", "TEXT"),
    ("created_at", "timestamp with time zone", "TEXT"),
    ("updated_at", "timestamp with time zone", "TEXT"),
    ("marked", "text", "TEXT"),
    ("mark_note", "text", "TEXT"),
];

/// `tidemark_v1_workers`, as [`PERIODS`].
const WORKERS: &[(&str, &str, &str)] = &[
    ("worker", "text", "TEXT"),
    ("host", "text", "TEXT"),
    ("pid", "bigint", "INTEGER"),
    ("version", "text", "TEXT"),
    ("kind", "text", "TEXT"),
    ("slots", "bigint", "INTEGER"),
    ("lease_ttl_ms", "bigint", "INTEGER"),
    ("heartbeat_ms", "bigint", "INTEGER"),
    ("started_at", "timestamp with time zone", "TEXT"),
    ("last_seen", "timestamp with time zone", "TEXT"),
    ("stopped_at", "timestamp with time zone", "TEXT"),
    ("state", "text", ""),
];

/// `tidemark_v1_attempts`, as [`PERIODS`].
const ATTEMPTS: &[(&str, &str, &str)] = &[
    ("pipeline", "text", "TEXT"),
    ("source", "text", "TEXT"),
    ("export_type", "text", "TEXT"),
    ("period_start", "text", "TEXT"),
    ("period_end", "text", "TEXT"),
    ("attempt", "bigint", "INTEGER"),
    ("run_id", "text", "TEXT"),
    ("worker", "text", "TEXT"),
    ("status", "text", "TEXT"),
    ("resumed", "boolean", "INTEGER"),
    ("from_batch", "bigint", "INTEGER"),
    ("rows_read", "bigint", "INTEGER"),
    ("rows_inserted", "bigint", "INTEGER"),
    ("rows_updated", "bigint", "INTEGER"),
    ("rows_unchanged", "bigint", "INTEGER"),
    ("rows_deleted", "bigint", "INTEGER"),
    ("rows_rejected", "bigint", "INTEGER"),
    ("rows_superseded", "bigint", "INTEGER"),
    ("rows_expected", "bigint", "INTEGER"),
    ("error_class", "text", "TEXT"),
    ("error_message", "text", "TEXT"),
    ("started_at", "timestamp with time zone", "TEXT"),
    ("finished_at", "timestamp with time zone", "TEXT"),
    ("duration_ms", "bigint", "INT"),
    ("marked", "text", "TEXT"),
    ("mark_note", "text", "TEXT"),
];

/// `status --json` fields that are not the ledger's but worked out from
/// the pipeline file and the clock, so no view can hold them.
const DERIVED: &[&str] = &["stale", "stale_reason", "due_at"];

/// The count fields of a run summary line, as the ledger names them.
const COUNTS: &[&str] = &[
    "rows_read",
    "rows_inserted",
    "rows_updated",
    "rows_unchanged",
    "rows_deleted",
    "rows_rejected",
    "rows_superseded",
    "batches",
];

fn day_csv(env: &Env, d: u32) -> PathBuf {
    env.path(format!("pipelines/data/orders/2024/01/{d:02}/orders.csv"))
}

/// A view's columns in order, with their types, as the database reports them.
async fn columns(env: &Env, view: &str) -> Vec<(String, String)> {
    let sql = match env.backend() {
        Backend::Sqlite => {
            format!("SELECT name, type FROM pragma_table_info('{view}') ORDER BY cid")
        }
        Backend::Postgres => format!(
            "SELECT CAST(column_name AS TEXT), CAST(data_type AS TEXT) FROM information_schema.columns
             WHERE table_name = '{view}' ORDER BY ordinal_position"
        ),
    };
    env.db
        .rows(&sql)
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

/// The rows of a view (`rest`: `WHERE ... ORDER BY ...`), each a map from
/// column to its value as text (NULL as `None`).
async fn view_rows(
    env: &Env,
    view: &str,
    spec: &[(&str, &str, &str)],
    rest: &str,
) -> Vec<BTreeMap<String, Option<String>>> {
    let names: Vec<&str> = spec.iter().map(|c| c.0).collect();
    env.db
        .select(&names, &format!("FROM {view} {rest}"))
        .await
        .into_iter()
        .map(|row| {
            names
                .iter()
                .map(|n| (*n).to_string())
                .zip(row)
                .collect::<BTreeMap<_, _>>()
        })
        .collect()
}

/// Whether a column holds a time (stored as `timestamptz` on PostgreSQL).
fn is_time(column: &str) -> bool {
    column.ends_with("_at") || column == "not_before"
}

/// A time as the ledger's text form (RFC 3339, UTC, milliseconds): what
/// `status` prints, whichever way the database renders it.
fn millis(text: &str) -> String {
    let parsed = DateTime::parse_from_rfc3339(text)
        .or_else(|_| DateTime::parse_from_str(text, "%Y-%m-%d %H:%M:%S%.f%#z"))
        .unwrap_or_else(|e| panic!("{text:?} is not a time: {e}"));
    parsed
        .with_timezone(&Utc)
        .to_rfc3339_opts(SecondsFormat::Millis, true)
}

/// A view's cell as the JSON `status --json` would print for it.
fn as_status_json(column: &str, cell: &Option<String>, status_value: &Json) -> Json {
    let Some(text) = cell else {
        return Json::Null;
    };
    match status_value {
        Json::Bool(_) => Json::Bool(match text.as_str() {
            "1" | "true" | "t" => true,
            "0" | "false" | "f" => false,
            other => panic!("{column}: {other:?} is no flag"),
        }),
        Json::Number(_) => Json::Number(
            text.parse()
                .unwrap_or_else(|e| panic!("{column}: {text:?} is no number: {e}")),
        ),
        Json::String(_) if is_time(column) => Json::String(millis(text)),
        _ => Json::String(text.clone()),
    }
}

/// A backfill with one failed day and one day run twice: every run key's
/// row of `tidemark_v1_periods` says what `status --json` says, field by
/// field (every field of `status --json` that is the ledger's is a column
/// of the view), and `tidemark_v1_attempts` holds each key's attempts, the
/// last one ending as the key did.
async fn views_say_what_status_says(backend: Backend) {
    let env = Env::orders(backend).await;
    let mut csv = Csv::read(&day_csv(&env, 3));
    csv.set("O-20240103-004", "total", "oops");
    csv.write(&day_csv(&env, 3));
    env.backfill_orders(1, 5)
        .expect_code(1, "backfill with day 3 broken");
    env.tidemark(&["run", "orders", "--period", "2024-01-02", "--force"])
        .expect_code(0, "day 2 again, forced");

    let status = env.status("orders");
    assert_eq!(status.len(), 5, "{status:?}");
    let failed: Vec<&Json> = status.iter().filter(|l| l["status"] == "failed").collect();
    assert_eq!(failed.len(), 1, "one failed day: {status:?}");
    assert!(failed[0]["error_class"].is_string(), "{:?}", failed[0]);

    let periods = view_rows(
        &env,
        "tidemark_v1_periods",
        PERIODS,
        "ORDER BY source, period_start",
    )
    .await;
    assert_eq!(periods.len(), status.len(), "one view row per run key");
    for line in &status {
        let key = (line["source"].as_str(), line["period_start"].as_str());
        let row = periods
            .iter()
            .find(|r| (r["source"].as_deref(), r["period_start"].as_deref()) == key)
            .unwrap_or_else(|| panic!("no view row for {key:?}: {periods:?}"));
        let Json::Object(fields) = line else {
            panic!("status line is no object: {line}");
        };
        for (field, said) in fields {
            if DERIVED.contains(&field.as_str()) {
                continue;
            }
            let cell = row.get(field).unwrap_or_else(|| {
                panic!("`status --json` field {field} is no column of tidemark_v1_periods")
            });
            assert_eq!(
                &as_status_json(field, cell, said),
                said,
                "{key:?}: column {field} is {cell:?}, status says {said}"
            );
        }
    }

    let attempts = view_rows(
        &env,
        "tidemark_v1_attempts",
        ATTEMPTS,
        "ORDER BY source, period_start, attempt",
    )
    .await;
    for line in &status {
        let key = (line["source"].as_str(), line["period_start"].as_str());
        let mine: Vec<_> = attempts
            .iter()
            .filter(|r| (r["source"].as_deref(), r["period_start"].as_deref()) == key)
            .collect();
        let numbers: Vec<i64> = mine
            .iter()
            .map(|r| r["attempt"].as_deref().unwrap().parse().unwrap())
            .collect();
        let expected: Vec<i64> = (1..=line["attempts"].as_i64().unwrap()).collect();
        assert_eq!(numbers, expected, "{key:?}: attempts {mine:?}");
        let last = mine.last().unwrap();
        for field in [
            "status",
            "run_id",
            "error_class",
            "error_message",
            "period_end",
        ] {
            assert_eq!(
                as_status_json(field, &last[field], &line[field]),
                line[field],
                "{key:?}: the last attempt's {field}"
            );
        }
        if line["status"] == "done" {
            for field in COUNTS.iter().filter(|c| **c != "batches") {
                assert_eq!(
                    last[*field].as_deref(),
                    Some(line[*field].to_string().as_str()),
                    "{key:?}: the last attempt's {field}"
                );
            }
        }
        for attempt in &mine {
            assert!(
                attempt["worker"].as_deref().is_some_and(|w| !w.is_empty()),
                "{attempt:?}"
            );
            let ms: i64 = attempt["duration_ms"]
                .as_deref()
                .unwrap_or_else(|| panic!("a finished attempt has a duration: {attempt:?}"))
                .parse()
                .unwrap();
            let (start, end) = (
                millis(attempt["started_at"].as_deref().unwrap()),
                millis(attempt["finished_at"].as_deref().unwrap()),
            );
            let span = DateTime::parse_from_rfc3339(&end).unwrap()
                - DateTime::parse_from_rfc3339(&start).unwrap();
            assert!(
                (ms - span.num_milliseconds()).abs() <= 1 && ms >= 0,
                "duration_ms {ms} is finished_at - started_at ({start} .. {end})"
            );
        }
    }
    // Day 2 ran twice: a fresh start, not a resume.
    let day2: Vec<_> = attempts
        .iter()
        .filter(|r| r["period_start"].as_deref() == Some("2024-01-02T00:00:00+01:00"))
        .collect();
    assert_eq!(day2.len(), 2, "{attempts:?}");
    assert_eq!(day2[0]["status"].as_deref(), Some("done"));
    assert!(
        matches!(day2[1]["resumed"].as_deref(), Some("0" | "false")),
        "{day2:?}"
    );
}

/// The views' columns, in order and with their types, are the list above
/// on both databases: a dashboard written against v1 keeps working. A
/// column may only be added at the end (and to the list); a rename, a
/// removal, a new order or another type fails here.
async fn views_keep_their_columns(backend: Backend) {
    let env = Env::orders(backend).await;
    env.tidemark(&["migrate"]).expect_code(0, "migrate");
    for (view, spec) in [
        ("tidemark_v1_periods", PERIODS),
        ("tidemark_v1_attempts", ATTEMPTS),
        ("tidemark_v1_workers", WORKERS),
    ] {
        let expected: Vec<(String, String)> = spec
            .iter()
            .map(|(name, pg, sqlite)| {
                let ty = match backend {
                    Backend::Sqlite => sqlite,
                    Backend::Postgres => pg,
                };
                ((*name).to_string(), (*ty).to_string())
            })
            .collect();
        assert_eq!(columns(&env, view).await, expected, "{view}");
    }
    // Readable, and empty, before anything ran.
    assert_eq!(env.db.count("FROM tidemark_v1_periods").await, 0);
    assert_eq!(env.db.count("FROM tidemark_v1_attempts").await, 0);
    assert_eq!(env.db.count("FROM tidemark_v1_workers").await, 0);
}

/// The JSON log lines of a run on stderr.
fn log_lines(out: &Out) -> Vec<Json> {
    out.stderr
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("bad JSON log line ({e}): {l}")))
        .collect()
}

/// The one line whose message is `message`, checked to be the only one.
#[track_caller]
fn the_line<'a>(lines: &'a [Json], message: &str, out: &Out) -> &'a Json {
    let found: Vec<&Json> = lines
        .iter()
        .filter(|l| l["fields"]["message"] == message)
        .collect();
    assert_eq!(found.len(), 1, "exactly one `{message}` line\n{out}");
    assert!(
        lines
            .iter()
            .filter(|l| ["run done", "run failed"]
                .contains(&l["fields"]["message"].as_str().unwrap_or("")))
            .count()
            == 1,
        "one run, one summary line\n{out}"
    );
    found[0]
}

/// The ledger's counts of one day's key, from `tidemark_v1_periods`.
async fn ledger_counts(env: &Env, d: u32) -> BTreeMap<String, Option<String>> {
    let start = format!("2024-01-{d:02}T00:00:00+01:00");
    let mut rows = view_rows(
        env,
        "tidemark_v1_periods",
        PERIODS,
        &format!("WHERE period_start = '{start}'"),
    )
    .await;
    assert_eq!(rows.len(), 1, "{rows:?}");
    rows.remove(0)
}

/// Checks a summary line's counts against the ledger's row of its key, and
/// its duration against the process's whole run time.
fn check_summary(line: &Json, ledger: &BTreeMap<String, Option<String>>, out: &Out) {
    let fields = &line["fields"];
    for count in COUNTS {
        let logged = fields[*count]
            .as_u64()
            .unwrap_or_else(|| panic!("no count {count} in {line}"));
        let stored: u64 = ledger[*count].as_deref().unwrap().parse().unwrap();
        assert_eq!(logged, stored, "{count}: logged {line}, ledger {ledger:?}");
    }
    // No `expect_count`: nothing declared, nothing logged.
    assert!(ledger["rows_expected"].is_none());
    assert!(fields.get("rows_expected").is_none(), "{line}");
    let ms = fields["duration_ms"]
        .as_u64()
        .unwrap_or_else(|| panic!("no duration_ms in {line}"));
    assert!(
        u128::from(ms) <= out.elapsed.as_millis(),
        "the run took {ms} ms of a process that ran {:?}: {line}",
        out.elapsed
    );
    assert_eq!(fields["resumed"], false, "{line}");
    for (name, value) in [
        ("pipeline", "orders"),
        ("source", "archive"),
        ("export_type", "orders_daily"),
    ] {
        assert_eq!(line["span"][name], value, "{line}");
    }
    assert_eq!(
        line["span"]["run_id"].as_str(),
        ledger["run_id"].as_deref(),
        "{line}"
    );
}

/// With `--log-format json`, a run's `run done` / `run failed` line holds
/// every count (read, inserted, updated, unchanged, deleted, rejected,
/// superseded, batches) and `duration_ms` as fields of their own, equal to
/// what the ledger recorded: a done re-run with an update, a deletion and
/// a reject over several batches, and a failed day.
async fn run_summary_line_carries_every_count(backend: Backend) {
    let env = Env::orders(backend).await;
    env.set_option("orders", "load", "batch_size", "6");
    env.set_option("orders", "load", "max_rejects", "1");
    env.tidemark(&["run", "orders", "--period", "2024-01-01"])
        .expect_code(0, "day 1");

    // Day 1 again: one row changed, one gone, one bad (within max_rejects).
    let mut csv = Csv::read(&day_csv(&env, 1));
    csv.set("O-20240101-001", "note", "changed");
    csv.remove("O-20240101-002");
    csv.set("O-20240101-003", "total", "oops");
    csv.write(&day_csv(&env, 1));
    let out = env.tidemark(&[
        "--log-format",
        "json",
        "run",
        "orders",
        "--period",
        "2024-01-01",
        "--force",
    ]);
    out.expect_code(0, "day 1 again");
    let lines = log_lines(&out);
    let done = the_line(&lines, "run done", &out);
    assert_eq!(done["fields"]["outcome"], "done", "{done}");
    let ledger = ledger_counts(&env, 1).await;
    check_summary(done, &ledger, &out);
    // The counts are the run's own, not zeros that happen to agree.
    let fields = &done["fields"];
    assert_eq!(fields["rows_read"], 19, "{done}");
    assert_eq!(fields["rows_rejected"], 1, "{done}");
    assert_eq!(fields["rows_updated"], 1, "{done}");
    // The gone row at least (the rejected one's key was not seen either).
    assert!(fields["rows_deleted"].as_u64() >= Some(1), "{done}");
    assert_eq!(fields["rows_unchanged"], 17, "{done}");
    assert_eq!(fields["batches"], 4, "19 records in batches of 6: {done}");

    // A failed day: two bad rows, one more than max_rejects.
    let mut csv = Csv::read(&day_csv(&env, 3));
    csv.set("O-20240103-004", "total", "oops");
    csv.set("O-20240103-005", "total", "oops");
    csv.write(&day_csv(&env, 3));
    let out = env.tidemark(&[
        "--log-format",
        "json",
        "run",
        "orders",
        "--period",
        "2024-01-03",
    ]);
    out.expect_code(1, "day 3 fails");
    let lines = log_lines(&out);
    let failed = the_line(&lines, "run failed", &out);
    assert_eq!(failed["fields"]["outcome"], "failed", "{failed}");
    let ledger = ledger_counts(&env, 3).await;
    assert_eq!(ledger["status"].as_deref(), Some("failed"));
    check_summary(failed, &ledger, &out);
    assert_eq!(
        failed["fields"]["error_class"].as_str(),
        ledger["error_class"].as_deref(),
        "{failed}"
    );
    assert!(failed["fields"]["error"].is_string(), "{failed}");
}
