//! Open periods: `run`/`backfill` refuse a period whose end + lag has not
//! passed (exit 2, nothing touched) unless `--allow-open`, which records
//! the run as provisional; `sync` re-runs it, forced, once it is due.

use super::{at, count, day_file, flag, ledger, shop, text, FIELDS};
use crate::support::{backend_tests, Backend, Env};

backend_tests! {
    open_period_is_refused_with_exit_2_and_no_database: open_period_is_refused_with_exit_2_and_no_database_sqlite, open_period_is_refused_with_exit_2_and_no_database_postgres;
    allow_open_is_provisional_and_sync_reruns_it_once_due: allow_open_is_provisional_and_sync_reruns_it_once_due_sqlite, allow_open_is_provisional_and_sync_reruns_it_once_due_postgres;
}

/// 2024-03-07 (UTC) ends at midnight; with `lag = "2h"` it is due at
/// 2024-03-08T02:00:00Z, and not a second before.
async fn open_period_is_refused_with_exit_2_and_no_database(backend: Backend) {
    let env = Env::new(backend).await;
    shop(&env, FIELDS);
    day_file(&env, "2024-03-06", &[(1, "1.5", "")]);
    day_file(&env, "2024-03-07", &[(2, "2.5", "")]);
    let before = Some("2024-03-08T01:59:59Z");
    let refusals = [
        vec!["run", "shop", "--period", "2024-03-07"],
        vec!["run", "shop", "--period", "2024-03-07", "--force"],
        vec!["run", "shop", "--period", "2024-03-07", "--dry-run"],
        vec![
            "backfill",
            "shop",
            "--from",
            "2024-03-06",
            "--to",
            "2024-03-07",
        ],
    ];
    for args in &refusals {
        let out = at(&env, before, args);
        out.expect_code(2, &args.join(" "));
        assert!(
            out.stderr.contains("period 2024-03-07 is still open")
                && out.stderr.contains("due at 2024-03-08T02:00:00Z")
                && out.stderr.contains("--allow-open"),
            "the refusal names the period and the RFC 3339 instant it becomes due\n{out}"
        );
        assert!(
            env.db.untouched().await,
            "{}: nothing touched (no SQLite file, no PostgreSQL table)",
            args.join(" ")
        );
    }
    // The real clock is the default: a period in 2999 is open today.
    let out = at(&env, None, &["run", "shop", "--period", "2999-06-01"]);
    out.expect_code(2, "a period in 2999");
    assert!(out.stderr.contains("due at 2999-06-02T02:00:00Z"), "{out}");
    // A clock that cannot be read is a configuration error naming it.
    let out = at(
        &env,
        Some("tomorrow"),
        &["run", "shop", "--period", "2024-03-07"],
    );
    out.expect_code(2, "TIDEMARK_NOW that is no time");
    assert!(out.stderr.contains("TIDEMARK_NOW"), "{out}");
    assert!(env.db.untouched().await, "a bad clock touches nothing");

    // Due at last: it runs.
    let out = at(
        &env,
        Some("2024-03-08T02:00:00Z"),
        &["run", "shop", "--period", "2024-03-07"],
    );
    out.expect_code(0, "run once due");
    let entry = &ledger(&env)["2024-03-07"];
    assert_eq!(text(entry, "status"), "done");
    assert!(!flag(entry, "provisional"), "{entry}");
}

async fn allow_open_is_provisional_and_sync_reruns_it_once_due(backend: Backend) {
    let env = Env::new(backend).await;
    shop(&env, FIELDS);
    // sync starts on the day before the open one.
    env.edit_pipeline("shop", |t| t.replace("2024-01-01", "2024-03-06"));
    day_file(&env, "2024-03-06", &[(1, "1.5", "")]);
    day_file(&env, "2024-03-07", &[(2, "2.5", ""), (3, "3.5", "")]);
    let noon = Some("2024-03-07T12:00:00Z");
    let out = at(
        &env,
        noon,
        &["run", "shop", "--period", "2024-03-07", "--allow-open"],
    );
    out.expect_code(0, "run --allow-open of an open period");
    let entry = &ledger(&env)["2024-03-07"];
    assert_eq!(text(entry, "status"), "done");
    assert!(flag(entry, "provisional"), "done while open: {entry}");
    assert_eq!(count(entry, "rows_read"), 2);
    let table = at(&env, noon, &["status", "shop"]);
    table.expect_code(0, "status");
    assert!(table.stdout.contains("provisional"), "{table}");

    // More rows arrive for the day, which is not over yet.
    day_file(
        &env,
        "2024-03-07",
        &[
            (2, "2.5", ""),
            (3, "3.5", ""),
            (4, "4.5", ""),
            (5, "5.5", ""),
        ],
    );
    // Before it is due, sync runs only the earlier day and leaves it alone.
    let out = at(&env, Some("2024-03-08T01:00:00Z"), &["sync", "shop"]);
    out.expect_code(0, "sync before the day is due");
    let entries = ledger(&env);
    assert_eq!(text(&entries["2024-03-06"], "status"), "done");
    assert_eq!(count(&entries["2024-03-07"], "attempts"), 1, "not due yet");
    assert_eq!(env.db.count("FROM shop WHERE id IN (4, 5)").await, 0);

    // Once due, sync re-runs it (forced) and picks up the rows added since.
    let due = Some("2024-03-08T03:00:00Z");
    let out = at(&env, due, &["sync", "shop"]);
    out.expect_code(0, "sync once the day is due");
    let entry = &ledger(&env)["2024-03-07"];
    assert_eq!(count(entry, "attempts"), 2, "re-run once: {entry}");
    assert!(!flag(entry, "provisional"), "final now: {entry}");
    assert_eq!(count(entry, "rows_read"), 4);
    assert_eq!(count(entry, "rows_inserted"), 2);
    assert_eq!(count(entry, "rows_unchanged"), 2);
    assert_eq!(env.db.count("FROM shop").await, 5);
    // And not again.
    let out = at(&env, due, &["sync", "shop"]);
    out.expect_code(0, "sync with nothing left to do");
    assert!(out.stdout.contains("nothing due"), "{out}");
    assert_eq!(count(&ledger(&env)["2024-03-07"], "attempts"), 2);
}
