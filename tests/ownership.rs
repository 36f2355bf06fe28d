//! Issue 10 item 2: a natural key held by two periods. Daily "changed
//! records" exports put the same key into several days; the row belongs to
//! the latest period that holds it (ADR 0006), so re-running an older
//! period never reverts it, whatever order the periods ran in. Each
//! scenario runs the real binary on both databases.

use serde_json::Value as Json;

use crate::support::{backend_tests, norm_timestamp, Backend, Env};

backend_tests! {
    older_period_rerun_never_reverts_a_newer_row: older_period_rerun_never_reverts_a_newer_row_sqlite, older_period_rerun_never_reverts_a_newer_row_postgres;
    the_order_periods_run_in_does_not_decide_the_owner: the_order_periods_run_in_does_not_decide_the_owner_sqlite, the_order_periods_run_in_does_not_decide_the_owner_postgres;
    a_newer_period_reconciles_the_keys_it_took_over: a_newer_period_reconciles_the_keys_it_took_over_sqlite, a_newer_period_reconciles_the_keys_it_took_over_postgres;
    equal_period_starts_leave_the_row_with_its_holder: equal_period_starts_leave_the_row_with_its_holder_sqlite, equal_period_starts_leave_the_row_with_its_holder_postgres;
}

/// Pipeline `changes`: daily CSVs `data/YYYY-MM-DD.csv` (`id,status`),
/// keyed on `id`, deleting vanished rows, with the given sources.
fn changes_pipeline(env: &Env, sources: &[&str]) {
    let sources: String = sources
        .iter()
        .map(|id| {
            format!(
                "[[sources]]\nid = \"{id}\"\ntransport = \"file\"\nformat = \"csv\"\n\
                 path = \"data/{id}/{{period.start:%Y-%m-%d}}.csv\"\nmissing = \"empty\"\n"
            )
        })
        .collect();
    env.write(
        "pipelines/changes.toml",
        &format!(
            r#"name = "changes"
export_type = "changed_records"
[period]
granularity = "day"
timezone = "Europe/Berlin"
{sources}
[fields]
id = {{ type = "text", required = true }}
status = {{ type = "text" }}
[load]
table = "changes"
key = ["id"]
on_missing = "delete"
max_delete_fraction = 1.0
"#
        ),
    );
}

fn day_file(env: &Env, source: &str, day: &str, rows: &str) {
    env.write(
        format!("pipelines/data/{source}/{day}.csv"),
        &format!("id,status\n{rows}"),
    );
}

/// `id -> (status, period start in UTC, source)` of the whole table.
async fn table(env: &Env) -> Vec<(String, String, String, String)> {
    env.db
        .select(
            &["id", "status", "_tm_period_start", "_tm_source"],
            "FROM changes ORDER BY id",
        )
        .await
        .into_iter()
        .map(|r| {
            let text = |i: usize| r[i].clone().unwrap_or_default();
            (text(0), text(1), norm_timestamp(&text(2)), text(3))
        })
        .collect()
}

fn row(id: &str, status: &str, start: &str, source: &str) -> (String, String, String, String) {
    (id.into(), status.into(), start.into(), source.into())
}

const DAY1: &str = "2023-12-31T23:00:00Z";
const DAY2: &str = "2024-01-01T23:00:00Z";

fn count(json: &Json, key: &str) -> u64 {
    json.get(key)
        .and_then(Json::as_u64)
        .unwrap_or_else(|| panic!("no count {key:?} in {json}"))
}

/// The issue's reproduction: after a backfill A is `shipped` under day 2;
/// `run --period day1 --force` once set it back to `new` and moved it to
/// day 1, counted as an update. Now day 1 leaves it, counts it as
/// superseded (in its result, the ledger and the backfill summary) and
/// does not delete it either; day 1's own rows are re-synced as usual.
async fn older_period_rerun_never_reverts_a_newer_row(backend: Backend) {
    let env = Env::new(backend).await;
    changes_pipeline(&env, &["files"]);
    day_file(&env, "files", "2024-01-01", "A,new\nB,open\n");
    day_file(&env, "files", "2024-01-02", "A,shipped\nC,open\n");
    let out = env.tidemark(&[
        "backfill",
        "changes",
        "--from",
        "2024-01-01",
        "--to",
        "2024-01-02",
    ]);
    out.expect_code(0, "backfill");
    let after_backfill = vec![
        row("A", "shipped", DAY2, "files"),
        row("B", "open", DAY1, "files"),
        row("C", "open", DAY2, "files"),
    ];
    assert_eq!(
        table(&env).await,
        after_backfill,
        "after the backfill\n{out}"
    );

    // Day 1 again, with B changed: B is updated, A is left to day 2.
    day_file(&env, "files", "2024-01-01", "A,new\nB,closed\n");
    let out = env.tidemark(&["run", "changes", "--period", "2024-01-01", "--force"]);
    out.expect_code(0, "forced re-run of day 1");
    assert_eq!(
        table(&env).await,
        vec![
            row("A", "shipped", DAY2, "files"),
            row("B", "closed", DAY1, "files"),
            row("C", "open", DAY2, "files"),
        ],
        "A keeps day 2's value\n{out}"
    );
    let result = out.json();
    assert_eq!(count(&result, "rows_superseded"), 1, "{result}");
    assert_eq!(count(&result, "rows_updated"), 1, "only B: {result}");
    assert_eq!(
        count(&result, "rows_deleted"),
        0,
        "A did not vanish from day 1: {result}"
    );
    assert!(
        out.stderr.contains("1 row(s) left as they are"),
        "one log line says so\n{out}"
    );
    let entry = env
        .status_of("changes", "2024-01-01")
        .expect("day 1 in the ledger");
    assert_eq!(count(&entry, "rows_superseded"), 1, "{entry}");

    // A forced backfill over both days: the summary shows the count, and
    // the end state is the same.
    let out = env.tidemark(&[
        "backfill",
        "changes",
        "--from",
        "2024-01-01",
        "--to",
        "2024-01-02",
        "--force",
    ]);
    out.expect_code(0, "forced backfill");
    assert!(out.stdout.contains("SUPERSEDED"), "{out}");
    let day1_line = out
        .stdout
        .lines()
        .find(|l| l.starts_with("2024-01-01"))
        .unwrap_or_else(|| panic!("no line for day 1\n{out}"));
    assert!(
        day1_line.trim_end().ends_with(" 1"),
        "day 1 supersedes one row: {day1_line:?}"
    );
    assert_eq!(table(&env).await[0], row("A", "shipped", DAY2, "files"));
}

/// Periods of a backfill may finish in any order (`--concurrency`), so the
/// owner cannot be "whoever wrote last": day 2 loaded first keeps A when
/// day 1 loads afterwards, exactly as if they had run in calendar order.
async fn the_order_periods_run_in_does_not_decide_the_owner(backend: Backend) {
    let env = Env::new(backend).await;
    changes_pipeline(&env, &["files"]);
    day_file(&env, "files", "2024-01-01", "A,new\n");
    day_file(&env, "files", "2024-01-02", "A,shipped\n");
    env.tidemark(&["run", "changes", "--period", "2024-01-02"])
        .expect_code(0, "day 2 first");
    let out = env.tidemark(&["run", "changes", "--period", "2024-01-01"]);
    out.expect_code(0, "then day 1");
    assert_eq!(
        table(&env).await,
        vec![row("A", "shipped", DAY2, "files")],
        "{out}"
    );
    let result = out.json();
    assert_eq!(
        (
            count(&result, "rows_inserted"),
            count(&result, "rows_superseded")
        ),
        (0, 1),
        "{result}"
    );
}

/// A newer period takes a key over from an older one (counted as an
/// update), and its own reconciliation may delete that key when it leaves
/// its source; once no period holds the key, the older period's re-run
/// brings its row back.
async fn a_newer_period_reconciles_the_keys_it_took_over(backend: Backend) {
    let env = Env::new(backend).await;
    changes_pipeline(&env, &["files"]);
    day_file(&env, "files", "2024-01-01", "A,new\nB,open\n");
    day_file(&env, "files", "2024-01-02", "A,shipped\n");
    env.tidemark(&["run", "changes", "--period", "2024-01-01"])
        .expect_code(0, "day 1");
    let out = env.tidemark(&["run", "changes", "--period", "2024-01-02"]);
    out.expect_code(0, "day 2 takes A over");
    let result = out.json();
    assert_eq!(count(&result, "rows_updated"), 1, "{result}");
    assert_eq!(
        table(&env).await,
        vec![
            row("A", "shipped", DAY2, "files"),
            row("B", "open", DAY1, "files")
        ]
    );

    // Day 2's export no longer has A: day 2 deletes its own row.
    day_file(&env, "files", "2024-01-02", "D,open\n");
    let out = env.tidemark(&["run", "changes", "--period", "2024-01-02", "--force"]);
    out.expect_code(0, "day 2 without A");
    assert_eq!(count(&out.json(), "rows_deleted"), 1, "{out}");
    assert_eq!(
        table(&env).await,
        vec![
            row("B", "open", DAY1, "files"),
            row("D", "open", DAY2, "files")
        ]
    );

    // Nobody holds A now: day 1's re-run writes its version again.
    let out = env.tidemark(&["run", "changes", "--period", "2024-01-01", "--force"]);
    out.expect_code(0, "day 1 again");
    let result = out.json();
    assert_eq!(
        (
            count(&result, "rows_inserted"),
            count(&result, "rows_superseded")
        ),
        (1, 0),
        "{result}"
    );
    assert_eq!(table(&env).await[0], row("A", "new", DAY1, "files"));
}

/// Two sources with the same key in the same period: neither is newer, so
/// the row stays with the source that holds it, and re-runs of the other do
/// not move it back and forth (each would silently revert the other).
async fn equal_period_starts_leave_the_row_with_its_holder(backend: Backend) {
    let env = Env::new(backend).await;
    changes_pipeline(&env, &["east", "west"]);
    day_file(&env, "east", "2024-01-01", "A,east\n");
    day_file(&env, "west", "2024-01-01", "A,west\nW,open\n");
    env.tidemark(&[
        "run",
        "changes",
        "--period",
        "2024-01-01",
        "--source",
        "east",
    ])
    .expect_code(0, "east");
    for _ in 0..2 {
        let out = env.tidemark(&[
            "run",
            "changes",
            "--period",
            "2024-01-01",
            "--source",
            "west",
            "--force",
        ]);
        out.expect_code(0, "west");
        assert_eq!(count(&out.json(), "rows_superseded"), 1, "{out}");
        assert_eq!(
            table(&env).await,
            vec![
                row("A", "east", DAY1, "east"),
                row("W", "open", DAY1, "west")
            ],
            "{out}"
        );
    }
    // The holder itself re-syncs its row as usual.
    day_file(&env, "east", "2024-01-01", "A,east2\n");
    let out = env.tidemark(&[
        "run",
        "changes",
        "--period",
        "2024-01-01",
        "--source",
        "east",
        "--force",
    ]);
    out.expect_code(0, "east again");
    assert_eq!(count(&out.json(), "rows_updated"), 1, "{out}");
    assert_eq!(table(&env).await[0], row("A", "east2", DAY1, "east"));
}
