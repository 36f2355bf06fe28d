//! Foundation behaviour: file sources into SQLite and PostgreSQL.
//!
//! Every scenario runs the real binary on a copy of the shipped `orders`
//! example (daily CSV exports, 20 orders a day, January 2024, Europe/Berlin)
//! and checks what the contract promises: rows in the destination table,
//! exit codes, the ledger (`status --json`, `_tm_runs`, `_tm_attempts`,
//! `_tm_rejects`) and the messages on stderr.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::PathBuf;
use std::thread;
use std::time::Duration;

use serde_json::Value as Json;

use crate::support::{
    backend_tests, norm_decimal, norm_timestamp, Backend, Csv, Env, FifoWriter, TestDb, BIN,
};

backend_tests! {
    backfill_loads_january_exactly: backfill_loads_january_exactly_sqlite, backfill_loads_january_exactly_postgres;
    rerun_of_done_periods_changes_nothing: rerun_of_done_periods_changes_nothing_sqlite, rerun_of_done_periods_changes_nothing_postgres;
    forced_rerun_with_delete: forced_rerun_with_delete_sqlite, forced_rerun_with_delete_postgres;
    forced_rerun_with_soft_delete: forced_rerun_with_soft_delete_sqlite, forced_rerun_with_soft_delete_postgres;
    forced_rerun_with_keep: forced_rerun_with_keep_sqlite, forced_rerun_with_keep_postgres;
    malformed_value_fails_only_its_period: malformed_value_fails_only_its_period_sqlite, malformed_value_fails_only_its_period_postgres;
    missing_file_is_a_source_error_without_retry: missing_file_is_a_source_error_without_retry_sqlite, missing_file_is_a_source_error_without_retry_postgres;
    vanished_file_never_wipes_a_period_unless_forced: vanished_file_never_wipes_a_period_unless_forced_sqlite, vanished_file_never_wipes_a_period_unless_forced_postgres;
    missing_file_of_a_new_period_is_done_empty: missing_file_of_a_new_period_is_done_empty_sqlite, missing_file_of_a_new_period_is_done_empty_postgres;
    config_errors_exit_2_and_touch_nothing: config_errors_exit_2_and_touch_nothing_sqlite, config_errors_exit_2_and_touch_nothing_postgres;
    duplicate_keys_last_wins: duplicate_keys_last_wins_sqlite, duplicate_keys_last_wins_postgres;
    duplicate_keys_first_wins: duplicate_keys_first_wins_sqlite, duplicate_keys_first_wins_postgres;
    duplicate_keys_error_fails_the_period: duplicate_keys_error_fails_the_period_sqlite, duplicate_keys_error_fails_the_period_postgres;
    second_run_of_a_held_key_exits_75_or_waits: second_run_of_a_held_key_exits_75_or_waits_sqlite, second_run_of_a_held_key_exits_75_or_waits_postgres;
    kill_9_then_rerun_resumes_and_takes_over: kill_9_then_rerun_resumes_and_takes_over_sqlite, kill_9_then_rerun_resumes_and_takes_over_postgres;
    rejects_within_max_rejects_are_kept: rejects_within_max_rejects_are_kept_sqlite, rejects_within_max_rejects_are_kept_postgres;
    rejects_over_max_rejects_fail_the_period: rejects_over_max_rejects_fail_the_period_sqlite, rejects_over_max_rejects_fail_the_period_postgres;
    rejects_over_max_keep_earlier_batches_then_recover: rejects_over_max_keep_earlier_batches_then_recover_sqlite, rejects_over_max_keep_earlier_batches_then_recover_postgres;
    nul_character_in_text_is_a_reject: nul_character_in_text_is_a_reject_sqlite, nul_character_in_text_is_a_reject_postgres;
    sub_microsecond_time_key_survives_a_forced_rerun: sub_microsecond_time_key_survives_a_forced_rerun_sqlite, sub_microsecond_time_key_survives_a_forced_rerun_postgres;
    year_outside_1_to_9999_is_bad_input: year_outside_1_to_9999_is_bad_input_sqlite, year_outside_1_to_9999_is_bad_input_postgres;
    validate_checks_files_and_touches_no_database: validate_checks_files_and_touches_no_database_sqlite, validate_checks_files_and_touches_no_database_postgres;
    backfill_with_concurrency_loads_the_same: backfill_with_concurrency_loads_the_same_sqlite, backfill_with_concurrency_loads_the_same_postgres;
    period_is_named_by_any_time_inside_it: period_is_named_by_any_time_inside_it_sqlite, period_is_named_by_any_time_inside_it_postgres;
    usage_errors_exit_2_and_touch_nothing: usage_errors_exit_2_and_touch_nothing_sqlite, usage_errors_exit_2_and_touch_nothing_postgres;
    existing_table_contradicting_fields_is_a_contract_error: existing_table_contradicting_fields_is_a_contract_error_sqlite, existing_table_contradicting_fields_is_a_contract_error_postgres;
    simultaneous_starts_on_a_fresh_database: simultaneous_starts_on_a_fresh_database_sqlite, simultaneous_starts_on_a_fresh_database_postgres;
    log_lines_inside_a_run_carry_its_context: log_lines_inside_a_run_carry_its_context_sqlite, log_lines_inside_a_run_carry_its_context_postgres;
}

// ---------------------------------------------------------------------------
// The orders example: paths, expected rows, table reads
// ---------------------------------------------------------------------------

/// `[fields]` of `orders.toml`, in table order.
const ORDER_COLUMNS: [&str; 8] = [
    "order_id",
    "customer",
    "amount",
    "currency",
    "status",
    "created_at",
    "note",
    "region",
];
const AMOUNT: usize = 2;
const CREATED_AT: usize = 5;

/// Lineage columns every destination table carries.
const LINEAGE: [&str; 6] = [
    "_tm_source",
    "_tm_export_type",
    "_tm_period_start",
    "_tm_run_id",
    "_tm_row_hash",
    "_tm_loaded_at",
];

/// Fields every `status --json` object has (the contract's list).
const STATUS_FIELDS: [&str; 18] = [
    "pipeline",
    "source",
    "export_type",
    "period_start",
    "period_end",
    "status",
    "attempts",
    "rows_read",
    "rows_inserted",
    "rows_updated",
    "rows_unchanged",
    "rows_deleted",
    "rows_rejected",
    "error_class",
    "error_message",
    "started_at",
    "finished_at",
    "handler_version",
];

type Rows = Vec<Vec<Option<String>>>;

/// `2024-01-DD` (the period's name on the command line).
fn day(d: u32) -> String {
    format!("2024-01-{d:02}")
}

/// The period start of January day `d` in Europe/Berlin (UTC+1 all January).
fn day_start(d: u32) -> String {
    format!("2024-01-{d:02}T00:00:00+01:00")
}

/// The export file of January day `d` (relative to the working directory).
fn day_csv(env: &Env, d: u32) -> PathBuf {
    env.path(format!("pipelines/data/orders/2024/01/{d:02}/orders.csv"))
}

/// SQL condition: rows of the run key of January day `d`.
fn of_day(db: &TestDb, d: u32) -> String {
    db.instant_is("_tm_period_start", &day_start(d))
}

/// What `orders.toml` makes of one export: `total` → `amount` (decimal),
/// empty currency → `EUR`, empty cells → NULL, `created` read as Berlin
/// wall-clock time (UTC+1 in January) and stored in UTC, `region` = source
/// id. Sorted by order_id.
fn expected_orders(csv: &Csv) -> Rows {
    let col = |name: &str| csv.col(name);
    let opt = |s: &str| (!s.is_empty()).then(|| s.to_string());
    let mut rows: Rows = csv
        .rows
        .iter()
        .map(|r| {
            let created =
                chrono::NaiveDateTime::parse_from_str(&r[col("created")], "%d.%m.%Y %H:%M")
                    .unwrap_or_else(|e| panic!("bad created in sample data {r:?}: {e}"));
            let created_utc = (created - chrono::Duration::hours(1))
                .format("%Y-%m-%dT%H:%M:%SZ")
                .to_string();
            let currency = &r[col("currency")];
            vec![
                opt(&r[col("order_id")]),
                opt(&r[col("customer")]),
                Some(norm_decimal(&r[col("total")])),
                Some(if currency.is_empty() {
                    "EUR".to_string()
                } else {
                    currency.clone()
                }),
                opt(&r[col("status")]),
                Some(created_utc),
                opt(&r[col("note")]),
                Some("archive".to_string()),
            ]
        })
        .collect();
    rows.sort();
    rows
}

/// What a backfill of all of January must load.
fn expected_january(env: &Env) -> Rows {
    let mut expected = Rows::new();
    for d in 1..=31 {
        expected.extend(expected_orders(&Csv::read(&day_csv(env, d))));
    }
    expected.sort();
    expected
}

/// The `orders` table's rows matching `filter` (SQL), normalised, by order_id.
async fn table_orders(db: &TestDb, filter: &str) -> Rows {
    let mut rows = db
        .select(
            &ORDER_COLUMNS,
            &format!("FROM orders WHERE {filter} ORDER BY order_id"),
        )
        .await;
    for row in &mut rows {
        row[AMOUNT] = row[AMOUNT].as_deref().map(norm_decimal);
        row[CREATED_AT] = row[CREATED_AT].as_deref().map(norm_timestamp);
    }
    rows
}

/// Compares two row sets, naming the first difference.
#[track_caller]
fn assert_rows_eq(actual: &Rows, expected: &Rows, what: &str) {
    let a: BTreeMap<_, _> = actual.iter().map(|r| (r[0].clone(), r)).collect();
    let e: BTreeMap<_, _> = expected.iter().map(|r| (r[0].clone(), r)).collect();
    let missing: Vec<_> = e.keys().filter(|k| !a.contains_key(*k)).collect();
    let extra: Vec<_> = a.keys().filter(|k| !e.contains_key(*k)).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "{what}: rows missing from the table: {missing:?}; unexpected rows: {extra:?}"
    );
    for (key, row) in &e {
        assert_eq!(
            a[key], *row,
            "{what}: row {key:?} differs (columns {ORDER_COLUMNS:?})"
        );
    }
    assert_eq!(
        actual.len(),
        expected.len(),
        "{what}: duplicate rows in the table"
    );
}

/// `order_id → (_tm_loaded_at, _tm_run_id, _tm_row_hash)` of rows matching `filter`.
async fn lineage_snapshot(db: &TestDb, filter: &str) -> BTreeMap<String, Vec<Option<String>>> {
    db.select(
        &["order_id", "_tm_loaded_at", "_tm_run_id", "_tm_row_hash"],
        &format!("FROM orders WHERE {filter} ORDER BY order_id"),
    )
    .await
    .into_iter()
    .map(|mut r| {
        let id = r.remove(0).expect("order_id is never NULL");
        (id, r)
    })
    .collect()
}

async fn count_orders(db: &TestDb, filter: &str) -> i64 {
    db.count(&format!("FROM orders WHERE {filter}")).await
}

/// An integer field of a JSON object (status entry or run result).
#[track_caller]
fn num(entry: &Json, field: &str) -> i64 {
    entry
        .get(field)
        .and_then(Json::as_i64)
        .unwrap_or_else(|| panic!("`{field}` is not an integer in {entry}"))
}

#[track_caller]
fn text<'a>(entry: &'a Json, field: &str) -> &'a str {
    entry
        .get(field)
        .and_then(Json::as_str)
        .unwrap_or_else(|| panic!("`{field}` is not a string in {entry}"))
}

/// The ledger entry of a day, which must exist.
#[track_caller]
fn ledger(env: &Env, d: u32) -> Json {
    env.status_of("orders", &day(d))
        .unwrap_or_else(|| panic!("no ledger entry for {}", day(d)))
}

/// Asserts the six counts of a status entry or run result.
#[track_caller]
fn assert_counts(entry: &Json, expected: [i64; 6], what: &str) {
    let names = [
        "rows_read",
        "rows_inserted",
        "rows_updated",
        "rows_unchanged",
        "rows_deleted",
        "rows_rejected",
    ];
    let actual = names.map(|n| num(entry, n));
    assert_eq!(actual, expected, "{what}: counts {names:?} in {entry}");
}

// ---------------------------------------------------------------------------
// 1. A backfill loads exactly the source, with lineage and a full ledger
// ---------------------------------------------------------------------------

async fn backfill_loads_january_exactly(backend: Backend) {
    let env = Env::orders(backend).await;
    let out = env.backfill_orders(1, 31);
    out.expect_code(0, "backfill of January");
    assert!(
        out.stdout.contains("31 done"),
        "summary should count 31 done run keys\n{out}"
    );

    // The table equals the source exports.
    let expected = expected_january(&env);
    assert_eq!(expected.len(), 620, "the sample data has 20 orders a day");
    let actual = table_orders(&env.db, "1 = 1").await;
    assert_eq!(actual.len(), 620, "the table should hold 620 rows");
    assert_rows_eq(&actual, &expected, "January backfill");

    // Spot checks, written out by hand from pipelines/data/orders/2024/01/01/orders.csv.
    let first = &actual[0];
    assert_eq!(first[0].as_deref(), Some("O-20240101-001"));
    assert_eq!(
        first[AMOUNT].as_deref(),
        Some("266.12"),
        "amount comes from `total`"
    );
    assert_eq!(
        first[3].as_deref(),
        Some("EUR"),
        "an empty currency takes the default EUR"
    );
    assert_eq!(
        first[CREATED_AT].as_deref(),
        Some("2024-01-01T13:25:00Z"),
        "created is Berlin time, stored in UTC"
    );
    assert_eq!(first[6].as_deref(), Some("call before delivery"));
    assert_eq!(
        first[7].as_deref(),
        Some("archive"),
        "region is the source id"
    );
    assert_eq!(
        actual[2][3].as_deref(),
        Some("USD"),
        "a given currency is kept"
    );
    assert_eq!(actual[3][6], None, "an empty note is NULL");
    assert_eq!(
        actual[2][CREATED_AT].as_deref(),
        Some("2023-12-31T23:01:00Z")
    );

    // Every period done, with the contract's fields.
    let status = env.status("orders");
    assert_eq!(status.len(), 31, "one ledger entry per day: {status:?}");
    for (i, entry) in status.iter().enumerate() {
        for field in STATUS_FIELDS {
            assert!(
                entry.get(field).is_some(),
                "status --json lacks `{field}`: {entry}"
            );
        }
        let d = u32::try_from(i + 1).expect("small");
        assert_eq!(text(entry, "pipeline"), "orders");
        assert_eq!(text(entry, "source"), "archive");
        assert_eq!(text(entry, "export_type"), "orders_daily");
        assert_eq!(
            norm_timestamp(text(entry, "period_start")),
            norm_timestamp(&day_start(d))
        );
        assert_eq!(
            norm_timestamp(text(entry, "period_end")),
            norm_timestamp(&day_start(d + 1).replace("2024-01-32", "2024-02-01"))
        );
        assert_eq!(text(entry, "status"), "done", "{entry}");
        assert_eq!(num(entry, "attempts"), 1, "{entry}");
        assert_counts(entry, [20, 20, 0, 0, 0, 0], "first load of a day");
        assert!(
            entry["error_class"].is_null() && entry["error_message"].is_null(),
            "{entry}"
        );
        assert!(
            entry["started_at"].is_string() && entry["finished_at"].is_string(),
            "{entry}"
        );
        assert_eq!(
            text(entry, "handler_version"),
            "1",
            "version of orders.toml"
        );
    }

    // Lineage on every row.
    let null_lineage = LINEAGE.map(|c| format!("{c} IS NULL")).join(" OR ");
    assert_eq!(
        count_orders(&env.db, &null_lineage).await,
        0,
        "no lineage column may be NULL"
    );
    assert_eq!(
        count_orders(
            &env.db,
            "_tm_source = 'archive' AND _tm_export_type = 'orders_daily'"
        )
        .await,
        620
    );
    for d in [1, 15, 31] {
        assert_eq!(
            count_orders(&env.db, &of_day(&env.db, d)).await,
            20,
            "_tm_period_start of day {d}"
        );
    }
    let run_ids = env
        .db
        .select(&["COUNT(DISTINCT _tm_run_id)"], "FROM orders")
        .await;
    assert_eq!(
        run_ids[0][0].as_deref(),
        Some("31"),
        "each period is its own run"
    );
}

// ---------------------------------------------------------------------------
// 2. Re-running done periods does nothing and prints the stored result
// ---------------------------------------------------------------------------

async fn rerun_of_done_periods_changes_nothing(backend: Backend) {
    let env = Env::orders(backend).await;
    env.backfill_orders(1, 31).expect_code(0, "first backfill");
    let rows_before = lineage_snapshot(&env.db, "1 = 1").await;
    let status_before = env.status("orders");

    let out = env.backfill_orders(1, 31);
    out.expect_code(0, "second backfill of done periods");
    assert!(
        out.stdout.contains("0 done, 31 already done (skipped)"),
        "the summary should say every period was skipped as already done\n{out}"
    );
    assert_eq!(
        lineage_snapshot(&env.db, "1 = 1").await,
        rows_before,
        "no row may be rewritten (_tm_loaded_at, _tm_run_id, _tm_row_hash)"
    );
    let status_after = env.status("orders");
    assert_eq!(
        status_after, status_before,
        "the ledger must not change on a re-run of done periods"
    );
    assert!(status_after.iter().all(|e| num(e, "attempts") == 1));

    // `run` of a done day prints the stored result and exits 0.
    let stored = ledger(&env, 15);
    let out = env.tidemark(&["run", "orders", "--period", "2024-01-15"]);
    out.expect_code(0, "run of a done period");
    let result = out.json();
    assert_eq!(text(&result, "status"), "done", "{result}");
    assert_eq!(
        text(&result, "run_id"),
        text(&stored, "run_id"),
        "the stored result of the first run"
    );
    assert_eq!(
        norm_timestamp(text(&result, "period_start")),
        norm_timestamp(&day_start(15))
    );
    assert_counts(&result, [20, 20, 0, 0, 0, 0], "stored result");
    assert!(
        out.stderr.contains("already done"),
        "stderr should say the period was already done\n{out}"
    );

    // Nothing is extracted: a done period does not even look at its source.
    fs::remove_file(day_csv(&env, 15)).expect("remove the export");
    let out = env.tidemark(&["run", "orders", "--period", "2024-01-15"]);
    out.expect_code(0, "run of a done period whose export is gone");
    assert_eq!(text(&out.json(), "run_id"), text(&stored, "run_id"));
    assert_eq!(
        lineage_snapshot(&env.db, "1 = 1").await,
        rows_before,
        "still nothing rewritten"
    );
    assert_eq!(env.status("orders"), status_before, "ledger unchanged");
}

// ---------------------------------------------------------------------------
// 3. A forced re-run makes the period equal the source's current rows
// ---------------------------------------------------------------------------

async fn forced_rerun_with_delete(backend: Backend) {
    forced_rerun_applies_edits(backend, "delete").await;
}

async fn forced_rerun_with_soft_delete(backend: Backend) {
    forced_rerun_applies_edits(backend, "soft_delete").await;
}

async fn forced_rerun_with_keep(backend: Backend) {
    forced_rerun_applies_edits(backend, "keep").await;
}

/// Day 5 is loaded, then its export changes: 2 rows edited, 2 removed, 2
/// added; `run --force` must apply exactly that and touch nothing else.
async fn forced_rerun_applies_edits(backend: Backend, on_missing: &str) {
    let env = Env::orders(backend).await;
    env.set_option("orders", "load", "on_missing", &format!("\"{on_missing}\""));
    env.backfill_orders(4, 6).expect_code(0, "initial backfill");
    let db = &env.db;
    let others = format!("NOT ({})", of_day(db, 5));
    let others_before = lineage_snapshot(db, &others).await;
    let day5_before = lineage_snapshot(db, &of_day(db, 5)).await;
    let original = Csv::read(&day_csv(&env, 5));
    let original_rows = expected_orders(&original);

    let mut edited = original.clone();
    edited.set("O-20240105-002", "total", "1234.56");
    edited.set("O-20240105-007", "status", "refunded");
    edited.remove("O-20240105-010");
    edited.remove("O-20240105-011");
    let mut added = edited.rows[0].clone();
    added[0] = "O-20240105-021".into();
    edited.rows.push(added.clone());
    added[0] = "O-20240105-022".into();
    added[edited.col("total")] = "0.10".into();
    edited.rows.push(added);
    edited.write(&day_csv(&env, 5));

    let out = env.tidemark(&["run", "orders", "--period", "2024-01-05", "--force"]);
    out.expect_code(0, "forced re-run of an edited day");
    let deleted = if on_missing == "keep" { 0 } else { 2 };
    let result = out.json();
    assert_counts(
        &result,
        [20, 2, 2, 16, deleted, 0],
        "result of the forced re-run",
    );
    let entry = ledger(&env, 5);
    assert_counts(
        &entry,
        [20, 2, 2, 16, deleted, 0],
        "ledger after the forced re-run",
    );
    assert_eq!(text(&entry, "status"), "done");
    assert_eq!(
        num(&entry, "attempts"),
        2,
        "a forced re-run is a second attempt"
    );
    let new_run_id = text(&result, "run_id").to_string();

    // The day's rows.
    let vanished = ["O-20240105-010", "O-20240105-011"];
    let mut expected = expected_orders(&edited);
    match on_missing {
        "delete" => {
            assert_rows_eq(
                &table_orders(db, &of_day(db, 5)).await,
                &expected,
                "day 5 after --force (delete)",
            );
        }
        "soft_delete" => {
            let live = format!("{} AND _tm_deleted_at IS NULL", of_day(db, 5));
            assert_rows_eq(
                &table_orders(db, &live).await,
                &expected,
                "live rows of day 5 (soft_delete)",
            );
            let gone = db
                .select(
                    &["order_id"],
                    "FROM orders WHERE _tm_deleted_at IS NOT NULL ORDER BY order_id",
                )
                .await;
            let gone: Vec<_> = gone
                .into_iter()
                .map(|r| r[0].clone().unwrap_or_default())
                .collect();
            assert_eq!(
                gone, vanished,
                "exactly the vanished rows get _tm_deleted_at"
            );
            // They keep their old values.
            let soft = format!("{} AND _tm_deleted_at IS NOT NULL", of_day(db, 5));
            let old: Rows = original_rows
                .iter()
                .filter(|r| vanished.contains(&r[0].as_deref().unwrap_or("")))
                .cloned()
                .collect();
            assert_rows_eq(
                &table_orders(db, &soft).await,
                &old,
                "soft-deleted rows keep their values",
            );
        }
        _ => {
            expected.extend(
                original_rows
                    .iter()
                    .filter(|r| vanished.contains(&r[0].as_deref().unwrap_or("")))
                    .cloned(),
            );
            expected.sort();
            assert_rows_eq(
                &table_orders(db, &of_day(db, 5)).await,
                &expected,
                "day 5 after --force (keep)",
            );
        }
    }

    // Other run keys untouched.
    assert_eq!(
        lineage_snapshot(db, &others).await,
        others_before,
        "rows of days 4 and 6 must not be touched"
    );

    // Unchanged rows not rewritten; changed and new rows written by this run.
    let day5_after = lineage_snapshot(db, &of_day(db, 5)).await;
    let changed = [
        "O-20240105-002",
        "O-20240105-007",
        "O-20240105-021",
        "O-20240105-022",
    ];
    for (id, before) in &day5_before {
        if changed.contains(&id.as_str()) {
            continue;
        }
        if vanished.contains(&id.as_str()) {
            match on_missing {
                "delete" => assert!(!day5_after.contains_key(id), "{id} should be deleted"),
                _ => assert_eq!(
                    day5_after.get(id),
                    Some(before),
                    "{id}: vanished rows kept (or soft-deleted) are not rewritten"
                ),
            }
            continue;
        }
        assert_eq!(
            day5_after.get(id),
            Some(before),
            "{id} did not change and must not be rewritten"
        );
    }
    for id in changed {
        let after = day5_after
            .get(id)
            .unwrap_or_else(|| panic!("{id} missing after the re-run"));
        assert_eq!(
            after[1].as_deref(),
            Some(new_run_id.as_str()),
            "{id} was written by the forced run"
        );
    }
}

// ---------------------------------------------------------------------------
// 4. A malformed value fails its period with a clear error; fixed, it loads
// ---------------------------------------------------------------------------

async fn malformed_value_fails_only_its_period(backend: Backend) {
    let env = Env::orders(backend).await;
    let path = day_csv(&env, 3);
    let original = fs::read_to_string(&path).expect("read export");
    let mut csv = Csv::parse(&original);
    csv.set("O-20240103-005", "total", "12,x"); // row 5, line 6 of the file
    csv.write(&path);

    let out = env.backfill_orders(1, 4);
    out.expect_code(1, "backfill with a malformed value on day 3");
    for needle in ["amount", "12,x", "orders", "archive", "2024-01-03"] {
        assert!(
            out.stderr.contains(needle),
            "stderr should name {needle:?}\n{out}"
        );
    }
    assert!(
        out.stderr.contains("row 5") || out.stderr.contains("line 6"),
        "stderr should name the row (5) or line (6)\n{out}"
    );
    assert_eq!(
        count_orders(&env.db, &of_day(&env.db, 3)).await,
        0,
        "no row of the failed day may be committed"
    );
    assert_eq!(
        count_orders(&env.db, "order_id LIKE 'O-20240103-%'").await,
        0
    );
    let failed = ledger(&env, 3);
    assert_eq!(text(&failed, "status"), "failed", "{failed}");
    assert_eq!(text(&failed, "error_class"), "validation", "{failed}");
    let message = text(&failed, "error_message");
    assert!(
        message.contains("amount") && message.contains("12,x"),
        "ledger message: {message}"
    );
    for d in [1, 2, 4] {
        assert_eq!(
            text(&ledger(&env, d), "status"),
            "done",
            "day {d} is not affected"
        );
        assert_eq!(count_orders(&env.db, &of_day(&env.db, d)).await, 20);
    }

    fs::write(&path, original).expect("restore export");
    let out = env.backfill_orders(1, 4);
    out.expect_code(0, "backfill after fixing the file");
    let fixed = ledger(&env, 3);
    assert_eq!(text(&fixed, "status"), "done", "{fixed}");
    assert_eq!(num(&fixed, "attempts"), 2, "{fixed}");
    assert!(
        fixed["error_class"].is_null(),
        "a done period carries no error: {fixed}"
    );
    assert_counts(&fixed, [20, 20, 0, 0, 0, 0], "fixed day");
    let expected = expected_orders(&Csv::read(&path));
    assert_rows_eq(
        &table_orders(&env.db, &of_day(&env.db, 3)).await,
        &expected,
        "day 3 after the fix",
    );
    assert_eq!(
        num(&ledger(&env, 1), "attempts"),
        1,
        "done days are skipped, not re-run"
    );
}

// ---------------------------------------------------------------------------
// 5. Missing files: source errors, the delete guard, empty periods
// ---------------------------------------------------------------------------

async fn missing_file_is_a_source_error_without_retry(backend: Backend) {
    let env = Env::orders(backend).await; // missing = "error"
    fs::remove_file(day_csv(&env, 2)).expect("remove export");
    let out = env.tidemark(&["run", "orders", "--period", "2024-01-02"]);
    out.expect_code(1, "run with a missing export");
    assert!(
        out.stderr.contains("no file matches"),
        "stderr should say which file is missing\n{out}"
    );
    assert!(
        !out.stderr.contains("retrying"),
        "a missing file is not transient: no retry\n{out}"
    );
    let entry = ledger(&env, 2);
    assert_eq!(text(&entry, "status"), "failed", "{entry}");
    assert_eq!(text(&entry, "error_class"), "source", "{entry}");
    assert_eq!(num(&entry, "attempts"), 1, "no retry: {entry}");
}

async fn vanished_file_never_wipes_a_period_unless_forced(backend: Backend) {
    let env = Env::orders(backend).await;
    env.set_option("orders", "sources", "missing", "\"empty\""); // on_missing = "delete" already
    env.backfill_orders(1, 2).expect_code(0, "initial backfill");
    let day2_before = lineage_snapshot(&env.db, &of_day(&env.db, 2)).await;
    assert_eq!(day2_before.len(), 20);
    fs::remove_file(day_csv(&env, 2)).expect("remove export");

    let out = env.tidemark(&["run", "orders", "--period", "2024-01-02", "--force"]);
    out.expect_code(1, "forced re-run of a loaded day whose export vanished");
    let entry = ledger(&env, 2);
    assert_eq!(text(&entry, "status"), "failed", "{entry}");
    assert_eq!(text(&entry, "error_class"), "invariant", "{entry}");
    assert!(
        out.stderr.contains("--force-deletes"),
        "the error should say how to override\n{out}"
    );
    assert_eq!(
        lineage_snapshot(&env.db, &of_day(&env.db, 2)).await,
        day2_before,
        "a refused reconciliation deletes nothing"
    );

    let out = env.tidemark(&[
        "run",
        "orders",
        "--period",
        "2024-01-02",
        "--force",
        "--force-deletes",
    ]);
    out.expect_code(0, "run --force --force-deletes");
    assert_counts(
        &out.json(),
        [0, 0, 0, 0, 20, 0],
        "result of the forced wipe",
    );
    assert_eq!(
        count_orders(&env.db, &of_day(&env.db, 2)).await,
        0,
        "the operator asked: day 2 is emptied"
    );
    assert_eq!(text(&ledger(&env, 2), "status"), "done");
    assert_eq!(
        count_orders(&env.db, &of_day(&env.db, 1)).await,
        20,
        "day 1 untouched"
    );
}

async fn missing_file_of_a_new_period_is_done_empty(backend: Backend) {
    let env = Env::orders(backend).await;
    env.set_option("orders", "sources", "missing", "\"empty\"");
    fs::remove_file(day_csv(&env, 3)).expect("remove export");
    let out = env.tidemark(&["run", "orders", "--period", "2024-01-03"]);
    out.expect_code(
        0,
        "run of a never-loaded day without export (missing = empty)",
    );
    let entry = ledger(&env, 3);
    assert_eq!(text(&entry, "status"), "done", "{entry}");
    assert_counts(&entry, [0, 0, 0, 0, 0, 0], "empty period");
    assert_eq!(count_orders(&env.db, "1 = 1").await, 0);
}

// ---------------------------------------------------------------------------
// 6. Configuration errors: exit 2, named, nothing touched
// ---------------------------------------------------------------------------

async fn config_errors_exit_2_and_touch_nothing(backend: Backend) {
    type Edit = fn(String) -> String;
    let cases: [(&str, Edit, &[&str]); 3] = [
        (
            "unknown key",
            |t| t.replace("on_missing = \"delete\"", "on_mising = \"delete\""),
            &["on_mising"],
        ),
        (
            "bad type name",
            |t| t.replace("type = \"decimal\"", "type = \"money\""),
            &["money", "amount"],
        ),
        (
            "key field not in [fields]",
            |t| t.replace("key = [\"order_id\"]", "key = [\"id\"]"),
            &["load.key", "id"],
        ),
    ];
    for (case, edit, names) in cases {
        let env = Env::orders(backend).await;
        env.edit_pipeline("orders", edit);
        for args in [
            &["run", "orders", "--period", "2024-01-01"][..],
            &[
                "backfill",
                "orders",
                "--from",
                "2024-01-01",
                "--to",
                "2024-01-03",
            ][..],
            &["status", "orders", "--json"][..],
        ] {
            let out = env.tidemark(args);
            out.expect_code(2, &format!("{case}: tidemark {}", args.join(" ")));
            assert!(
                out.stderr.contains("orders.toml"),
                "{case}: stderr should name the pipeline file\n{out}"
            );
            for name in names {
                assert!(
                    out.stderr.contains(name),
                    "{case}: stderr should name {name:?}\n{out}"
                );
            }
            assert!(out.stdout.is_empty(), "{case}: nothing on stdout\n{out}");
        }
        assert!(
            env.db.untouched().await,
            "{case}: no database may be created or written"
        );
    }
}

// ---------------------------------------------------------------------------
// 7. Duplicate natural keys within one period
// ---------------------------------------------------------------------------

/// Day 5 with O-20240105-003 twice: first with its original total, last
/// with 1.23. Returns the env and the original total.
async fn day_with_duplicate_key(backend: Backend, policy: &str) -> (Env, String) {
    let env = Env::orders(backend).await;
    env.set_option(
        "orders",
        "load",
        "on_duplicate_key",
        &format!("\"{policy}\""),
    );
    let mut csv = Csv::read(&day_csv(&env, 5));
    let total = csv.col("total");
    let mut again = csv.row_mut("O-20240105-003").clone();
    let original = again[total].clone();
    assert_ne!(norm_decimal(&original), "1.23");
    again[total] = "1.23".into();
    csv.rows.push(again);
    csv.write(&day_csv(&env, 5));
    (env, original)
}

async fn amount_of(db: &TestDb, order_id: &str) -> Option<String> {
    let rows = db
        .select(
            &["amount"],
            &format!("FROM orders WHERE order_id = '{order_id}'"),
        )
        .await;
    assert_eq!(rows.len(), 1, "exactly one row for {order_id}");
    rows[0][0].as_deref().map(norm_decimal)
}

async fn duplicate_keys_last_wins(backend: Backend) {
    let (env, _) = day_with_duplicate_key(backend, "last").await;
    let out = env.tidemark(&["run", "orders", "--period", "2024-01-05"]);
    out.expect_code(0, "on_duplicate_key = last");
    assert_eq!(
        amount_of(&env.db, "O-20240105-003").await.as_deref(),
        Some("1.23"),
        "the last occurrence wins"
    );
    assert_eq!(count_orders(&env.db, "1 = 1").await, 20);
    assert_eq!(num(&ledger(&env, 5), "rows_read"), 21);
}

async fn duplicate_keys_first_wins(backend: Backend) {
    let (env, original) = day_with_duplicate_key(backend, "first").await;
    let out = env.tidemark(&["run", "orders", "--period", "2024-01-05"]);
    out.expect_code(0, "on_duplicate_key = first");
    assert_eq!(
        amount_of(&env.db, "O-20240105-003").await,
        Some(norm_decimal(&original)),
        "the first occurrence wins"
    );
    assert_eq!(count_orders(&env.db, "1 = 1").await, 20);
}

async fn duplicate_keys_error_fails_the_period(backend: Backend) {
    let (env, _) = day_with_duplicate_key(backend, "error").await;
    let out = env.tidemark(&["run", "orders", "--period", "2024-01-05"]);
    out.expect_code(1, "on_duplicate_key = error");
    assert!(
        out.stderr.contains("O-20240105-003"),
        "the error names the key value\n{out}"
    );
    let entry = ledger(&env, 5);
    assert_eq!(text(&entry, "status"), "failed", "{entry}");
    assert_eq!(text(&entry, "error_class"), "invariant", "{entry}");
    assert!(
        text(&entry, "error_message").contains("O-20240105-003"),
        "{entry}"
    );
    assert_eq!(
        count_orders(&env.db, &of_day(&env.db, 5)).await,
        0,
        "nothing of the failed period is committed"
    );
}

// ---------------------------------------------------------------------------
// 8. Two starts of one run key; kill -9 and recovery
// ---------------------------------------------------------------------------

async fn second_run_of_a_held_key_exits_75_or_waits(backend: Backend) {
    let env = Env::orders(backend).await;
    env.tidemark(&["migrate"]).expect_code(0, "migrate");
    let path = day_csv(&env, 7);
    let export = fs::read_to_string(&path).expect("read export");
    let fifo = FifoWriter::create(&path);

    // Run 1 claims the key and blocks reading the FIFO.
    let run1 = env.spawn(&["run", "orders", "--period", "2024-01-07"]);
    let entry = env.wait_for_status("orders", "2024-01-07", Duration::from_secs(30), |e| {
        e["status"] == "running"
    });
    assert_eq!(num(&entry, "attempts"), 1);

    // Run 2 finds the lease live and exits 75 at once.
    let out = env.tidemark(&["run", "orders", "--period", "2024-01-07"]);
    out.expect_code(75, "second run of a held key");
    assert!(
        out.elapsed < Duration::from_secs(10),
        "exit 75 should be quick\n{out}"
    );
    assert!(
        out.stderr.contains("held"),
        "stderr should say the key is held\n{out}"
    );
    let entry = ledger(&env, 7);
    assert_eq!(text(&entry, "status"), "running");
    assert_eq!(
        num(&entry, "attempts"),
        1,
        "a refused start is not an attempt"
    );

    // Run 3 waits for run 1.
    let mut run3 = env.spawn(&["run", "orders", "--period", "2024-01-07", "--wait"]);
    thread::sleep(Duration::from_millis(1500));
    assert!(!run3.exited(), "run --wait must wait while the key is held");

    fifo.write(&export);
    fifo.close(Duration::from_secs(30));
    let out1 = run1.finish(Duration::from_secs(60));
    out1.expect_code(0, "run 1 after its input arrived");
    let out3 = run3.finish(Duration::from_secs(60));
    out3.expect_code(0, "run --wait after run 1 finished");
    let (r1, r3) = (out1.json(), out3.json());
    assert_eq!(text(&r3, "status"), "done");
    assert_eq!(
        text(&r3, "run_id"),
        text(&r1, "run_id"),
        "the waiting run reports run 1's result"
    );
    assert_counts(
        &r3,
        [20, 20, 0, 0, 0, 0],
        "result reported by the waiting run",
    );

    let entry = ledger(&env, 7);
    assert_eq!(num(&entry, "attempts"), 1, "exactly one run did the work");
    let expected = expected_orders(&Csv::parse(&export));
    assert_rows_eq(
        &table_orders(&env.db, "1 = 1").await,
        &expected,
        "day 7 loaded once",
    );
}

async fn kill_9_then_rerun_resumes_and_takes_over(backend: Backend) {
    let env = Env::orders(backend).await;
    env.set_option("orders", "load", "batch_size", "5");
    env.tidemark(&["migrate"]).expect_code(0, "migrate");
    let path = day_csv(&env, 8);
    let export = fs::read_to_string(&path).expect("read export");
    let csv = Csv::parse(&export);
    let fifo = FifoWriter::create(&path);

    let run1 = env.spawn(&["run", "orders", "--period", "2024-01-08"]);
    let first12 = Csv {
        header: csv.header.clone(),
        rows: csv.rows[..12].to_vec(),
    };
    fifo.write(&first12.to_text());

    // Two batches of 5 committed; the third waits for more input.
    let runs = format!(
        "FROM _tm_runs WHERE {}",
        env.db.instant_is("period_start", &day_start(8))
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let rows = if env.db.table_exists("_tm_runs").await {
            env.db.select(&["batches"], &runs).await
        } else {
            Vec::new()
        };
        if rows.first().and_then(|r| r[0].as_deref()) == Some("2") {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "two batches were not committed in time: {rows:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let committed = lineage_snapshot(&env.db, "1 = 1").await;
    assert_eq!(
        committed.len(),
        10,
        "two batches of 5 rows are committed before the kill"
    );

    run1.kill9();
    drop(fifo);
    fs::remove_file(&path).expect("remove FIFO");
    fs::write(&path, &export).expect("write the whole export");

    let out = env.tidemark(&["run", "orders", "--period", "2024-01-08"]);
    out.expect_code(0, "re-run after kill -9");
    assert!(
        out.elapsed < Duration::from_secs(15),
        "the dead holder (same host, process gone) is taken over without waiting for its 30 s lease\n{out}"
    );
    assert_rows_eq(
        &table_orders(&env.db, "1 = 1").await,
        &expected_orders(&csv),
        "day 8 after recovery",
    );
    assert_eq!(count_orders(&env.db, "1 = 1").await, 20, "no duplicates");

    let after = lineage_snapshot(&env.db, "1 = 1").await;
    for (id, before) in &committed {
        assert_eq!(
            after.get(id),
            Some(before),
            "{id} was committed before the crash and must not be written again"
        );
    }
    let run_ids: BTreeSet<_> = after.values().map(|v| v[1].clone()).collect();
    assert_eq!(
        run_ids.len(),
        1,
        "a resumed attempt keeps the run id: {run_ids:?}"
    );

    let entry = ledger(&env, 8);
    assert_eq!(text(&entry, "status"), "done", "{entry}");
    assert_eq!(num(&entry, "attempts"), 2, "{entry}");
    let read = num(&entry, "rows_read");
    assert!(
        (20..=25).contains(&read),
        "at most one batch is read again (rows_read = {read})"
    );
    assert_eq!(num(&entry, "rows_inserted"), 20, "{entry}");

    let attempts = env
        .db
        .select(&["attempt", "status"], "FROM _tm_attempts ORDER BY attempt")
        .await;
    let attempts: Vec<(String, String)> = attempts
        .into_iter()
        .map(|r| {
            (
                r[0].clone().unwrap_or_default(),
                r[1].clone().unwrap_or_default(),
            )
        })
        .collect();
    assert_eq!(
        attempts,
        [
            ("1".to_string(), "lost".to_string()),
            ("2".to_string(), "done".to_string())
        ],
        "attempt history"
    );
}

// ---------------------------------------------------------------------------
// 9. Rejects
// ---------------------------------------------------------------------------

/// Day 9 with bad totals in the given rows; `max_rejects = 2`.
fn day_with_bad_rows(env: &Env, bad: &[(&str, &str)]) {
    env.set_option("orders", "load", "max_rejects", "2");
    let mut csv = Csv::read(&day_csv(env, 9));
    for (id, value) in bad {
        csv.set(id, "total", value);
    }
    csv.write(&day_csv(env, 9));
}

async fn rejects_within_max_rejects_are_kept(backend: Backend) {
    let env = Env::orders(backend).await;
    day_with_bad_rows(
        &env,
        &[("O-20240109-003", "abc"), ("O-20240109-008", "1.2.3")],
    );
    let out = env.tidemark(&["run", "orders", "--period", "2024-01-09"]);
    out.expect_code(0, "two bad rows with max_rejects = 2");
    let entry = ledger(&env, 9);
    assert_eq!(text(&entry, "status"), "done", "{entry}");
    assert_counts(&entry, [20, 18, 0, 0, 0, 2], "period with two rejects");
    assert_eq!(count_orders(&env.db, "1 = 1").await, 18);
    assert_eq!(
        count_orders(&env.db, "order_id IN ('O-20240109-003', 'O-20240109-008')").await,
        0
    );

    let rejects = env
        .db
        .select(
            &["field", "value", "reason", "location"],
            "FROM _tm_rejects ORDER BY value",
        )
        .await;
    assert_eq!(rejects.len(), 2, "two rejects kept: {rejects:?}");
    let values: Vec<_> = rejects
        .iter()
        .map(|r| r[1].clone().unwrap_or_default())
        .collect();
    assert_eq!(values, ["1.2.3", "abc"], "rejects keep the raw value");
    for r in &rejects {
        assert_eq!(
            r[0].as_deref(),
            Some("amount"),
            "reject names the field: {r:?}"
        );
        assert!(
            r[2].as_deref().is_some_and(|s| !s.is_empty()),
            "reject has a reason: {r:?}"
        );
        assert!(
            r[3].as_deref().is_some_and(|s| s.contains("orders.csv")),
            "reject has a location: {r:?}"
        );
    }
}

async fn rejects_over_max_rejects_fail_the_period(backend: Backend) {
    let env = Env::orders(backend).await;
    day_with_bad_rows(
        &env,
        &[
            ("O-20240109-003", "abc"),
            ("O-20240109-008", "1.2.3"),
            ("O-20240109-015", "x"),
        ],
    );
    let out = env.tidemark(&["run", "orders", "--period", "2024-01-09"]);
    out.expect_code(1, "three bad rows with max_rejects = 2");
    assert!(
        out.stderr.contains("amount"),
        "the error names the field\n{out}"
    );
    let entry = ledger(&env, 9);
    assert_eq!(text(&entry, "status"), "failed", "{entry}");
    assert_eq!(
        count_orders(&env.db, "1 = 1").await,
        0,
        "nothing of the failing batch is committed"
    );
    assert_eq!(env.db.count("FROM _tm_rejects").await, 0, "nor its rejects");
}

/// PostgreSQL cannot store U+0000 in text: such a value is a reject on
/// both databases (one pipeline, one behaviour), named by row, field and
/// value; the reject itself is kept (on PostgreSQL with the NUL written as
/// the visible `\u0000`), and the other rows load.
async fn nul_character_in_text_is_a_reject(backend: Backend) {
    let env = Env::orders(backend).await;
    env.set_option("orders", "load", "max_rejects", "1");
    let mut csv = Csv::read(&day_csv(&env, 9));
    csv.set("O-20240109-004", "note", "before\0after");
    csv.write(&day_csv(&env, 9));

    let out = env.tidemark(&["run", "orders", "--period", "2024-01-09"]);
    out.expect_code(0, "one NUL row with max_rejects = 1");
    assert_counts(&ledger(&env, 9), [20, 19, 0, 0, 0, 1], "one reject");
    assert_eq!(
        count_orders(&env.db, "order_id = 'O-20240109-004'").await,
        0
    );
    let rejects = env
        .db
        .select(&["field", "value", "location"], "FROM _tm_rejects")
        .await;
    assert_eq!(rejects.len(), 1, "{rejects:?}");
    assert_eq!(rejects[0][0].as_deref(), Some("note"));
    let value = rejects[0][1].clone().unwrap_or_default();
    assert_eq!(value.replace("\\u0000", "\0"), "before\0after", "{value:?}");
    assert!(rejects[0][2]
        .as_deref()
        .is_some_and(|l| l.contains("line 5")));

    env.set_option("orders", "load", "max_rejects", "0");
    let out = env.tidemark(&["run", "orders", "--period", "2024-01-09", "--force"]);
    out.expect_code(1, "the same row with max_rejects = 0");
    for named in [
        "pipeline orders",
        "period 2024-01-09",
        "orders.csv",
        "line 5",
        "`note`",
        "NUL",
        "before\\0after",
    ] {
        assert!(out.stderr.contains(named), "stderr names {named}\n{out}");
    }
    assert_eq!(count_orders(&env.db, "1 = 1").await, 19, "nothing lost");
}

/// A `ticks` pipeline (time-keyed prices, `on_missing = "delete"`) whose
/// one file holds `rows` under the header `at,local,price`.
async fn ticks(backend: Backend, rows: &str) -> Env {
    let env = Env::new(backend).await;
    env.write(
        "pipelines/ticks.toml",
        r#"name = "ticks"
export_type = "ticks_daily"
[period]
granularity = "day"
[[sources]]
id = "feed"
transport = "file"
format = "csv"
path = "data/ticks.csv"
[fields]
at = { type = "timestamptz", required = true }
local = { type = "timestamp" }
price = { type = "decimal" }
[load]
table = "ticks"
key = ["at"]
on_missing = "delete"
"#,
    );
    env.write(
        "pipelines/data/ticks.csv",
        &format!("at,local,price\n{rows}"),
    );
    env
}

/// A natural key with digits below the microsecond: PostgreSQL stores
/// microseconds, so the stored key once hashed differently from its source
/// key, and a forced re-run of unchanged data deleted the row as vanished.
/// Times are now cut to microseconds when read, on both databases.
async fn sub_microsecond_time_key_survives_a_forced_rerun(backend: Backend) {
    let env = ticks(
        backend,
        "2024-01-01T00:00:00.123456789Z,2024-01-01T01:00:00.987654321,1.5\n\
         2024-01-01T00:00:01.5Z,,2.5\n",
    )
    .await;
    let first = env.tidemark(&["run", "ticks", "--period", "2024-01-01"]);
    first.expect_code(0, "first run");
    assert_counts(&first.json(), [2, 2, 0, 0, 0, 0], "first run");
    let rerun = env.tidemark(&["run", "ticks", "--period", "2024-01-01", "--force"]);
    rerun.expect_code(0, "forced re-run");
    assert_counts(
        &rerun.json(),
        [2, 0, 0, 2, 0, 0],
        "nothing changed, nothing vanished",
    );
    assert_eq!(env.db.count("FROM ticks").await, 2, "no row lost");
    let at = env.db.instant_is("at", "2024-01-01T00:00:00.123456Z");
    assert_eq!(
        env.db.count(&format!("FROM ticks WHERE {at}")).await,
        1,
        "the key is stored to the microsecond"
    );
}

/// A year PostgreSQL cannot store (and SQLite would store as text that
/// sorts out of order) is bad input on both databases: the error names
/// pipeline, period, file, line, field and value, and nothing of the batch
/// is written.
async fn year_outside_1_to_9999_is_bad_input(backend: Backend) {
    let env = ticks(
        backend,
        "2024-01-01T00:00:00Z,,1.5\n\
         2024-01-01T00:00:01Z,-5000-01-01T00:00:00,2.5\n",
    )
    .await;
    let out = env.tidemark(&["run", "ticks", "--period", "2024-01-01"]);
    out.expect_code(1, "a year before 0001");
    for named in [
        "pipeline ticks",
        "period 2024-01-01",
        "ticks.csv",
        "line 3",
        "`local`",
        "-5000-01-01T00:00:00",
    ] {
        assert!(out.stderr.contains(named), "stderr names {named}\n{out}");
    }
    assert!(
        !out.stderr.contains("out of range"),
        "not the database's error\n{out}"
    );
    assert_eq!(env.db.count("FROM ticks").await, 0, "nothing half-written");
}

/// With `batch_size = 5`, the third bad row is in batch 3: batches 1 and 2
/// stay committed, batch 3 does not; fixed, the next run completes the period.
async fn rejects_over_max_keep_earlier_batches_then_recover(backend: Backend) {
    let env = Env::orders(backend).await;
    env.set_option("orders", "load", "batch_size", "5");
    day_with_bad_rows(
        &env,
        &[
            ("O-20240109-003", "abc"),
            ("O-20240109-008", "1.2.3"),
            ("O-20240109-013", "x"),
        ],
    );
    let out = env.tidemark(&["run", "orders", "--period", "2024-01-09"]);
    out.expect_code(1, "third bad row in batch 3");
    assert_eq!(text(&ledger(&env, 9), "status"), "failed");
    let loaded: Vec<_> = env
        .db
        .select(&["order_id"], "FROM orders ORDER BY order_id")
        .await
        .into_iter()
        .map(|r| r[0].clone().unwrap_or_default())
        .collect();
    let expected: Vec<_> = (1..=10)
        .filter(|n| ![3, 8].contains(n))
        .map(|n| format!("O-20240109-{n:03}"))
        .collect();
    assert_eq!(
        loaded, expected,
        "batches 1-2 stay committed, batch 3 and later are not"
    );

    let path = day_csv(&env, 9);
    let mut csv = Csv::read(&path);
    let original =
        Csv::read(&crate::support::repo_root().join("pipelines/data/orders/2024/01/09/orders.csv"));
    let good_total = original.rows[12][original.col("total")].clone();
    csv.set("O-20240109-013", "total", &good_total);
    csv.write(&path);
    let out = env.tidemark(&["run", "orders", "--period", "2024-01-09"]);
    out.expect_code(0, "re-run after fixing the third bad row");
    let entry = ledger(&env, 9);
    assert_eq!(text(&entry, "status"), "done", "{entry}");
    assert_eq!(num(&entry, "rows_rejected"), 2, "{entry}");
    let mut expected = expected_orders(&csv);
    expected.retain(|r| !matches!(r[0].as_deref(), Some("O-20240109-003" | "O-20240109-008")));
    assert_rows_eq(
        &table_orders(&env.db, "1 = 1").await,
        &expected,
        "day 9 after the fix",
    );
}

// ---------------------------------------------------------------------------
// 10. validate and --help
// ---------------------------------------------------------------------------

async fn validate_checks_files_and_touches_no_database(backend: Backend) {
    let env = Env::orders(backend).await;
    env.copy_example("events");
    let out = env.tidemark(&["validate", "orders", "events"]);
    out.expect_code(0, "validate the examples");
    assert_eq!(
        out.stdout.matches("ok:").count(),
        2,
        "one ok line per pipeline\n{out}"
    );

    let bad = fs::read_to_string(env.pipeline_file("orders"))
        .expect("read")
        .replace("type = \"decimal\"", "type = \"money\"");
    env.write("pipelines/bad.toml", &bad);
    let out = env.tidemark(&["validate", "bad"]);
    out.expect_code(2, "validate a bad file");
    assert!(
        out.stderr.contains("bad.toml") && out.stderr.contains("money"),
        "names file and value\n{out}"
    );
    let out = env.tidemark(&["validate", "orders", "bad"]);
    out.expect_code(2, "validate a good and a bad file");
    let out = env.tidemark(&["validate", "pipelines/orders.toml"]);
    out.expect_code(0, "validate by path");
    // Without --database-url: the default sqlite://tidemark.db must not appear.
    env.tidemark_bare(&["validate", "orders"])
        .expect_code(0, "validate with the default database URL");
    // --check-source reads the first batch and shows the mapping, writing nothing.
    let out = env.tidemark(&[
        "validate",
        "orders",
        "--check-source",
        "--period",
        "2024-01-03",
    ]);
    out.expect_code(0, "validate --check-source");
    assert!(out.stdout.contains("20 record(s)"), "record count\n{out}");
    assert!(
        out.stdout.contains("order_id = O-20240103-001"),
        "first record mapped\n{out}"
    );
    assert!(
        out.stdout.contains("region = archive"),
        "templated value\n{out}"
    );
    let out = env.tidemark(&[
        "validate",
        "orders",
        "--check-source",
        "--period",
        "2023-01-03",
    ]);
    out.expect_code(1, "--check-source on a period without files");
    assert!(out.stderr.contains("no file matches"), "{out}");

    assert!(
        env.db.untouched().await,
        "validate must not create or write any database"
    );
    assert!(
        !env.path("tidemark.db").exists(),
        "nor the default database"
    );
}

/// Every command of the contract has `--help` (exit 0, usage on stdout).
#[test]
fn help_works_for_every_subcommand() {
    let dir = tempfile::tempdir().expect("temp dir");
    let help = |args: &[&str]| {
        std::process::Command::new(BIN)
            .current_dir(dir.path())
            .args(args)
            .env_remove("TIDEMARK_DATABASE_URL")
            .output()
            .expect("run tidemark")
    };
    let top = help(&["--help"]);
    assert_eq!(top.status.code(), Some(0), "tidemark --help");
    let mut failing = Vec::new();
    for command in [
        "run", "backfill", "sync", "serve", "status", "validate", "prune", "migrate",
    ] {
        let out = help(&[command, "--help"]);
        let stdout = String::from_utf8_lossy(&out.stdout);
        if out.status.code() != Some(0) || !stdout.contains("Usage") {
            failing.push(format!(
                "`tidemark {command} --help`: exit {:?}, stderr: {}",
                out.status.code(),
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
    }
    assert!(
        failing.is_empty(),
        "--help failed for:\n{}",
        failing.join("\n")
    );
    assert!(
        !dir.path().join("tidemark.db").exists(),
        "--help opens no database"
    );
}

// ---------------------------------------------------------------------------
// More of the contract: concurrency, period names, usage and contract errors,
// simultaneous first starts, log context
// ---------------------------------------------------------------------------

/// `--concurrency 4` runs periods at once (sharing one SQLite file or
/// PostgreSQL database) and must load exactly what a serial backfill loads.
async fn backfill_with_concurrency_loads_the_same(backend: Backend) {
    let env = Env::orders(backend).await;
    let out = env.tidemark(&[
        "backfill",
        "orders",
        "--from",
        "2024-01-01",
        "--to",
        "2024-01-31",
        "--concurrency",
        "4",
    ]);
    out.expect_code(0, "backfill --concurrency 4");
    assert_rows_eq(
        &table_orders(&env.db, "1 = 1").await,
        &expected_january(&env),
        "concurrent backfill",
    );
    let status = env.status("orders");
    assert_eq!(status.len(), 31);
    for entry in &status {
        assert_eq!(text(entry, "status"), "done", "{entry}");
        assert_eq!(num(entry, "attempts"), 1, "{entry}");
        assert_counts(entry, [20, 20, 0, 0, 0, 0], "concurrent backfill");
    }
}

/// A period is named by any date or time inside it, as wall-clock time in
/// the pipeline's timezone (Europe/Berlin), and normalised to its start.
async fn period_is_named_by_any_time_inside_it(backend: Backend) {
    let env = Env::orders(backend).await;
    // 23:30 Berlin on the 5th is 22:30 UTC: still the 5th's period.
    let out = env.tidemark(&["run", "orders", "--period", "2024-01-05T23:30"]);
    out.expect_code(0, "run named by a time inside the period");
    let result = out.json();
    assert_eq!(
        norm_timestamp(text(&result, "period_start")),
        norm_timestamp(&day_start(5)),
        "{result}"
    );
    assert_eq!(
        norm_timestamp(text(&result, "period_end")),
        norm_timestamp(&day_start(6)),
        "{result}"
    );
    assert_eq!(count_orders(&env.db, &of_day(&env.db, 5)).await, 20);
    assert_eq!(
        count_orders(&env.db, "order_id LIKE 'O-20240105-%'").await,
        20
    );

    let out = env.tidemark(&["status", "orders", "--period", "2024-01-05T00:00", "--json"]);
    out.expect_code(0, "status of the period named by its first minute");
    assert_eq!(
        out.json_lines().len(),
        1,
        "one run key for that period\n{out}"
    );
    // The same period named by its date is the same run key: already done.
    let out = env.tidemark(&["run", "orders", "--period", "2024-01-05"]);
    out.expect_code(0, "same period by date");
    assert_eq!(
        text(&out.json(), "run_id"),
        text(&result, "run_id"),
        "same run key, stored result"
    );
    assert_eq!(env.status("orders").len(), 1, "still a single run key");
}

/// Usage errors (bad or missing arguments, unknown pipeline or source)
/// exit 2 before any database is opened.
async fn usage_errors_exit_2_and_touch_nothing(backend: Backend) {
    let env = Env::orders(backend).await;
    let cases: [(&[&str], &str); 5] = [
        (&["run", "orders"], "--period"),
        (
            &["run", "orders", "--period", "the day after tomorrow"],
            "--period",
        ),
        (&["run", "nosuch", "--period", "2024-01-01"], "nosuch"),
        (
            &[
                "run",
                "orders",
                "--period",
                "2024-01-01",
                "--source",
                "nope",
            ],
            "nope",
        ),
        (
            &[
                "backfill",
                "orders",
                "--from",
                "2024-01-05",
                "--to",
                "2024-01-01",
            ],
            "--to",
        ),
    ];
    for (args, named) in cases {
        let out = env.tidemark(args);
        out.expect_code(2, &format!("tidemark {}", args.join(" ")));
        assert!(
            out.stderr.contains(named),
            "stderr should name {named:?}\n{out}"
        );
    }
    assert!(env.db.untouched().await, "usage errors touch no database");
}

/// An existing destination table whose columns contradict `[fields]` is a
/// contract error naming the column; nothing is written.
async fn existing_table_contradicting_fields_is_a_contract_error(backend: Backend) {
    let env = Env::orders(backend).await;
    env.backfill_orders(1, 1)
        .expect_code(0, "first load creates the table");
    let before = lineage_snapshot(&env.db, "1 = 1").await;
    env.edit_pipeline("orders", |t| {
        t.replace(
            "customer   = { type = \"text\"",
            "customer   = { type = \"int\"",
        )
    });
    let out = env.tidemark(&["run", "orders", "--period", "2024-01-02"]);
    out.expect_code(1, "run against a contradicting table");
    assert!(
        out.stderr.contains("customer") && out.stderr.contains("orders"),
        "names table and column\n{out}"
    );
    let entry = ledger(&env, 2);
    assert_eq!(text(&entry, "status"), "failed", "{entry}");
    assert_eq!(text(&entry, "error_class"), "contract", "{entry}");
    assert!(
        !out.stderr.contains("retrying"),
        "a contract error is not retried\n{out}"
    );
    assert_eq!(
        lineage_snapshot(&env.db, "1 = 1").await,
        before,
        "nothing written"
    );
}

/// Promise 4 from the very first start: several runs of one key started at
/// once on a database nobody has used yet. Exactly one does the work; the
/// others exit 75 (held) or 0 (already done) -- none fails. The start race
/// is timing-dependent, so it is tried in several fresh databases.
async fn simultaneous_starts_on_a_fresh_database(backend: Backend) {
    for round in 1..=3 {
        let env = Env::orders(backend).await;
        let runs: Vec<_> = (0..4)
            .map(|_| env.spawn(&["run", "orders", "--period", "2024-01-10"]))
            .collect();
        let outs: Vec<_> = runs
            .into_iter()
            .map(|r| r.finish(Duration::from_secs(60)))
            .collect();
        for out in &outs {
            assert!(
                matches!(out.code, Some(0 | 75)),
                "round {round}: a simultaneous start must exit 0 or 75, not fail\n{out}"
            );
        }
        let entry = ledger(&env, 10);
        assert_eq!(text(&entry, "status"), "done", "round {round}: {entry}");
        assert_eq!(
            num(&entry, "attempts"),
            1,
            "round {round}: exactly one run did the work: {entry}"
        );
        for out in outs.iter().filter(|o| o.code == Some(0)) {
            assert_eq!(
                text(&out.json(), "run_id"),
                text(&entry, "run_id"),
                "round {round}: every exit 0 reports the one run"
            );
        }
        assert_eq!(count_orders(&env.db, "1 = 1").await, 20, "round {round}");
    }
}

/// Promise 8: every log line inside a run carries pipeline, source,
/// export_type, period, run id and attempt (checked in `--log-format json`).
async fn log_lines_inside_a_run_carry_its_context(backend: Backend) {
    let env = Env::orders(backend).await;
    let mut csv = Csv::read(&day_csv(&env, 2));
    csv.set("O-20240102-004", "total", "oops");
    csv.write(&day_csv(&env, 2));
    for (d, code) in [(1, 0), (2, 1)] {
        let out = env.tidemark(&["--log-format", "json", "run", "orders", "--period", &day(d)]);
        out.expect_code(code, "run with JSON logs");
        let entry = ledger(&env, d);
        let lines: Vec<Json> = out
            .stderr
            .lines()
            .filter(|l| l.starts_with('{'))
            .map(|l| {
                serde_json::from_str(l).unwrap_or_else(|e| panic!("bad JSON log line ({e}): {l}"))
            })
            .collect();
        let message = |l: &Json| l["fields"]["message"].as_str().unwrap_or("").to_string();
        let start = lines.iter().position(|l| message(l) == "run started");
        let end = lines
            .iter()
            .rposition(|l| ["run done", "run failed"].contains(&message(l).as_str()));
        let (Some(start), Some(end)) = (start, end) else {
            panic!("day {d}: no `run started` / `run done|failed` log lines\n{out}");
        };
        assert!(end > start, "day {d}: log lines out of order\n{out}");
        for line in &lines[start..=end] {
            let span = &line["span"];
            for field in [
                "pipeline",
                "source",
                "export_type",
                "period",
                "run_id",
                "attempt",
            ] {
                assert!(
                    !span[field].is_null(),
                    "day {d}: log line without `{field}`: {line}"
                );
            }
            assert_eq!(span["pipeline"], "orders", "{line}");
            assert_eq!(span["source"], "archive", "{line}");
            assert_eq!(span["export_type"], "orders_daily", "{line}");
            assert_eq!(span["period"], day(d).as_str(), "{line}");
            assert_eq!(span["run_id"].as_str(), entry["run_id"].as_str(), "{line}");
            assert_eq!(span["attempt"].as_i64(), Some(1), "{line}");
        }
    }
}
