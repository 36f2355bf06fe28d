//! `status --from/--to/--only`: the ledger read over a range, with the
//! periods it has no row for shown as `missing`, in the order of the
//! periods' instants (a DST fall-back day has two 02:00 hours, whose text
//! sorts the wrong way round).

use serde_json::Value as Json;

use crate::support::{backend_tests, Backend, Env};

backend_tests! {
    status_over_a_range_shows_missing_periods_in_time_order: status_over_a_range_shows_missing_periods_in_time_order_sqlite, status_over_a_range_shows_missing_periods_in_time_order_postgres;
    status_only_selects_one_state: status_only_selects_one_state_sqlite, status_only_selects_one_state_postgres;
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
