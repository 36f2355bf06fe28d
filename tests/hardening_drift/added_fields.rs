//! Item 7: a field added to `[fields]` after periods were loaded is schema
//! evolution, not source drift. A period the ledger saw before the field
//! existed may lack its column: re-running it (`--only stale`, `--force`)
//! ends `done` with the field NULL and writes no unchanged row, while a
//! column the period *was* loaded with that goes missing is still drift.
//! `added` declares the same for periods never loaded, bounded by the first
//! period whose exports have the column, for files and HTTP CSV pages.

use serde_json::Value as Json;

use crate::hardening_extract::{ledger, write_pipeline};
use crate::support::http::{Reply, Server};
use crate::support::{backend_tests, Backend, Env};

backend_tests! {
    added_field_never_fails_a_done_period: added_field_never_fails_a_done_period_sqlite, added_field_never_fails_a_done_period_postgres;
    added_field_never_fails_a_queued_stale_period: added_field_never_fails_a_queued_stale_period_sqlite, added_field_never_fails_a_queued_stale_period_postgres;
    declared_added_field_loads_null_until_its_first_period: declared_added_field_loads_null_until_its_first_period_sqlite, declared_added_field_loads_null_until_its_first_period_postgres;
}

const ID_V: &str = "id = { type = \"text\", required = true }\nv = { type = \"int\" }";

/// Pipeline `p` of the issue: daily CSV files `data/DAY.csv`, `fields`.
fn pipeline(env: &Env, fields: &str) {
    write_pipeline(
        env,
        "p",
        "transport = \"file\"\nformat = \"csv\"\npath = \"data/{period.start:%Y-%m-%d}.csv\"",
        fields,
        "batch_size = 500",
    );
}

fn day_file(env: &Env, day: &str, text: &str) {
    env.write(format!("pipelines/data/{day}.csv"), text);
}

/// `id, v, note, _tm_loaded_at` of every row, by id.
async fn rows(env: &Env) -> Vec<Vec<Option<String>>> {
    env.db
        .select(&["id", "v", "note", "_tm_loaded_at"], "FROM p ORDER BY id")
        .await
}

/// `id, v, _tm_loaded_at` of every row, by id (before `note` exists), with
/// a NULL `note` put in as the table will have it.
async fn rows_before_note(env: &Env) -> Vec<Vec<Option<String>>> {
    let mut rows = env
        .db
        .select(&["id", "v", "_tm_loaded_at"], "FROM p ORDER BY id")
        .await;
    rows.iter_mut().for_each(|r| r.insert(2, None));
    rows
}

/// `backfill p --from 2024-01-01 --to 2024-01-02 --only ONLY`.
fn backfill_first_two_days(env: &Env, only: &str) -> crate::support::Out {
    let range = ["--from", "2024-01-01", "--to", "2024-01-02"];
    let mut args = vec!["backfill", "p"];
    args.extend(range);
    args.extend(["--only", only]);
    env.tidemark(&args)
}

#[track_caller]
fn assert_done(entry: &Json) {
    assert_eq!(entry["status"], "done", "{entry}");
    assert_ne!(entry["stale"], true, "{entry}");
}

/// The reproduction, and what belongs to its class: two days of
/// `id,v`; `note` added; a third day with `note`; `backfill --only stale`
/// of the first two exits 0 and leaves them `done` (not failed, not stale)
/// with `note` NULL and their rows unwritten (same `_tm_loaded_at`), also
/// when one of them first fails for another reason and is re-run; a
/// forced re-run later is `done` again (the period stays marked as one
/// whose export predates `note`); a column the period was loaded with
/// that vanishes (`v` renamed) is still drift, naming `v` and not `note`.
async fn added_field_never_fails_a_done_period(backend: Backend) {
    let env = Env::new(backend).await;
    pipeline(&env, ID_V);
    day_file(&env, "2024-01-01", "id,v\na,1\nb,2\n");
    day_file(&env, "2024-01-02", "id,v\nc,3\nd,4\n");
    env.tidemark(&[
        "backfill",
        "p",
        "--from",
        "2024-01-01",
        "--to",
        "2024-01-02",
    ])
    .expect_code(0, "two days of id,v");
    let loaded = rows_before_note(&env).await;

    pipeline(&env, &format!("{ID_V}\nnote = {{ type = \"text\" }}"));
    day_file(&env, "2024-01-03", "id,v,note\ne,5,hello\n");
    env.tidemark(&["run", "p", "--period", "2024-01-03"])
        .expect_code(0, "the third day has note");
    assert_eq!(ledger(&env, "p", "2024-01-01")["stale"], true);

    // The second day's file is away during the stale re-run: that attempt
    // fails for its own reason, and the retry still knows the day predates
    // `note`.
    let second = env.path("pipelines/data/2024-01-02.csv");
    std::fs::rename(&second, env.path("away.csv")).unwrap();
    let out = backfill_first_two_days(&env, "stale");
    out.expect_code(1, "the second day's file is away");
    assert_eq!(ledger(&env, "p", "2024-01-02")["error_class"], "source");
    std::fs::rename(env.path("away.csv"), &second).unwrap();
    let out = backfill_first_two_days(&env, "failed");
    out.expect_code(0, "the stale days re-run");
    for day in ["2024-01-01", "2024-01-02"] {
        assert_done(&ledger(&env, "p", day));
    }
    let after = rows(&env).await;
    assert_eq!(
        after[..4],
        loaded[..],
        "unchanged rows are not written; note NULL"
    );
    assert_eq!(after[4][2].as_deref(), Some("hello"));

    let out = env.tidemark(&["run", "p", "--period", "2024-01-01", "--force"]);
    out.expect_code(0, "a forced re-run of a day older than note");
    assert_done(&ledger(&env, "p", "2024-01-01"));
    assert_eq!(rows(&env).await[..2], loaded[..2]);

    // Genuine drift of a column the day was loaded with.
    day_file(&env, "2024-01-02", "id,value\nc,3\nd,4\n");
    let out = env.tidemark(&["run", "p", "--period", "2024-01-02", "--force"]);
    out.expect_code(1, "v renamed upstream");
    let entry = ledger(&env, "p", "2024-01-02");
    assert_eq!(entry["status"], "failed", "{entry}");
    assert_eq!(entry["error_class"], "contract", "{entry}");
    let message = entry["error_message"].as_str().unwrap_or_default();
    assert!(
        message.contains("`v`") && !message.contains("`note`"),
        "{message}"
    );
    assert_eq!(rows(&env).await[2..4], loaded[2..4], "nothing written");
}

/// The same through the queue: the stale days enqueued, then `serve
/// --drain` claims them (one claim path for every command): `done`, not
/// stale, `note` NULL, rows unwritten.
async fn added_field_never_fails_a_queued_stale_period(backend: Backend) {
    let env = Env::new(backend).await;
    pipeline(&env, ID_V);
    day_file(
        &env,
        "2024-01-01",
        "id,v
a,1
",
    );
    day_file(
        &env,
        "2024-01-02",
        "id,v
b,2
",
    );
    backfill_first_two_days(&env, "missing").expect_code(0, "two days of id,v");
    let loaded = rows_before_note(&env).await;
    pipeline(&env, &format!("{ID_V}\nnote = {{ type = \"text\" }}"));
    let range = ["--from", "2024-01-01", "--to", "2024-01-02"];
    let mut enqueue = vec!["backfill", "p", "--enqueue", "--only", "stale"];
    enqueue.extend(range);
    env.tidemark(&enqueue)
        .expect_code(0, "enqueue the stale days");
    env.spawn(&["serve", "--no-schedule", "--workers", "1", "--drain"])
        .finish(std::time::Duration::from_secs(60))
        .expect_code(0, "the queue drains");
    for day in ["2024-01-01", "2024-01-02"] {
        assert_done(&ledger(&env, "p", day));
    }
    assert_eq!(rows(&env).await, loaded, "unchanged rows are not written");
}

/// `added = "2024-01-03"` on a field with a `default`: days before it load
/// without the column (the default), the day itself without the column is
/// drift naming `note`, a later day with it loads its values. `added =
/// true` on an HTTP CSV source: a page without the column loads NULL.
async fn declared_added_field_loads_null_until_its_first_period(backend: Backend) {
    let env = Env::new(backend).await;
    pipeline(
        &env,
        &format!("{ID_V}\nnote = {{ type = \"text\", default = \"n/a\", added = \"2024-01-03\" }}"),
    );
    env.tidemark(&["validate", "p"]).expect_code(0, "valid");
    day_file(&env, "2024-01-02", "id,v\na,1\n");
    day_file(&env, "2024-01-03", "id,v\nb,2\n");
    day_file(&env, "2024-01-04", "id,v,note\nc,3,hi\n");
    for day in ["2024-01-02", "2024-01-04"] {
        env.tidemark(&["run", "p", "--period", day])
            .expect_code(0, day);
        assert_done(&ledger(&env, "p", day));
    }
    let out = env.tidemark(&["run", "p", "--period", "2024-01-03"]);
    out.expect_code(1, "the first day that must have note");
    let entry = ledger(&env, "p", "2024-01-03");
    assert_eq!(entry["error_class"], "contract", "{entry}");
    assert!(
        entry["error_message"]
            .as_str()
            .unwrap_or_default()
            .contains("`note`"),
        "{entry}"
    );
    let notes: Vec<Option<String>> = rows(&env).await.into_iter().map(|r| r[2].clone()).collect();
    assert_eq!(notes, [Some("n/a".to_string()), Some("hi".to_string())]);

    let server = Server::start(|_| Reply::status(200, "text/csv", "id,v\nx,9\n"));
    write_pipeline(
        &env,
        "api",
        &format!(
            "transport = \"http\"\nurl = \"{}/csv\"\nformat = \"csv\"",
            server.base
        ),
        &format!("{ID_V}\nnote = {{ type = \"text\", added = true }}"),
        "",
    );
    env.tidemark(&["run", "api", "--period", "2024-01-02"])
        .expect_code(0, "an HTTP CSV page without the declared column");
    assert_done(&ledger(&env, "api", "2024-01-02"));
    let api = env.db.select(&["id", "note"], "FROM api").await;
    assert_eq!(api, [[Some("x".to_string()), None]]);
    // JSON: a record without the key is what "lacks the column" means; a
    // declared field is not warned about as renamed upstream.
    env.write("pipelines/data/j.ndjson", "{\"id\":\"j\",\"v\":1}\n");
    write_pipeline(
        &env,
        "j",
        "transport = \"file\"\nformat = \"ndjson\"\npath = \"data/j.ndjson\"",
        &format!("{ID_V}\nnote = {{ type = \"text\", added = true }}"),
        "",
    );
    let out = env.tidemark(&["run", "j", "--period", "2024-01-02"]);
    out.expect_code(0, "an NDJSON record without the declared key");
    assert!(!out.stderr.contains("absent from every record"), "{out}");
}
