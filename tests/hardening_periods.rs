//! Issue 10, periods and values: durations that overflow, periods in
//! timezones with half-hour shifts and skipped days, settings that cannot
//! work, decimals that do not fit, leap seconds and years outside
//! 0001–9999. Each scenario runs the real binary on both databases.

use std::time::Duration;

use serde_json::Value as Json;

use crate::support::{backend_tests, norm_timestamp, Backend, Env};

backend_tests! {
    prune_refuses_an_overflowing_age_and_keeps_history: prune_refuses_an_overflowing_age_and_keeps_history_sqlite, prune_refuses_an_overflowing_age_and_keeps_history_postgres;
    half_hour_shift_keeps_hours_on_the_local_clock: half_hour_shift_keeps_hours_on_the_local_clock_sqlite, half_hour_shift_keeps_hours_on_the_local_clock_postgres;
    skipped_day_is_no_period_and_backfill_ends: skipped_day_is_no_period_and_backfill_ends_sqlite, skipped_day_is_no_period_and_backfill_ends_postgres;
    settings_that_cannot_work_exit_2_before_any_database: settings_that_cannot_work_exit_2_before_any_database_sqlite, settings_that_cannot_work_exit_2_before_any_database_postgres;
    decimal_over_the_largest_names_its_magnitude: decimal_over_the_largest_names_its_magnitude_sqlite, decimal_over_the_largest_names_its_magnitude_postgres;
    leap_second_is_the_next_minute_on_both_databases: leap_second_is_the_next_minute_on_both_databases_sqlite, leap_second_is_the_next_minute_on_both_databases_postgres;
    periods_outside_years_1_to_9999_are_usage_errors: periods_outside_years_1_to_9999_are_usage_errors_sqlite, periods_outside_years_1_to_9999_are_usage_errors_postgres;
}

/// A file pipeline `NAME` of `granularity` in `timezone` reading
/// `data/{period.start:PATH}.csv` (`missing = "empty"`), with the given
/// `[fields]` lines and key `id`.
fn file_pipeline(
    env: &Env,
    name: &str,
    granularity: &str,
    timezone: &str,
    path: &str,
    fields: &str,
) {
    env.write(
        format!("pipelines/{name}.toml"),
        &format!(
            r#"name = "{name}"
export_type = "{name}_export"
[period]
granularity = "{granularity}"
timezone = "{timezone}"
[[sources]]
id = "files"
transport = "file"
format = "csv"
path = "data/{{period.start:{path}}}.csv"
missing = "empty"
[fields]
{fields}
[load]
table = "{name}"
key = ["id"]
"#
        ),
    );
}

fn text<'a>(json: &'a Json, key: &str) -> &'a str {
    json.get(key)
        .and_then(Json::as_str)
        .unwrap_or_else(|| panic!("no string {key:?} in {json}"))
}

fn count(json: &Json, key: &str) -> u64 {
    json.get(key)
        .and_then(Json::as_u64)
        .unwrap_or_else(|| panic!("no count {key:?} in {json}"))
}

/// Every period start in the ledger, as UTC instants, in order.
fn ledger_starts(env: &Env, pipeline: &str) -> Vec<String> {
    let mut starts: Vec<String> = env
        .status(pipeline)
        .iter()
        .map(|e| norm_timestamp(text(e, "period_start")))
        .collect();
    starts.sort();
    starts
}

/// `prune --older-than 300000000y` once computed its cut-off as "now" and
/// deleted all history; `99999999999d` panicked (exit 101). A duration
/// whose cut-off lies before the year 1 is a usage error, and nothing is
/// deleted.
async fn prune_refuses_an_overflowing_age_and_keeps_history(backend: Backend) {
    let env = Env::orders(backend).await;
    env.backfill_orders(1, 2).expect_code(0, "backfill");
    let history = "FROM _tm_attempts WHERE finished_at IS NOT NULL";
    let attempts = env.db.count(history).await;
    assert_eq!(attempts, 2, "one finished attempt per period");
    for age in ["300000000y", "99999999999d", "3000y"] {
        let out = env.tidemark(&["prune", "--older-than", age]);
        out.expect_code(2, &format!("prune --older-than {age}"));
        assert!(
            out.stderr.contains(age) && out.stderr.contains("before the year 1"),
            "{age}: says why\n{out}"
        );
        assert!(
            out.stderr.contains("give at most"),
            "{age}: says what works\n{out}"
        );
        assert_eq!(env.db.count(history).await, attempts, "{age}: history kept");
    }
    // A sane age still prunes (nothing is that old yet).
    env.tidemark(&["prune", "--older-than", "30d"])
        .expect_code(0, "prune --older-than 30d");
    assert_eq!(env.db.count(history).await, attempts);
}

/// Lord Howe Island moves its clocks by 30 minutes (2024-04-07: 02:00+11:00
/// back to 01:30+10:30). `backfill` once stepped one absolute hour from the
/// shift on, so every later hour started at :30, while `run --period
/// 2024-04-07T03` named 03:00: the two commands made overlapping run keys.
/// Now every hour starts at :00 local time except the half hour after the
/// shift, and `run` names a key `backfill` made.
async fn half_hour_shift_keeps_hours_on_the_local_clock(backend: Backend) {
    let env = Env::new(backend).await;
    file_pipeline(
        &env,
        "howe",
        "hour",
        "Australia/Lord_Howe",
        "%Y-%m-%dT%H%M",
        r#"id = { type = "text" }
n = { type = "int" }"#,
    );
    env.write("pipelines/data/2024-04-07T0300.csv", "id,n\nA,1\n");
    let out = env.tidemark(&[
        "backfill",
        "howe",
        "--from",
        "2024-04-07T00",
        "--to",
        "2024-04-07T05",
    ]);
    out.expect_code(0, "backfill over the shift");
    let expected = [
        "2024-04-06T13:00:00Z", // 00:00+11:00
        "2024-04-06T14:00:00Z", // 01:00+11:00
        "2024-04-06T15:00:00Z", // 01:30+10:30, the half hour after the shift
        "2024-04-06T15:30:00Z", // 02:00+10:30
        "2024-04-06T16:30:00Z", // 03:00+10:30
        "2024-04-06T17:30:00Z", // 04:00+10:30
        "2024-04-06T18:30:00Z", // 05:00+10:30
    ];
    assert_eq!(ledger_starts(&env, "howe"), expected, "{out}");
    assert_eq!(env.db.count("FROM howe").await, 1, "03:00's file was read");

    let run = env.tidemark(&["run", "howe", "--period", "2024-04-07T03"]);
    run.expect_code(0, "run of the 03:00 hour");
    assert!(
        run.stderr.contains("already done"),
        "backfill made this run key\n{run}"
    );
    assert_eq!(
        norm_timestamp(text(&run.json(), "period_start")),
        "2024-04-06T16:30:00Z"
    );
    assert_eq!(ledger_starts(&env, "howe"), expected, "no overlapping key");
}

/// Samoa skipped 2011-12-30 (2011-12-29 24:00-10:00 was followed by
/// 2011-12-31 00:00+14:00). `backfill --from 2011-12-28 --to 2011-12-31`
/// never ended (and grew ~40 MB/s), and the 29th was 14 hours long. The
/// skipped day is no period: naming it is a usage error, and a backfill
/// over it runs the 28th, the 29th (24 hours) and the 31st. Its week (six
/// days) and month (thirty) run as single periods.
async fn skipped_day_is_no_period_and_backfill_ends(backend: Backend) {
    let env = Env::new(backend).await;
    for (name, granularity) in [
        ("apia", "day"),
        ("apia_weeks", "week"),
        ("apia_months", "month"),
    ] {
        file_pipeline(
            &env,
            name,
            granularity,
            "Pacific/Apia",
            "%Y-%m-%d",
            r#"id = { type = "text" }"#,
        );
    }
    let named = env.tidemark(&["run", "apia", "--period", "2011-12-30"]);
    named.expect_code(2, "the skipped day");
    assert!(
        named.stderr.contains("Pacific/Apia has no day 2011-12-30")
            && named.stderr.contains("--period"),
        "{named}"
    );
    assert!(env.db.untouched().await, "a usage error touches nothing");

    let backfill = env
        .spawn(&[
            "backfill",
            "apia",
            "--from",
            "2011-12-28",
            "--to",
            "2011-12-31",
        ])
        .finish(Duration::from_secs(60));
    backfill.expect_code(0, "backfill over the skipped day");
    let entries = env.status("apia");
    let mut days: Vec<(String, String)> = entries
        .iter()
        .map(|e| {
            (
                norm_timestamp(text(e, "period_start")),
                norm_timestamp(text(e, "period_end")),
            )
        })
        .collect();
    days.sort();
    assert_eq!(
        days,
        [
            (
                "2011-12-28T10:00:00Z".to_string(),
                "2011-12-29T10:00:00Z".to_string()
            ),
            (
                "2011-12-29T10:00:00Z".to_string(),
                "2011-12-30T10:00:00Z".to_string()
            ),
            (
                "2011-12-30T10:00:00Z".to_string(),
                "2011-12-31T10:00:00Z".to_string()
            ),
        ],
        "the 28th, a whole 29th, and the 31st\n{backfill}"
    );

    for (name, period, start, end) in [
        (
            "apia_weeks",
            "2011-12-30",
            "2011-12-26T10:00:00Z",
            "2012-01-01T10:00:00Z",
        ),
        (
            "apia_months",
            "2011-12-30",
            "2011-12-01T10:00:00Z",
            "2011-12-31T10:00:00Z",
        ),
    ] {
        let out = env.tidemark(&["run", name, "--period", period]);
        out.expect_code(0, name);
        let result = out.json();
        assert_eq!(
            norm_timestamp(text(&result, "period_start")),
            start,
            "{name}"
        );
        assert_eq!(norm_timestamp(text(&result, "period_end")), end, "{name}");
    }
}

/// Settings that cannot work (a `timeout = "0s"` made every request "time
/// out" and be retried) are configuration errors: exit 2, the file and
/// key named with what would work, before any database is opened.
async fn settings_that_cannot_work_exit_2_before_any_database(backend: Backend) {
    let env = Env::new(backend).await;
    let pipeline = |source: &str, period: &str, load: &str, rest: &str| {
        format!(
            r#"name = "shop"
export_type = "orders"
[period]
granularity = "day"
{period}
[[sources]]
id = "api"
transport = "http"
format = "json"
url = "http://127.0.0.1:9/orders"
{source}
[fields]
id = {{ type = "text" }}
[load]
table = "shop"
key = ["id"]
{load}
{rest}"#
        )
    };
    let cases = [
        (
            pipeline("timeout = \"0s\"", "", "", ""),
            "sources[0].timeout",
        ),
        (
            pipeline("rate_limit = { per_second = 4294967295 }", "", "", ""),
            "sources[0].rate_limit.per_second",
        ),
        (
            pipeline("pagination = { style = \"offset\", size = 0 }", "", "", ""),
            "sources[0].pagination.size",
        ),
        (
            pipeline("delimiter = '\"'", "", "", ""),
            "sources[0].delimiter",
        ),
        (pipeline("", "lag = \"300000000y\"", "", ""), "period.lag"),
        (
            pipeline("", "lookback = 4000000000", "", ""),
            "period.lookback",
        ),
        (pipeline("", "", "batch_size = 0", ""), "load.batch_size"),
        (
            pipeline("", "", "", "[retry]\nbase_delay = \"0s\""),
            "retry.base_delay",
        ),
        (
            pipeline(
                "",
                "",
                "",
                "[retry]\nbase_delay = \"1m\"\nmax_delay = \"10s\"",
            ),
            "retry.base_delay",
        ),
        (
            pipeline("", "", "", "[retry]\nmax_attempts = 1000000"),
            "retry.max_attempts",
        ),
        (
            pipeline("", "", "", "[schedule]\nevery = \"0s\""),
            "schedule.every",
        ),
    ];
    for (text, key) in cases {
        env.write("pipelines/shop.toml", &text);
        for args in [
            &["run", "shop", "--period", "2024-01-01"][..],
            &["validate", "shop"][..],
        ] {
            let out = env.tidemark(args);
            out.expect_code(2, &format!("{key}: tidemark {}", args.join(" ")));
            for named in ["shop.toml", key, "cannot work", "give a"] {
                assert!(out.stderr.contains(named), "{key}: names {named:?}\n{out}");
            }
        }
    }
    assert!(env.db.untouched().await, "no database opened");
}

/// `1.5E+30` was refused for "more than 28 significant digits"; it has two.
/// What does not fit is its magnitude, and the message says so (as it names
/// the digits or the places after the point when those are what is over).
async fn decimal_over_the_largest_names_its_magnitude(backend: Backend) {
    let env = Env::new(backend).await;
    file_pipeline(
        &env,
        "prices",
        "day",
        "UTC",
        "%Y-%m-%d",
        r#"id = { type = "text" }
amount = { type = "decimal" }"#,
    );
    for (value, says, not) in [
        (
            "1.5E+30",
            "magnitude exceeds 79228162514264337593543950335",
            "significant",
        ),
        (
            "1.0000000000000000000000000000001",
            "32 significant digits",
            "magnitude",
        ),
        ("1e-29", "29 places after the point", "significant"),
    ] {
        env.write(
            "pipelines/data/2024-01-01.csv",
            &format!("id,amount\nA,1.5\nB,{value}\n"),
        );
        let out = env.tidemark(&["run", "prices", "--period", "2024-01-01"]);
        out.expect_code(1, value);
        for named in ["pipeline prices", "line 3", "`amount`", value, says] {
            assert!(
                out.stderr.contains(named),
                "{value}: names {named:?}\n{out}"
            );
        }
        assert!(!out.stderr.contains(not), "{value}: not {not:?}\n{out}");
        assert_eq!(env.db.count("FROM prices").await, 0, "nothing half-written");
    }
    // The largest decimal itself loads exactly.
    env.write(
        "pipelines/data/2024-01-01.csv",
        "id,amount\nA,79228162514264337593543950335\nB,7.9228162514264337593543950335E+28\n",
    );
    env.tidemark(&["run", "prices", "--period", "2024-01-01"])
        .expect_code(0, "the largest decimal");
    assert_eq!(
        env.db
            .count("FROM prices WHERE CAST(amount AS TEXT) = '79228162514264337593543950335'")
            .await,
        2
    );
}

/// `2016-12-31T23:59:60Z` was stored as that text on SQLite and as the
/// next second on PostgreSQL. A leap second is now read as the first
/// instant of the next minute on both, hashed as stored, so a forced
/// re-run finds the row unchanged.
async fn leap_second_is_the_next_minute_on_both_databases(backend: Backend) {
    let env = Env::new(backend).await;
    file_pipeline(
        &env,
        "ticks",
        "day",
        "UTC",
        "%Y-%m-%d",
        r#"id = { type = "text" }
at = { type = "timestamptz" }
local = { type = "timestamp" }"#,
    );
    env.write(
        "pipelines/data/2016-12-31.csv",
        "id,at,local\nA,2016-12-31T23:59:60Z,2016-12-31T23:59:60\nB,2016-12-31T23:59:60.5Z,2016-12-31 23:59:60.25\n",
    );
    let out = env.tidemark(&["run", "ticks", "--period", "2016-12-31"]);
    out.expect_code(0, "run");
    assert_eq!(count(&out.json(), "rows_inserted"), 2, "{out}");
    for (id, at, local) in [
        ("A", "2017-01-01T00:00:00Z", "2017-01-01T00:00:00"),
        ("B", "2017-01-01T00:00:00.500Z", "2017-01-01T00:00:00.25"),
    ] {
        let condition = env.db.instant_is("at", at);
        assert_eq!(
            env.db
                .count(&format!("FROM ticks WHERE id = '{id}' AND {condition}"))
                .await,
            1,
            "{id}: at is {at}"
        );
        let stored = env
            .db
            .select(&["local"], &format!("FROM ticks WHERE id = '{id}'"))
            .await;
        // SQLite keeps `.250`, PostgreSQL prints `.25`.
        let stored = stored[0][0].clone().unwrap_or_default().replace(' ', "T");
        let stored = match stored.split_once('.') {
            Some((whole, fraction)) => format!("{whole}.{}", fraction.trim_end_matches('0')),
            None => stored,
        };
        assert_eq!(stored, local, "{id}: local is {local}");
    }
    let again = env.tidemark(&["run", "ticks", "--period", "2016-12-31", "--force"]);
    again.expect_code(0, "forced re-run");
    assert_eq!(count(&again.json(), "rows_unchanged"), 2, "{again}");
}

/// `run --period 0000-01` was done on SQLite and failed on PostgreSQL after
/// writing a ledger row. A period reaching outside the years 0001–9999
/// (named on the command line, as `--from`/`--to`, or as `period.start`;
/// also a last period whose end is in the year 10000) is a usage error
/// before anything is written.
async fn periods_outside_years_1_to_9999_are_usage_errors(backend: Backend) {
    let env = Env::new(backend).await;
    file_pipeline(
        &env,
        "monthly",
        "month",
        "UTC",
        "%Y-%m",
        r#"id = { type = "text" }"#,
    );
    let cases: [(&[&str], &str); 6] = [
        (&["run", "monthly", "--period", "0000-01"], "--period"),
        (&["run", "monthly", "--period", "9999-12"], "--period"),
        (
            &[
                "backfill", "monthly", "--from", "0000-12", "--to", "0001-01",
            ],
            "--from",
        ),
        (
            &[
                "backfill", "monthly", "--from", "9999-11", "--to", "9999-12",
            ],
            "--to",
        ),
        (&["status", "monthly", "--period", "0000-06"], "--period"),
        (&["run", "monthly", "--period=-0001-06"], "--period"),
    ];
    for (args, flag) in cases {
        let out = env.tidemark(args);
        out.expect_code(2, &args.join(" "));
        assert!(
            out.stderr.contains(flag) && out.stderr.contains("0001-9999"),
            "{}: names {flag} and the years\n{out}",
            args.join(" ")
        );
    }
    env.set_option("monthly", "period", "start", "\"0000-01\"");
    let out = env.tidemark(&["run", "monthly", "--period", "2024-01"]);
    out.expect_code(2, "period.start = 0000-01");
    assert!(
        out.stderr.contains("period.start") && out.stderr.contains("0001-9999"),
        "{out}"
    );
    assert!(env.db.untouched().await, "nothing written");

    // The first month runs; the last one that ends in 9999 is a period.
    env.set_option("monthly", "period", "start", "\"0001-01\"");
    let first = env.tidemark(&["run", "monthly", "--period", "0001-01"]);
    first.expect_code(0, "the first month");
    assert_eq!(
        norm_timestamp(text(&first.json(), "period_start")),
        "0001-01-01T00:00:00Z"
    );
    env.tidemark(&["status", "monthly", "--period", "9999-11"])
        .expect_code(0, "the last month that ends in 9999");
    assert_eq!(env.status("monthly").len(), 1);
}
