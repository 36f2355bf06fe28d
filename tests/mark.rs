//! `tidemark mark`: periods recorded as done (loaded by another tool) or
//! skipped (deliberately empty) without running them. A marked key is a
//! `done` row: `sync`, dry runs and `run` treat it as done and read none of
//! its files; a running key is left to its holder, a done key unless
//! `--force`; `run --force` loads a marked period for real and clears the
//! mark.

use std::time::{Duration, Instant};

use serde_json::Value as Json;

use crate::support::{backend_tests, Backend, Env, FifoWriter};

backend_tests! {
    mark_makes_sync_skip_the_marked_range: mark_makes_sync_skip_the_marked_range_sqlite, mark_makes_sync_skip_the_marked_range_postgres;
    mark_leaves_done_and_running_keys_alone: mark_leaves_done_and_running_keys_alone_sqlite, mark_leaves_done_and_running_keys_alone_postgres;
    forced_run_of_a_marked_period_loads_it: forced_run_of_a_marked_period_loads_it_sqlite, forced_run_of_a_marked_period_loads_it_postgres;
    now_lifts_the_back_off_of_a_failed_key: now_lifts_the_back_off_of_a_failed_key_sqlite, now_lifts_the_back_off_of_a_failed_key_postgres;
}

/// "Now" for every command of these tests: the days of 2024-01-01 through
/// 2024-01-05 are due.
const NOW: &str = "2024-01-06T12:00:00Z";

/// Daily CSV periods from one source whose files must exist
/// (`missing = "error"`: a period whose file is absent fails), and a
/// lookback of one done period, which must not pick a marked one.
async fn daily(backend: Backend) -> Env {
    let mut env = Env::new(backend).await;
    env.set_var("TIDEMARK_NOW", NOW);
    env.write(
        "pipelines/p.toml",
        r#"name = "p"
export_type = "t"

[period]
granularity = "day"
timezone = "UTC"
start = "2024-01-01"
lag = "1h"
lookback = 1

[[sources]]
id = "s"
transport = "file"
format = "csv"
path = "data/{period.start:%Y-%m-%d}.csv"
missing = "error"

[fields]
id = { type = "text", required = true }
v = { type = "int" }

[load]
table = "p"
key = ["id"]
batch_size = 2

[retry]
max_attempts = 1
"#,
    );
    env
}

/// Writes the day's file: three rows with ids of the day.
fn day_file(env: &Env, day: &str) {
    env.write(
        format!("pipelines/data/{day}.csv"),
        &format!("id,v\n{day}-a,1\n{day}-b,2\n{day}-c,3\n"),
    );
}

/// The `status --json` line of the one key of `day`.
fn status_of(env: &Env, day: &str) -> Json {
    let out = env.tidemark(&["status", "p", "--json", "--period", day]);
    out.expect_code(0, "status --period --json");
    let lines = out.json_lines();
    assert_eq!(lines.len(), 1, "{out}");
    lines[0].clone()
}

async fn mark_makes_sync_skip_the_marked_range(backend: Backend) {
    let env = daily(backend).await;
    // 04 and 05 have no file: a read of either fails the period. 05 is the
    // latest done period once marked: a lookback that took marked periods
    // would read it.
    for day in ["2024-01-01", "2024-01-02", "2024-01-03"] {
        day_file(&env, day);
    }

    // Usage errors touch nothing: a reversed range, an unknown source.
    env.tidemark(&[
        "mark",
        "p",
        "--from",
        "2024-01-04",
        "--to",
        "2024-01-03",
        "--as",
        "skipped",
        "--note",
        "x",
    ])
    .expect_code(2, "--to before --from");
    env.tidemark(&[
        "mark",
        "p",
        "--from",
        "2024-01-03",
        "--to",
        "2024-01-04",
        "--source",
        "nope",
        "--as",
        "skipped",
        "--note",
        "x",
    ])
    .expect_code(2, "an unknown source");
    assert!(env.db.untouched().await, "a usage error touches nothing");

    let out = env.tidemark(&[
        "mark",
        "p",
        "--from",
        "2024-01-04",
        "--to",
        "2024-01-05",
        "--as",
        "skipped",
        "--note",
        "shop closed",
    ]);
    out.expect_code(0, "mark");
    assert!(
        out.stdout
            .contains("marked 2 run key(s) of pipeline p as skipped; 0 already done; 0 held"),
        "{out}"
    );

    // The dry run skips the marked days and would run the others.
    let out = env.tidemark(&["sync", "p", "--dry-run"]);
    out.expect_code(0, "sync --dry-run");
    let action = |day: &str| {
        out.stdout
            .lines()
            .find(|l| l.starts_with(day))
            .unwrap_or_else(|| panic!("no line for {day}\n{out}"))
            .split_whitespace()
            .nth(2)
            .unwrap_or_default()
            .trim_end_matches(':')
            .to_string()
    };
    for day in ["2024-01-04", "2024-01-05"] {
        assert_eq!(action(day), "skip", "{day}\n{out}");
        // It says why: the day is marked, not loaded.
        let line = out.stdout.lines().find(|l| l.starts_with(day));
        assert!(
            line.is_some_and(|l| l.ends_with("skip: marked skipped: shop closed")),
            "{day}\n{out}"
        );
    }
    for day in ["2024-01-01", "2024-01-02", "2024-01-03"] {
        assert_eq!(action(day), "run", "{day}\n{out}");
    }

    // The real sync reads only the three files that are there: a read of
    // 04 or 05 would fail (missing = "error") and exit 1.
    env.tidemark(&["sync", "p"])
        .expect_code(0, "sync skips the marked days");
    assert_eq!(env.db.count("FROM p").await, 9);
    for day in ["2024-01-04", "2024-01-05"] {
        let line = status_of(&env, day);
        assert_eq!(line["status"], "done", "{line}");
        assert_eq!(line["marked"], "skipped", "{line}");
        assert_eq!(line["mark_note"], "shop closed", "{line}");
        assert_eq!(
            line["stale"], false,
            "a mark records the current pipeline: {line}"
        );
        assert_eq!(line["rows_read"], 0, "{line}");
    }
    let loaded = status_of(&env, "2024-01-03");
    assert_eq!(loaded["marked"], Json::Null, "{loaded}");

    // Again: everything is done, the lookback re-reads the last loaded day
    // (03), never a marked one (05).
    env.tidemark(&["sync", "p"])
        .expect_code(0, "sync again: lookback skips marked days");

    // The table tells it in NOTE.
    let out = env.tidemark(&["status", "p", "--from", "2024-01-04", "--to", "2024-01-04"]);
    out.expect_code(0, "status table");
    assert!(
        out.stdout.lines().any(|l| l.starts_with("2024-01-04")
            && l.contains(" done ")
            && l.contains("marked skipped: shop closed")),
        "{out}"
    );

    // The attempt names the operator and carries the mark.
    let attempts = env
        .db
        .select(
            &["worker", "status", "marked", "mark_note"],
            "FROM tidemark_v1_attempts WHERE period_start LIKE '2024-01-04%'",
        )
        .await;
    assert_eq!(attempts.len(), 1, "{attempts:?}");
    let worker = attempts[0][0].clone().unwrap_or_default();
    assert!(worker.starts_with("mark:"), "{worker}");
    assert_eq!(
        attempts[0][1..],
        [
            Some("done".to_string()),
            Some("skipped".to_string()),
            Some("shop closed".to_string())
        ]
    );

    // `backfill --only missing` finds nothing missing there.
    env.tidemark(&[
        "backfill",
        "p",
        "--from",
        "2024-01-04",
        "--to",
        "2024-01-05",
        "--only",
        "missing",
    ])
    .expect_code(0, "backfill --only missing over the marked days");
    assert_eq!(env.db.count("FROM p").await, 9);
}

/// Waits until the ledger says the key of `day` is running.
async fn wait_running(env: &Env, day: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if env.db.table_exists("_tm_runs").await {
            let rows = env
                .db
                .select(
                    &["status"],
                    &format!("FROM _tm_runs WHERE period_start LIKE '{day}%'"),
                )
                .await;
            if rows.first().and_then(|r| r[0].as_deref()) == Some("running") {
                return;
            }
        }
        assert!(Instant::now() < deadline, "{day} never ran");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn mark_leaves_done_and_running_keys_alone(backend: Backend) {
    let env = daily(backend).await;
    day_file(&env, "2024-01-01");
    env.tidemark(&["run", "p", "--period", "2024-01-01"])
        .expect_code(0, "run of 01");

    // 02 is held open by a run reading a FIFO.
    let path = env.path("pipelines/data/2024-01-02.csv");
    let fifo = FifoWriter::create(&path);
    let holder = env.spawn(&["run", "p", "--period", "2024-01-02"]);
    wait_running(&env, "2024-01-02").await;

    let out = env.tidemark(&[
        "mark",
        "p",
        "--from",
        "2024-01-01",
        "--to",
        "2024-01-03",
        "--as",
        "done",
        "--note",
        "loaded by legacy",
    ]);
    out.expect_code(75, "a held key makes the mark exit 75");
    assert!(
        out.stdout
            .contains("marked 1 run key(s) of pipeline p as done; 1 already done; 1 held"),
        "{out}"
    );
    assert!(out.stderr.contains("held"), "{out}");
    let done = status_of(&env, "2024-01-01");
    assert_eq!(
        done["marked"],
        Json::Null,
        "a done key is left as it is: {done}"
    );
    assert_eq!(done["rows_read"], 3, "{done}");
    assert_eq!(done["attempts"], 1, "{done}");
    let held = status_of(&env, "2024-01-02");
    assert_eq!(held["status"], "running", "{held}");
    assert_eq!(held["marked"], Json::Null, "{held}");
    let marked = status_of(&env, "2024-01-03");
    assert_eq!(marked["status"], "done", "{marked}");
    assert_eq!(marked["marked"], "done", "{marked}");

    // The holder finishes its run normally, unmarked.
    fifo.write("id,v\nx1,1\nx2,2\n");
    drop(fifo);
    holder
        .finish(Duration::from_secs(60))
        .expect_code(0, "the held run finishes");
    let finished = status_of(&env, "2024-01-02");
    assert_eq!(finished["status"], "done", "{finished}");
    assert_eq!(finished["rows_read"], 2, "{finished}");
    assert_eq!(finished["marked"], Json::Null, "{finished}");

    // --force re-marks a done key.
    let out = env.tidemark(&[
        "mark",
        "p",
        "--period",
        "2024-01-01",
        "--as",
        "done",
        "--note",
        "adopted",
        "--force",
    ]);
    out.expect_code(0, "mark --force");
    assert!(
        out.stdout
            .contains("marked 1 run key(s) of pipeline p as done; 0 already done; 0 held"),
        "{out}"
    );
    let remarked = status_of(&env, "2024-01-01");
    assert_eq!(remarked["marked"], "done", "{remarked}");
    assert_eq!(remarked["mark_note"], "adopted", "{remarked}");
    assert_eq!(remarked["attempts"], 2, "{remarked}");
    // The rows another run loaded stay: a mark writes no data.
    assert_eq!(env.db.count("FROM p WHERE id LIKE '2024-01-01%'").await, 3);
}

async fn forced_run_of_a_marked_period_loads_it(backend: Backend) {
    let env = daily(backend).await;
    env.tidemark(&[
        "mark",
        "p",
        "--period",
        "2024-01-02",
        "--as",
        "done",
        "--note",
        "loaded by legacy",
    ])
    .expect_code(0, "mark");

    // A run of the marked day is already done: its result is printed,
    // nothing is read (there is no file yet).
    let out = env.tidemark(&["run", "p", "--period", "2024-01-02"]);
    out.expect_code(0, "run of a marked day");
    let result = out.json();
    assert_eq!(result["status"], "done", "{out}");
    assert_eq!(result["marked"], "done", "{out}");
    assert_eq!(result["rows_read"], 0, "{out}");
    assert!(out.stderr.contains("already done"), "{out}");

    // A forced run loads it and clears the mark.
    day_file(&env, "2024-01-02");
    env.tidemark(&["run", "p", "--period", "2024-01-02", "--force"])
        .expect_code(0, "forced run of a marked day");
    assert_eq!(env.db.count("FROM p").await, 3);
    let line = status_of(&env, "2024-01-02");
    assert_eq!(line["status"], "done", "{line}");
    assert_eq!(line["rows_inserted"], 3, "{line}");
    assert_eq!(line["attempts"], 2, "{line}");
    assert_eq!(line["marked"], Json::Null, "{line}");
    assert_eq!(line["mark_note"], Json::Null, "{line}");
    // The period's story tells the mark apart from the run.
    let out = env.tidemark(&["status", "p", "--period", "2024-01-02"]);
    out.expect_code(0, "status --period");
    assert!(
        out.stdout
            .lines()
            .any(|l| l.trim_start().starts_with("attempt 1 ")
                && l.contains("marked done by mark:")
                && l.contains("loaded by legacy")),
        "{out}"
    );
    let attempts = env
        .db
        .select(
            &["attempt", "marked"],
            "FROM tidemark_v1_attempts ORDER BY attempt",
        )
        .await;
    assert_eq!(
        attempts,
        [
            vec![Some("1".to_string()), Some("done".to_string())],
            vec![Some("2".to_string()), None],
        ]
    );
}

/// The `status --json` fields `(status, attempts)` of the key of `day`.
fn state_of(env: &Env, day: &str) -> (String, i64) {
    let line = status_of(env, day);
    (
        line["status"].as_str().unwrap_or_default().to_string(),
        line["attempts"].as_i64().unwrap_or(-1),
    )
}

/// A failed key backs off (`not_before`, by the database's clock): `sync`
/// leaves it alone, `sync --now` and `run --now` run it at once. A plain
/// `run` never waited for a back-off: it runs it too.
async fn now_lifts_the_back_off_of_a_failed_key(backend: Backend) {
    let env = daily(backend).await;
    for day in ["2024-01-01", "2024-01-02", "2024-01-03"] {
        day_file(&env, day);
    }
    // 04 and 05 have no file yet: they fail, and back off for a minute.
    env.tidemark(&["sync", "p"])
        .expect_code(1, "04 and 05 fail");
    for day in ["2024-01-04", "2024-01-05"] {
        assert_eq!(state_of(&env, day), ("failed".to_string(), 1), "{day}");
        let line = status_of(&env, day);
        assert!(line["not_before"].is_string(), "a back-off: {line}");
    }
    day_file(&env, "2024-01-04");
    day_file(&env, "2024-01-05");

    // Without --now, sync leaves both within their back-off.
    let out = env.tidemark(&["sync", "p", "--dry-run"]);
    out.expect_code(0, "sync --dry-run");
    for day in ["2024-01-04", "2024-01-05"] {
        let line = out.stdout.lines().find(|l| l.starts_with(day));
        assert!(
            line.is_some_and(|l| l.contains("skip: failed: source; retried from")),
            "{day}\n{out}"
        );
    }
    env.tidemark(&["sync", "p"])
        .expect_code(0, "sync within the back-off");
    for day in ["2024-01-04", "2024-01-05"] {
        assert_eq!(
            state_of(&env, day),
            ("failed".to_string(), 1),
            "{day}: not run within its back-off"
        );
    }

    // run --now runs 04 now.
    let out = env.tidemark(&["run", "p", "--period", "2024-01-04", "--now"]);
    out.expect_code(0, "run --now");
    assert_eq!(state_of(&env, "2024-01-04"), ("done".to_string(), 2));
    assert_eq!(status_of(&env, "2024-01-04")["not_before"], Json::Null);

    // sync --now runs 05 (its dry run says so first).
    let out = env.tidemark(&["sync", "p", "--now", "--dry-run"]);
    out.expect_code(0, "sync --now --dry-run");
    let line = out.stdout.lines().find(|l| l.starts_with("2024-01-05"));
    assert!(
        line.is_some_and(|l| l.contains("re-run: failed: source")),
        "{out}"
    );
    env.tidemark(&["sync", "p", "--now"])
        .expect_code(0, "sync --now");
    assert_eq!(state_of(&env, "2024-01-05"), ("done".to_string(), 2));
    assert_eq!(env.db.count("FROM p").await, 15);

    // A plain run of a key within its back-off runs it too (run is the
    // operator's: it never waited).
    env.write("pipelines/data/2024-01-05.csv", "not,a\n");
    env.tidemark(&["run", "p", "--period", "2024-01-05", "--force"])
        .expect_code(1, "a file without the id column fails");
    day_file(&env, "2024-01-05");
    env.tidemark(&["run", "p", "--period", "2024-01-05"])
        .expect_code(0, "run within the back-off");
    assert_eq!(state_of(&env, "2024-01-05"), ("done".to_string(), 4));
}
