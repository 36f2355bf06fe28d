//! Issue 19, configuration checked before work: schedules that cannot fire
//! and a clock that is no time stop every command at start (and keep
//! `serve`'s previous definition on SIGHUP); names that are one column on
//! either database are refused; commands that only read never create,
//! migrate or change a database; messages say what happened (a period not
//! due yet, a reversed range, a field the record lacks, a full TMPDIR).
//! Each scenario runs the real binary on both databases.

use std::time::Duration;

use serde_json::Value as Json;

use crate::support::{backend_tests, Backend, Env, Out};

backend_tests! {
    schedules_that_cannot_fire_stop_every_command_at_start: schedules_that_cannot_fire_stop_every_command_at_start_sqlite, schedules_that_cannot_fire_stop_every_command_at_start_postgres;
    a_clock_that_is_no_time_stops_every_command_at_start: a_clock_that_is_no_time_stops_every_command_at_start_sqlite, a_clock_that_is_no_time_stops_every_command_at_start_postgres;
    sighup_keeps_the_schedule_when_the_new_one_cannot_fire: sighup_keeps_the_schedule_when_the_new_one_cannot_fire_sqlite, sighup_keeps_the_schedule_when_the_new_one_cannot_fire_postgres;
    names_equal_on_either_database_are_config_errors: names_equal_on_either_database_are_config_errors_sqlite, names_equal_on_either_database_are_config_errors_postgres;
    read_only_commands_leave_an_old_ledger_as_it_is: read_only_commands_leave_an_old_ledger_as_it_is_sqlite, read_only_commands_leave_an_old_ledger_as_it_is_postgres;
    read_only_commands_create_no_database: read_only_commands_create_no_database_sqlite, read_only_commands_create_no_database_postgres;
    status_says_when_a_period_not_yet_due_becomes_due: status_says_when_a_period_not_yet_due_becomes_due_sqlite, status_says_when_a_period_not_yet_due_becomes_due_postgres;
    every_reversed_range_is_a_usage_error: every_reversed_range_is_a_usage_error_sqlite, every_reversed_range_is_a_usage_error_postgres;
    check_source_notes_a_field_the_record_lacks: check_source_notes_a_field_the_record_lacks_sqlite, check_source_notes_a_field_the_record_lacks_postgres;
    a_spill_file_failure_names_the_temporary_directory: a_spill_file_failure_names_the_temporary_directory_sqlite, a_spill_file_failure_names_the_temporary_directory_postgres;
}

/// The issue's base pipeline `p`: daily UTC periods from 2024-01-01, one
/// CSV file source, fields `id` (text, required) and `v` (int), key `id`,
/// plus `extra` lines at the end (a `[schedule]`, say).
fn base_pipeline(env: &Env, fields: &str, extra: &str) {
    env.write(
        "pipelines/p.toml",
        &format!(
            r#"name = "p"
export_type = "t"

[period]
granularity = "day"
timezone = "UTC"
start = "2024-01-01"

[[sources]]
id = "files"
transport = "file"
format = "csv"
path = "../data/{{period.start:%Y-%m-%d}}.csv"

[fields]
{fields}

[load]
table = "p"
key = ["id"]
batch_size = 500
{extra}
"#
        ),
    );
}

const FIELDS: &str = r#"id = { type = "text", required = true }
v = { type = "int" }"#;

/// Writes `data/DAY.csv` with `rows` rows `id,v`.
fn day_file(env: &Env, day: &str, rows: usize) {
    let mut text = String::from("id,v\n");
    for i in 0..rows {
        text.push_str(&format!("k{i},{i}\n"));
    }
    env.write(format!("data/{day}.csv"), &text);
}

/// A fresh database with pipeline `p` (`extra` lines in `[load]`) and
/// 2024-01-01 loaded from a file of `rows` rows.
async fn loaded_day(backend: Backend, rows: usize, extra: &str) -> Env {
    let env = Env::new(backend).await;
    day_file(&env, "2024-01-01", rows);
    base_pipeline(&env, FIELDS, extra);
    env.tidemark(&["run", "p", "--period", "2024-01-01"])
        .expect_code(0, "first run");
    env
}

/// The stdout line of `out` that starts (after indentation) with `prefix`.
#[track_caller]
fn line_starting<'a>(out: &'a Out, prefix: &str) -> &'a str {
    out.stdout
        .lines()
        .find(|l| l.trim_start().starts_with(prefix))
        .unwrap_or_else(|| panic!("no line starting {prefix:?}\n{out}"))
}

/// Every command that loads a pipeline, with the arguments that make it
/// start (`serve` as `--drain`, so that a start that is not refused ends).
#[rustfmt::skip]
const LOADING_COMMANDS: &[&[&str]] = &[
    &["serve", "--drain"],
    &["serve", "--drain", "--no-schedule"],
    &["validate", "p"],
    &["run", "p", "--period", "2024-01-01"],
    &["run", "p", "--period", "2024-01-01", "--dry-run"],
    &["backfill", "p", "--from", "2024-01-01", "--to", "2024-01-02"],
    &["backfill", "p", "--from", "2024-01-01", "--to", "2024-01-02", "--enqueue"],
    &["sync", "p"],
    &["sync", "p", "--dry-run"],
    &["sync", "--all"],
    &["status", "p"],
    &["cancel", "p"],
];

/// Runs `args` with `TIDEMARK_NOW` set to `now`.
fn at(env: &Env, now: &str, args: &[&str]) -> Out {
    env.tidemark_env(&[("TIDEMARK_NOW", now)], args)
}

#[track_caller]
fn assert_config_error(out: &Out, what: &str, named: &[&str]) {
    out.expect_code(2, what);
    for text in named {
        assert!(out.stderr.contains(text), "{what}: names {text:?}\n{out}");
    }
}

/// `cron = "0 0 30 2 *"` passed `validate`, and `serve` then fired every
/// 60 s; a `[schedule]` without `period.start` passed and was never
/// scheduled. Both, and the other crons that cannot fire (a day no month
/// has, a year field that runs out), are configuration errors of every
/// command that loads the pipeline, before any database is opened.
async fn schedules_that_cannot_fire_stop_every_command_at_start(backend: Backend) {
    let env = Env::new(backend).await;
    day_file(&env, "2024-01-01", 3);
    // (the [schedule] lines, whether `period.start` is set, key, message)
    let cases = [
        (
            "cron = \"0 0 30 2 *\"",
            true,
            "schedule.cron",
            "does not fire",
        ),
        (
            "cron = \"0 0 31 4 *\"",
            true,
            "schedule.cron",
            "does not fire",
        ),
        ("cron = \"0 0 0 1 1 * 2025\"", true, "schedule.cron", "year"),
        ("every = \"1h\"", false, "schedule", "period.start"),
    ];
    for (schedule, start, key, says) in cases {
        base_pipeline(&env, FIELDS, &format!("\n[schedule]\n{schedule}\n"));
        if !start {
            env.edit_pipeline("p", |t| t.replace("start = \"2024-01-01\"\n", ""));
        }
        for args in LOADING_COMMANDS {
            let what = format!("{key}: tidemark {}", args.join(" "));
            let out = at(&env, "2024-01-03T00:00:00Z", args);
            assert_config_error(&out, &what, &["p.toml", key, says]);
        }
    }
    assert!(env.db.untouched().await, "no database opened or created");
}

/// `TIDEMARK_NOW=garbage` gave a `serve` that logged once and never
/// scheduled, and a `serve --drain` that exited 0. Every command that loads
/// a pipeline reads the clock first and stops with exit 2 naming it.
async fn a_clock_that_is_no_time_stops_every_command_at_start(backend: Backend) {
    let env = Env::new(backend).await;
    day_file(&env, "2024-01-01", 3);
    base_pipeline(&env, FIELDS, "\n[schedule]\nevery = \"1h\"\n");
    for args in LOADING_COMMANDS {
        let what = format!("TIDEMARK_NOW=garbage tidemark {}", args.join(" "));
        let out = at(&env, "garbage", args);
        assert_config_error(&out, &what, &["TIDEMARK_NOW", "garbage", "RFC 3339"]);
    }
    assert!(env.db.untouched().await, "no database opened or created");
}

/// SIGHUP re-reads the pipelines: a file whose schedule cannot fire is a
/// broken file, logged with its key, and its previous definition is kept.
async fn sighup_keeps_the_schedule_when_the_new_one_cannot_fire(backend: Backend) {
    let env = Env::new(backend).await;
    base_pipeline(&env, FIELDS, "\n[schedule]\nevery = \"1h\"\n");
    let serve = env.spawn(&["serve", "--no-schedule", "--workers", "1"]);
    serve.wait_for_stderr("serving", Duration::from_secs(30));
    base_pipeline(&env, FIELDS, "\n[schedule]\ncron = \"0 0 30 2 *\"\n");
    serve.signal("HUP");
    serve.wait_for_stderr("keeping its previous definition", Duration::from_secs(30));
    let so_far = serve.output_so_far();
    assert!(
        so_far.stderr.contains("schedule.cron"),
        "the reload names the key\n{so_far}"
    );
    serve.signal("TERM");
    let out = serve.finish(Duration::from_secs(30));
    out.expect_code(0, "serve after SIGTERM");
}

/// `note` and `Note` passed `validate`; PostgreSQL made two columns and
/// SQLite failed every run with a raw `duplicate column name`. Names that
/// are one on either database (any ASCII case on SQLite, the first 63
/// bytes on PostgreSQL, the lineage columns, the columns a database gives
/// every table, and the index tidemark names after the table) are
/// configuration errors naming both, before any database is opened; a
/// name that fits loads on both.
async fn names_equal_on_either_database_are_config_errors(backend: Backend) {
    let env = Env::new(backend).await;
    day_file(&env, "2024-01-01", 3);
    let long = "n".repeat(64);
    let long_field = format!("{FIELDS}\n{long} = {{ type = \"text\" }}");
    let long_table = "t".repeat(52);
    let cases: Vec<(String, String, Vec<String>)> = vec![
        (
            format!("{FIELDS}\nnote = {{ type = \"text\" }}\nNote = {{ type = \"text\" }}"),
            String::new(),
            vec!["fields.Note".into(), "\"note\"".into(), "\"Note\"".into()],
        ),
        (
            format!("{FIELDS}\n_TM_Source = {{ type = \"text\" }}"),
            String::new(),
            vec!["fields._TM_Source".into(), "reserved".into()],
        ),
        (
            format!("{FIELDS}\nrowid = {{ type = \"int\" }}"),
            String::new(),
            vec!["fields.rowid".into(), "SQLite".into()],
        ),
        (
            format!("{FIELDS}\nXmin = {{ type = \"int\" }}"),
            String::new(),
            vec!["fields.Xmin".into(), "PostgreSQL".into()],
        ),
        (
            long_field,
            String::new(),
            vec![format!("fields.{long}"), "63".into()],
        ),
        (
            FIELDS.to_string(),
            long_table.clone(),
            vec!["load.table".into(), "__tm_run_key".into(), "51".into()],
        ),
        (
            FIELDS.to_string(),
            "p__TM_run_key".into(),
            vec!["load.table".into(), "reserved".into()],
        ),
    ];
    for (fields, table, named) in &cases {
        base_pipeline(&env, fields, "");
        if !table.is_empty() {
            env.edit_pipeline("p", |t| {
                t.replace("table = \"p\"", &format!("table = \"{table}\""))
            });
        }
        let named: Vec<&str> = named.iter().map(String::as_str).collect();
        for args in [
            &["validate", "p"][..],
            &["run", "p", "--period", "2024-01-01"][..],
        ] {
            let out = env.tidemark(args);
            assert_config_error(&out, &format!("{named:?}: {}", args.join(" ")), &named);
        }
    }
    assert!(env.db.untouched().await, "no database opened or created");

    // The longest table name that leaves room for its index loads, and the
    // index carries the whole name on both databases.
    let fits = "t".repeat(51);
    base_pipeline(&env, FIELDS, "");
    env.edit_pipeline("p", |t| {
        t.replace("table = \"p\"", &format!("table = \"{fits}\""))
    });
    env.tidemark(&["run", "p", "--period", "2024-01-01"])
        .expect_code(0, "run into a 51-byte table");
    let index = format!("{fits}__tm_run_key");
    let indexes = match env.backend() {
        Backend::Sqlite => {
            env.db
                .count(&format!(
                    "FROM sqlite_master WHERE type = 'index' AND name = '{index}'"
                ))
                .await
        }
        Backend::Postgres => {
            env.db
                .count(&format!("FROM pg_indexes WHERE indexname = '{index}'"))
                .await
        }
    };
    assert_eq!(indexes, 1, "the index {index} exists, uncut");
    assert_eq!(env.db.count(&format!("FROM \"{fits}\"")).await, 3);
}

/// What the database holds, to compare before and after a command: every
/// schema object with its definition, the applied migrations and the
/// ledger's rows (and on SQLite, the database file's bytes).
async fn snapshot(env: &Env) -> (Vec<Vec<Option<String>>>, Option<Vec<u8>>) {
    let schema = match env.backend() {
        Backend::Sqlite => {
            "SELECT type, name, sql FROM sqlite_master ORDER BY type, name".to_string()
        }
        Backend::Postgres => "SELECT CAST(c.relkind AS TEXT), c.relname, \
             CAST(pg_get_indexdef(c.oid) AS TEXT) FROM pg_class c \
             JOIN pg_namespace n ON n.oid = c.relnamespace \
             WHERE n.nspname = 'public' ORDER BY c.relname"
            .to_string(),
    };
    let mut rows = env.db.rows(&schema).await;
    rows.extend(
        env.db
            .select(
                &["version", "description"],
                "FROM _sqlx_migrations ORDER BY version",
            )
            .await,
    );
    rows.extend(
        env.db
            .select(
                &["source", "period_start", "status", "attempt", "run_id"],
                "FROM _tm_runs ORDER BY period_start",
            )
            .await,
    );
    let bytes = match &env.db {
        crate::support::TestDb::Sqlite { path } => Some(std::fs::read(path).expect("db file")),
        crate::support::TestDb::Postgres { .. } => None,
    };
    (rows, bytes)
}

/// `status` on a ledger at an old migration migrated it (under processes
/// of the old build). The ledger here lacks the newest migration (its
/// views dropped, its row deleted: what the previous release left); every
/// command that only reads leaves it exactly as it was and says to run
/// `tidemark migrate` (exit 2); `validate` does not open it at all.
async fn read_only_commands_leave_an_old_ledger_as_it_is(backend: Backend) {
    let env = loaded_day(backend, 3, "").await;
    // The ledger as migration 8 left it: 9's columns dropped (the views
    // that read them first), 8's views as 8 made them.
    env.db.execute("DROP VIEW tidemark_v1_periods").await;
    env.db.execute("DROP VIEW tidemark_v1_attempts").await;
    for table in ["_tm_runs", "_tm_attempts"] {
        for column in ["marked", "mark_note"] {
            env.db
                .execute(&format!("ALTER TABLE {table} DROP COLUMN {column}"))
                .await;
        }
    }
    let dialect = match backend {
        Backend::Sqlite => "sqlite",
        Backend::Postgres => "postgres",
    };
    let views = std::fs::read_to_string(
        crate::support::repo_root().join(format!("migrations/{dialect}/0008_stable_views.sql")),
    )
    .expect("read migration 8");
    let views: String = views
        .lines()
        .filter(|l| !l.trim_start().starts_with("--"))
        .collect::<Vec<_>>()
        .join("\n");
    for statement in views.split(';') {
        if !statement.trim().is_empty() {
            env.db.execute(statement).await;
        }
    }
    env.db
        .execute("DELETE FROM _sqlx_migrations WHERE version = 9")
        .await;
    let before = snapshot(&env).await;
    #[rustfmt::skip]
    let reading: &[&[&str]] = &[
        &["status", "p"],
        &["status", "p", "--json"],
        &["status", "p", "--from", "2024-01-01", "--to", "2024-01-03"],
        &["run", "p", "--period", "2024-01-02", "--dry-run"],
        &["backfill", "p", "--from", "2024-01-01", "--to", "2024-01-03", "--dry-run"],
        &["sync", "p", "--dry-run"],
    ];
    for args in reading {
        let out = at(&env, "2024-01-04T00:00:00Z", args);
        assert_config_error(
            &out,
            &args.join(" "),
            &[
                "tidemark migrate",
                "older than this tidemark",
                "migration 9",
            ],
        );
        assert!(
            snapshot(&env).await == before,
            "`tidemark {}` changed the database",
            args.join(" ")
        );
    }
    env.tidemark(&["validate", "p"]).expect_code(0, "validate");
    assert!(
        snapshot(&env).await == before,
        "validate changed the database"
    );
    env.tidemark(&["migrate"]).expect_code(0, "migrate");
    let status = env.status("p");
    assert_eq!(status.len(), 1, "{status:?}");
    assert_eq!(status[0]["status"], "done");
}

/// A read-only command on a database with no ledger finds nothing and
/// creates nothing: no SQLite file, no PostgreSQL table.
async fn read_only_commands_create_no_database(backend: Backend) {
    let env = Env::new(backend).await;
    day_file(&env, "2024-01-01", 3);
    base_pipeline(&env, FIELDS, "");
    let out = at(
        &env,
        "2024-01-03T00:00:00Z",
        &[
            "status",
            "p",
            "--from",
            "2024-01-01",
            "--to",
            "2024-01-02",
            "--json",
        ],
    );
    out.expect_code(0, "status without a ledger");
    let lines = out.json_lines();
    assert_eq!(lines.len(), 2, "{out}");
    assert!(lines.iter().all(|l| l["status"] == "missing"), "{out}");
    at(&env, "2024-01-03T00:00:00Z", &["sync", "p", "--dry-run"])
        .expect_code(0, "sync --dry-run without a ledger");
    assert!(env.db.untouched().await, "nothing created");
}

/// `status` over a range reaching past now listed the periods not due yet
/// as `missing … never run`. They say when they become due (the period's
/// end plus `lag`), in the table and in `--json` (status `not_due`, and
/// `due_at` on every line); `--only missing` lists only the gaps.
async fn status_says_when_a_period_not_yet_due_becomes_due(backend: Backend) {
    let env = Env::new(backend).await;
    day_file(&env, "2024-01-01", 3);
    base_pipeline(&env, FIELDS, "");
    env.set_option("p", "period", "lag", "\"2h\"");
    let now = "2024-01-03T03:00:00Z";
    at(&env, now, &["run", "p", "--period", "2024-01-01"]).expect_code(0, "run");
    let range = ["status", "p", "--from", "2024-01-01", "--to", "2024-01-04"];
    let out = at(&env, now, &range);
    out.expect_code(0, "status");
    let line = |day: &str| line_starting(&out, day).to_string();
    assert!(line("2024-01-01").contains("done"), "{out}");
    assert!(
        line("2024-01-02").contains("missing") && line("2024-01-02").contains("never run"),
        "{out}"
    );
    for (day, due) in [
        ("2024-01-03", "2024-01-04T02:00:00Z"),
        ("2024-01-04", "2024-01-05T02:00:00Z"),
    ] {
        let l = line(day);
        assert!(
            l.contains("not_due")
                && l.contains(&format!("not due until {due}"))
                && !l.contains("never run"),
            "{day}: {l}\n{out}"
        );
    }
    let mut json = range.to_vec();
    json.push("--json");
    let out = at(&env, now, &json);
    out.expect_code(0, "status --json");
    let lines = out.json_lines();
    let of = |day: &str| -> &Json {
        lines
            .iter()
            .find(|l| {
                l["period_start"]
                    .as_str()
                    .is_some_and(|s| s.starts_with(day))
            })
            .unwrap_or_else(|| panic!("no line for {day}\n{out}"))
    };
    assert_eq!(of("2024-01-01")["status"], "done");
    assert_eq!(of("2024-01-01")["due_at"], "2024-01-02T02:00:00Z");
    assert_eq!(of("2024-01-02")["status"], "missing");
    assert_eq!(of("2024-01-02")["due_at"], "2024-01-03T02:00:00Z");
    assert_eq!(of("2024-01-03")["status"], "not_due");
    assert_eq!(of("2024-01-03")["due_at"], "2024-01-04T02:00:00Z");
    assert_eq!(of("2024-01-04")["status"], "not_due");
    let mut only = range.to_vec();
    only.extend(["--only", "missing", "--json"]);
    let out = at(&env, now, &only);
    out.expect_code(0, "status --only missing");
    let starts: Vec<&str> = out
        .json_lines()
        .iter()
        .map(|l| l["status"].as_str().unwrap_or_default())
        .map(|s| if s == "missing" { "missing" } else { "other" })
        .collect();
    assert_eq!(starts, ["missing"], "only the due gap\n{out}");
}

/// `cancel --from` later than `--to` cancelled nothing and exited 0. Every
/// command that takes `--from`/`--to` refuses a reversed range (exit 2,
/// naming `--to`), and touches nothing.
async fn every_reversed_range_is_a_usage_error(backend: Backend) {
    let env = Env::new(backend).await;
    day_file(&env, "2024-01-01", 3);
    base_pipeline(&env, FIELDS, "");
    let range = ["--from", "2024-01-01", "--to", "2024-01-03"];
    env.tidemark(&[&["backfill", "p", "--enqueue"][..], &range].concat())
        .expect_code(0, "enqueue");
    let reversed = ["--from", "2024-01-03", "--to", "2024-01-01"];
    for command in [
        &["cancel", "p"][..],
        &["status", "p"][..],
        &["backfill", "p"][..],
        &["backfill", "p", "--dry-run"][..],
        &["backfill", "p", "--enqueue"][..],
    ] {
        let mut args = command.to_vec();
        args.extend(reversed);
        let out = at(&env, "2024-01-05T00:00:00Z", &args);
        assert_config_error(&out, &args.join(" "), &["--to", "is before --from"]);
    }
    let pending = env.db.count("FROM _tm_runs WHERE status = 'pending'").await;
    assert_eq!(pending, 3, "nothing cancelled");
}

/// `validate --check-source` showed `v = NULL` for a field the JSON record
/// lacks, without the note a run logs for it; it shows the same note.
async fn check_source_notes_a_field_the_record_lacks(backend: Backend) {
    let env = Env::new(backend).await;
    base_pipeline(&env, FIELDS, "");
    env.edit_pipeline("p", |t| {
        t.replace("format = \"csv\"", "format = \"ndjson\"")
            .replace(".csv\"", ".ndjson\"")
    });
    env.write("data/2024-01-01.ndjson", "{\"id\": \"a\", \"w\": 1}\n");
    let out = env.tidemark(&["validate", "p", "--check-source", "--period", "2024-01-01"]);
    out.expect_code(0, "validate --check-source");
    let v = line_starting(&out, "v = ");
    assert!(
        v.contains("NULL") && v.contains("absent") && v.contains("renamed or removed upstream"),
        "{v}\n{out}"
    );
    let id = line_starting(&out, "id = ");
    assert!(!id.contains("absent"), "{id}");
    assert!(env.db.untouched().await, "validate opens no database");
}

/// A spill temp-file failure was reported as `database error: database: …`
/// with class `database`. With `TMPDIR` pointing nowhere, a re-run whose
/// stored rows exceed the memory budget fails with class `config` (the worker's environment),
/// naming the directory and the cause, and the table keeps its rows.
async fn a_spill_file_failure_names_the_temporary_directory(backend: Backend) {
    let env = loaded_day(backend, 2_000, "memory_budget = \"1KiB\"").await;
    let nowhere = env.path("no-such-tmp");
    let nowhere = nowhere.display().to_string();
    let out = env.tidemark_env(
        &[("TMPDIR", &nowhere)],
        &["run", "p", "--period", "2024-01-01", "--force"],
    );
    out.expect_code(1, "re-run without a temporary directory");
    assert!(
        out.stderr.contains("config error: local temporary file in")
            && out.stderr.contains(&nowhere)
            && out.stderr.contains("TMPDIR")
            && !out.stderr.contains("database error"),
        "{out}"
    );
    let entry = env.status_of("p", "2024-01-01").expect("ledger row");
    assert_eq!(entry["status"], "failed", "{entry}\n{out}");
    assert_eq!(entry["error_class"], "config", "{entry}\n{out}");
    assert_eq!(env.db.count("FROM p").await, 2_000);
}
