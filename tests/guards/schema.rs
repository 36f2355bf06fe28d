//! Schema evolution: a new nullable field becomes a new column, the
//! periods done before are `stale`, and `backfill --only stale` fills the
//! column for them without rewriting rows that did not change. A changed
//! type, a removed field still in the table, and a new required field stay
//! contract errors naming the columns.

use std::time::{Duration, Instant};

use super::{at, count, csv, day_file, day_path, flag, ledger, lineage, shop, text, FIELDS};
use crate::support::{backend_tests, Backend, Env, FifoWriter};

backend_tests! {
    added_nullable_field_adds_the_column_and_only_stale_fills_history: added_nullable_field_adds_the_column_and_only_stale_fills_history_sqlite, added_nullable_field_adds_the_column_and_only_stale_fills_history_postgres;
    changed_type_removed_or_required_field_is_still_a_contract_error: changed_type_removed_or_required_field_is_still_a_contract_error_sqlite, changed_type_removed_or_required_field_is_still_a_contract_error_postgres;
    crashed_run_is_not_resumed_under_changed_fields: crashed_run_is_not_resumed_under_changed_fields_sqlite, crashed_run_is_not_resumed_under_changed_fields_postgres;
}

/// Days 1-3 with a `note` for some rows only: the rows without one must
/// not be rewritten when the column arrives.
fn history(env: &Env) {
    day_file(env, "2024-01-01", &[(11, "1.10", "late"), (12, "1.20", "")]);
    day_file(env, "2024-01-02", &[(21, "2.10", ""), (22, "2.20", "")]);
    day_file(
        env,
        "2024-01-03",
        &[(31, "3.10", ""), (32, "3.20", "ok"), (33, "3.30", "")],
    );
}

async fn added_nullable_field_adds_the_column_and_only_stale_fills_history(backend: Backend) {
    let env = Env::new(backend).await;
    shop(&env, FIELDS);
    history(&env);
    let out = env.tidemark(&[
        "backfill",
        "shop",
        "--from",
        "2024-01-01",
        "--to",
        "2024-01-03",
    ]);
    out.expect_code(0, "first backfill");
    let before = lineage(&env).await;
    assert_eq!(before.len(), 7);

    // A new field in the middle of [fields]: neither required nor a key.
    let with_note = "id = { type = \"int\", required = true }\nnote = { type = \"text\" }\namount = { type = \"decimal\" }";
    shop(&env, with_note);
    day_file(&env, "2024-01-04", &[(41, "4.10", "new"), (42, "4.20", "")]);
    let out = env.tidemark(&["run", "shop", "--period", "2024-01-04"]);
    out.expect_code(0, "the next run adds the column");
    assert_eq!(
        env.db
            .select(&["id", "note"], "FROM shop WHERE id >= 41 ORDER BY id")
            .await,
        vec![
            vec![Some("41".into()), Some("new".into())],
            vec![Some("42".into()), None]
        ]
    );
    assert_eq!(
        env.db
            .count("FROM shop WHERE id < 41 AND note IS NOT NULL")
            .await,
        0,
        "history has no notes yet"
    );

    // The earlier periods are stale, and say why.
    let entries = ledger(&env);
    for day in ["2024-01-01", "2024-01-02", "2024-01-03"] {
        let entry = &entries[day];
        assert!(flag(entry, "stale"), "{day}: {entry}");
        assert_eq!(
            text(entry, "stale_reason"),
            "fields changed: + note",
            "{entry}"
        );
    }
    assert!(!flag(&entries["2024-01-04"], "stale"));
    assert!(entries["2024-01-04"]["stale_reason"].is_null());
    let table = env.tidemark(&["status", "shop"]);
    assert!(
        table.stdout.contains("stale: fields changed: + note"),
        "{table}"
    );

    // --only stale re-runs exactly those, filling the column.
    let out = env.tidemark(&[
        "backfill",
        "shop",
        "--from",
        "2024-01-01",
        "--to",
        "2024-01-04",
        "--only",
        "stale",
    ]);
    out.expect_code(0, "backfill --only stale");
    assert!(
        out.stdout
            .contains("1 run key(s) of the range left alone (not stale)"),
        "{out}"
    );
    let entries = ledger(&env);
    for (day, updated, unchanged) in [
        ("2024-01-01", 1, 1),
        ("2024-01-02", 0, 2),
        ("2024-01-03", 1, 2),
    ] {
        let entry = &entries[day];
        assert_eq!(count(entry, "attempts"), 2, "{entry}");
        assert!(!flag(entry, "stale"), "{entry}");
        assert_eq!(count(entry, "rows_updated"), updated, "{entry}");
        assert_eq!(count(entry, "rows_unchanged"), unchanged, "{entry}");
    }
    assert_eq!(
        count(&entries["2024-01-04"], "attempts"),
        1,
        "not stale, not run"
    );
    assert_eq!(
        env.db
            .select(
                &["id", "note"],
                "FROM shop WHERE note IS NOT NULL ORDER BY id"
            )
            .await,
        vec![
            vec![Some("11".into()), Some("late".into())],
            vec![Some("32".into()), Some("ok".into())],
            vec![Some("41".into()), Some("new".into())],
        ]
    );
    // Unchanged rows were not written: same `_tm_loaded_at`, same hash.
    let after = lineage(&env).await;
    for (id, was) in &before {
        let now = &after[id];
        if id == "11" || id == "32" {
            assert_ne!(now.0, was.0, "row {id} got its note: rewritten");
        } else {
            assert_eq!(now, was, "row {id} has no note: not written again");
        }
    }

    // A new handler version makes every done period stale, with its reason.
    env.edit_pipeline("shop", |t| format!("version = \"2\"\n{t}"));
    for (day, entry) in ledger(&env) {
        assert_eq!(
            text(&entry, "stale_reason"),
            "version 1 -> 2",
            "{day}: {entry}"
        );
    }
}

async fn changed_type_removed_or_required_field_is_still_a_contract_error(backend: Backend) {
    let env = Env::new(backend).await;
    let fields = "id = { type = \"int\", required = true }\namount = { type = \"decimal\" }\nnote = { type = \"text\" }";
    shop(&env, fields);
    history(&env);
    env.tidemark(&["run", "shop", "--period", "2024-01-01"])
        .expect_code(0, "first run");
    let before = lineage(&env).await;
    // (fields, natural key, what the error names)
    let cases = [
        (
            fields.replace("\"decimal\"", "\"int\""),
            "id",
            "column `amount` is ",
        ),
        (
            fields.replace("note = { type = \"text\" }", ""),
            "id",
            "column `note` is not in [fields]",
        ),
        (
            format!("{fields}\nextra = {{ type = \"text\", required = true }}"),
            "id",
            "column `extra` is missing",
        ),
        (fields.to_string(), "amount", "natural key (amount)"),
    ];
    for (changed, key, named) in &cases {
        shop(&env, changed);
        env.edit_pipeline("shop", |t| {
            t.replace("key = [\"id\"]", &format!("key = [\"{key}\"]"))
        });
        let out = at(&env, None, &["run", "shop", "--period", "2024-01-02"]);
        out.expect_code(1, named);
        assert!(
            out.stderr.contains("contract error") && out.stderr.contains(named),
            "the contract error names the column ({named})\n{out}"
        );
        let entry = &ledger(&env)["2024-01-02"];
        assert_eq!(text(entry, "status"), "failed");
        assert_eq!(text(entry, "error_class"), "contract");
    }
    // Nothing was added or rewritten by the refused runs.
    assert_eq!(lineage(&env).await, before);
    assert_eq!(env.db.count("FROM shop").await, 2);
    let columns = match backend {
        Backend::Sqlite => "FROM pragma_table_info('shop') WHERE name = 'extra'",
        Backend::Postgres => {
            "FROM information_schema.columns WHERE table_name = 'shop' AND column_name = 'extra'"
        }
    };
    assert_eq!(env.db.count(columns).await, 0, "no column `extra`");
}

/// A run killed after its first batch, then the pipeline gains a field: a
/// resumed attempt would leave the first batch's rows without the new
/// column under a ledger row recording the new fields (so never stale).
/// The period starts over instead.
async fn crashed_run_is_not_resumed_under_changed_fields(backend: Backend) {
    let env = Env::new(backend).await;
    shop(&env, FIELDS);
    let rows = [
        (1, "1.5", "a"),
        (2, "2.5", "b"),
        (3, "3.5", "c"),
        (4, "4.5", "d"),
    ];
    env.tidemark(&["migrate"]).expect_code(0, "migrate");
    let path = env.path(day_path("2024-01-01"));
    let fifo = FifoWriter::create(&path);
    let run = env.spawn(&["run", "shop", "--period", "2024-01-01"]);
    fifo.write(&csv(&rows[..3]));
    let deadline = Instant::now() + Duration::from_secs(30);
    while !(env.db.table_exists("_tm_runs").await
        && env.db.count("FROM _tm_runs WHERE batches = 1").await == 1)
    {
        assert!(Instant::now() < deadline, "the first batch in time");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    run.kill9();
    drop(fifo);
    std::fs::remove_file(&path).expect("remove FIFO");
    day_file(&env, "2024-01-01", &rows);
    shop(
        &env,
        "id = { type = \"int\", required = true }\namount = { type = \"decimal\" }\nnote = { type = \"text\" }",
    );

    env.tidemark(&["run", "shop", "--period", "2024-01-01"])
        .expect_code(0, "the run after the crash");
    assert_eq!(
        env.db
            .select(&["id", "note"], "FROM shop ORDER BY id")
            .await,
        vec![
            vec![Some("1".into()), Some("a".into())],
            vec![Some("2".into()), Some("b".into())],
            vec![Some("3".into()), Some("c".into())],
            vec![Some("4".into()), Some("d".into())],
        ],
        "every row has the new column's value"
    );
    let resumed = env
        .db
        .rows("SELECT CAST(resumed AS TEXT) FROM _tm_attempts ORDER BY attempt DESC")
        .await;
    assert!(
        matches!(resumed[0][0].as_deref(), Some("0" | "false")),
        "started over, not resumed: {resumed:?}"
    );
    let entry = &ledger(&env)["2024-01-01"];
    assert_eq!(count(entry, "attempts"), 2);
    assert!(!flag(entry, "stale"), "{entry}");
}
