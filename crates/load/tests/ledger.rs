//! Ledger behaviour written once and run against SQLite and PostgreSQL:
//! concurrent claims, fencing of superseded attempts, contract checks.

mod support;

use std::path::Path;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use sqlx::Connection;
use support::{both_backends, TestDb};
use tidemark_core::{Error, Pipeline, Row, RunKey};
use tidemark_load::{
    Claim, ClaimRequest, ClaimedRun, RunWriter, Store, TableSchema, WorkerId, WriterOptions,
};

/// Writer options of these tests: the in-memory path, every key tracked.
const OPTIONS: WriterOptions = WriterOptions {
    memory_budget: 64 << 20,
    track_new_keys: true,
};

/// Whether the writer saw `key` in an earlier committed batch.
fn seen(writer: &mut RunWriter, key: tidemark_core::Hash128) -> bool {
    writer.seen_before(&[key]).expect("lookup")[0]
}

/// Everything but `[fields]` and `[load]`, shared by the test pipelines.
macro_rules! pipeline_header {
    () => {
        r#"
name = "p"
export_type = "e"
[period]
granularity = "day"
[[sources]]
id = "s"
transport = "file"
format = "csv"
path = "x.csv"
"#
    };
}

const PIPELINE: &str = concat!(
    pipeline_header!(),
    r#"[fields]
id = { type = "int", required = true }
name = { type = "text" }
[load]
table = "items"
key = ["id"]
"#
);

fn pipeline() -> Pipeline {
    Pipeline::parse(PIPELINE, Path::new("p.toml")).unwrap()
}

fn key(pipeline: &Pipeline, day: &str) -> RunKey {
    RunKey::new("p", "s", "e", pipeline.period(day).unwrap())
}

fn request(instance: &str) -> ClaimRequest {
    ClaimRequest {
        force: false,
        handler_version: "1".into(),
        fields_fingerprint: pipeline().fields_fingerprint().as_str().to_string(),
        provisional: false,
        // A host name no real process has, so the dead-holder shortcut never applies.
        worker: WorkerId {
            host: format!("test-host-{instance}"),
            pid: 1,
            instance: instance.into(),
        },
        lease_ttl: Duration::from_secs(30),
        notices: Default::default(),
    }
}

fn row(id: i64, name: &str) -> Row {
    use tidemark_core::{FieldType, Value};
    let values = vec![Value::Int(id), Value::Text(name.into())];
    let shape = tidemark_core::RowShape::new([("id", FieldType::Int), ("name", FieldType::Text)]);
    Row::new(&shape, &[0], values)
}

fn claimed(claim: Claim) -> ClaimedRun {
    match claim {
        Claim::Claimed(run) => *run,
        other => panic!("expected a claim, got {other:?}"),
    }
}

async fn concurrent_claims_have_exactly_one_winner(postgres: bool) {
    let db = TestDb::new(postgres).await;
    let store = Store::connect(&db.url).await.unwrap();
    let p = pipeline();
    for trial in 0..20 {
        let key = Arc::new(key(&p, &format!("2024-01-{:02}", trial + 1)));
        let (a, b) = tokio::join!(
            {
                let s = store.clone();
                let k = Arc::clone(&key);
                tokio::spawn(async move { s.claim(&k, &request("a")).await })
            },
            {
                let s = store.clone();
                let k = Arc::clone(&key);
                tokio::spawn(async move { s.claim(&k, &request("b")).await })
            },
        );
        let outcomes = [a.unwrap().unwrap(), b.unwrap().unwrap()];
        let winners = outcomes
            .iter()
            .filter(|c| matches!(c, Claim::Claimed(_)))
            .count();
        let held = outcomes
            .iter()
            .filter(|c| matches!(c, Claim::Held { .. }))
            .count();
        assert_eq!((winners, held), (1, 1), "trial {trial}: {outcomes:?}");
    }
}

async fn superseded_attempt_cannot_commit(postgres: bool) {
    let p = pipeline();
    let (db, store, schema) = with_table(postgres, &p).await;
    let key = key(&p, "2024-01-01");
    let first = claimed(store.claim(&key, &request("a")).await.unwrap());
    let mut writer = store
        .writer(schema.clone(), &first, &key, OPTIONS)
        .await
        .unwrap();
    writer
        .write_batch(&[row(1, "one")], &[], 1, &serde_json::json!({"n": 1}))
        .await
        .unwrap();

    // The lease expires (a stalled worker), and another worker takes over.
    expire_lease(&db.url).await;
    let second = claimed(store.claim(&key, &request("b")).await.unwrap());
    assert_eq!(second.lease.attempt, first.lease.attempt + 1);
    assert_eq!(
        second.lease.run_id, first.lease.run_id,
        "a crashed run resumes under the same run id"
    );
    assert_eq!(second.resume, Some(serde_json::json!({"n": 1})));
    let mut resumed = store
        .writer(schema.clone(), &second, &key, OPTIONS)
        .await
        .unwrap();
    assert!(
        seen(&mut resumed, row(1, "one").key_hash),
        "committed keys survive the takeover"
    );
    assert!(!seen(&mut resumed, row(2, "two").key_hash));

    // The stalled worker wakes up: its next batch must be rolled back.
    let err = writer
        .write_batch(&[row(2, "two")], &[], 1, &serde_json::json!({"n": 2}))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::LeaseLost(_)), "{err:?}");
    assert!(writer.finish(&reconcile()).await.is_err());
    assert!(!store
        .heartbeat(&first.lease, Duration::from_secs(30))
        .await
        .unwrap());
    assert_eq!(count_rows(&db.url).await, 1, "the fenced batch left no row");

    // The new holder finishes normally.
    let mut writer = store.writer(schema, &second, &key, OPTIONS).await.unwrap();
    writer
        .write_batch(&[row(2, "two")], &[], 1, &serde_json::json!({"n": 2}))
        .await
        .unwrap();
    writer.finish(&reconcile()).await.unwrap();
    assert_eq!(count_rows(&db.url).await, 2);
    match store.claim(&key, &request("c")).await.unwrap() {
        Claim::Done(result) => assert_eq!(result["rows_inserted"], 2),
        other => panic!("expected done, got {other:?}"),
    }
}

async fn changed_key_type_is_a_contract_error(postgres: bool) {
    let db = TestDb::new(postgres).await;
    let store = Store::connect(&db.url).await.unwrap();
    let p = pipeline();
    store
        .ensure_table(&TableSchema::from_pipeline(&p))
        .await
        .unwrap();
    let changed = Pipeline::parse(
        &PIPELINE.replace("type = \"int\"", "type = \"text\""),
        Path::new("p.toml"),
    )
    .unwrap();
    let err = store
        .ensure_table(&TableSchema::from_pipeline(&changed))
        .await
        .unwrap_err();
    match &err {
        Error::Contract { table, message } => {
            assert_eq!(table, "items");
            assert!(message.contains("column `id`"), "{message}");
        }
        other => panic!("expected a contract error, got {other:?}"),
    }
}

/// A natural key already loaded under another run key is taken over (its
/// lineage moves), never duplicated; an identical row of the same run key is
/// not rewritten.
async fn key_from_another_run_key_is_taken_over(postgres: bool) {
    let p = pipeline();
    let (db, store, schema) = with_table(postgres, &p).await;
    for (day, rows) in [
        ("2024-01-01", vec![row(1, "one"), row(2, "two")]),
        ("2024-01-02", vec![row(2, "two"), row(3, "three")]),
    ] {
        let key = key(&p, day);
        let result = load_once(&store, &schema, &key, &request("a"), &rows, &reconcile()).await;
        if day == "2024-01-02" {
            assert_eq!(
                (
                    result["rows_inserted"].as_u64(),
                    result["rows_updated"].as_u64()
                ),
                (Some(1), Some(1)),
                "{result}"
            );
        }
    }
    assert_eq!(count_rows(&db.url).await, 3, "key 2 exists once");
}

/// A row soft-deleted by one run and back in the source of the next is
/// revived in place: updated, `_tm_deleted_at` cleared, never inserted twice.
async fn soft_deleted_row_that_returns_is_revived(postgres: bool) {
    let p = Pipeline::parse(
        &format!("{PIPELINE}on_missing = \"soft_delete\"\n"),
        Path::new("p.toml"),
    )
    .unwrap();
    let (db, store, schema) = with_table(postgres, &p).await;
    let key = key(&p, "2024-01-01");
    let soft_delete = tidemark_load::Reconcile {
        on_missing: tidemark_core::spec::OnMissing::SoftDelete,
        ..reconcile()
    };
    let all = [row(1, "one"), row(2, "two"), row(3, "three")];
    let mut results = Vec::new();
    for (force, rows) in [(false, &all[..]), (true, &all[..2]), (true, &all[..])] {
        let request = ClaimRequest {
            force,
            ..request("a")
        };
        let result = load_once(&store, &schema, &key, &request, rows, &soft_delete).await;
        let counts: Vec<Option<u64>> = [
            "rows_inserted",
            "rows_updated",
            "rows_unchanged",
            "rows_deleted",
        ]
        .iter()
        .map(|c| result[c].as_u64())
        .collect();
        results.push(counts);
        let live = scalar(
            &db.url,
            "SELECT count(*) FROM items WHERE _tm_deleted_at IS NULL",
        )
        .await;
        assert_eq!(
            live,
            i64::try_from(rows.len()).unwrap(),
            "live rows after {result}"
        );
    }
    assert_eq!(
        results,
        [
            [Some(3), Some(0), Some(0), Some(0)],
            [Some(0), Some(0), Some(2), Some(1)],
            [Some(0), Some(1), Some(2), Some(0)],
        ],
        "inserted, updated, unchanged, deleted per run"
    );
    assert_eq!(count_rows(&db.url).await, 3, "key 3 exists once");
}

/// Stored keys of every key type read back to the hashes the transform
/// computes, so an identical re-sync writes nothing on either backend.
async fn stored_keys_of_every_type_read_back_unchanged(postgres: bool) {
    use tidemark_core::{FieldType, Value};
    let p = Pipeline::parse(
        concat!(
            pipeline_header!(),
            r#"[fields]
t = { type = "text", required = true }
n = { type = "int", required = true }
d = { type = "decimal", required = true }
b = { type = "bool", required = true }
day = { type = "date", required = true }
ts = { type = "timestamp", required = true }
tz = { type = "timestamptz", required = true }
note = { type = "text" }
f = { type = "float" }
j = { type = "json" }
[load]
table = "typed"
key = ["t", "n", "d", "b", "day", "ts", "tz"]
"#
        ),
        Path::new("p.toml"),
    )
    .unwrap();
    let (db, store, schema) = with_table(postgres, &p).await;
    let shape = schema.shape();
    let rows: Vec<Row> = (0..3)
        .map(|i| {
            let values = vec![
                Value::Text(format!("tab\there, back\\slash {i}")),
                Value::Int(-7 + i),
                Value::from_canonical_text(FieldType::Decimal, "10.50").unwrap(),
                Value::Bool(i % 2 == 0),
                Value::from_canonical_text(FieldType::Date, "2024-02-29").unwrap(),
                Value::from_canonical_text(FieldType::Timestamp, "2024-01-02T03:04:05.25").unwrap(),
                Value::from_canonical_text(
                    FieldType::Timestamptz,
                    "2024-01-02T03:04:05.123456+02:00",
                )
                .unwrap(),
                Value::Text("note".into()),
                Value::Float(1.5),
                Value::from_canonical_text(FieldType::Json, r#"{"a":[1,2],"b":"x"}"#).unwrap(),
            ];
            Row::new(&shape, &schema.key, values)
        })
        .collect();
    let key = key(&p, "2024-01-01");
    let mut results = Vec::new();
    for force in [false, true] {
        let request = ClaimRequest {
            force,
            ..request("a")
        };
        let run = claimed(store.claim(&key, &request).await.unwrap());
        let mut writer = store
            .writer(schema.clone(), &run, &key, OPTIONS)
            .await
            .unwrap();
        for row in &rows {
            let expected = force.then_some(row.row_hash);
            assert_eq!(
                writer.stored_hash(row.key_hash).unwrap(),
                expected,
                "{:?}",
                row.values
            );
        }
        writer
            .write_batch(&rows, &[], 3, &serde_json::json!({}))
            .await
            .unwrap();
        let result = writer.finish(&reconcile()).await.unwrap();
        results.push((
            result["rows_inserted"].as_u64(),
            result["rows_updated"].as_u64(),
            result["rows_unchanged"].as_u64(),
        ));
    }
    assert_eq!(
        results,
        [(Some(3), Some(0), Some(0)), (Some(0), Some(0), Some(3))],
        "inserted, updated, unchanged: first run, identical re-run"
    );
    let stored = if postgres {
        r#"SELECT count(*) FROM typed WHERE f = 1.5 AND j = '{"a":[1,2],"b":"x"}'::jsonb
             AND tz = '2024-01-02T01:04:05.123456Z' AND d = 10.5 AND day = '2024-02-29'"#
    } else {
        r#"SELECT count(*) FROM typed WHERE f = 1.5 AND j = '{"a":[1,2],"b":"x"}'
             AND d = '10.5' AND day = '2024-02-29'"#
    };
    assert_eq!(scalar(&db.url, stored).await, 3, "values stored as typed");
}

/// After a crash, the resumed attempt knows every key its committed batches
/// saw: rows they wrote (they carry the run id) and rows they skipped as
/// unchanged (remembered in the ledger), so reconciliation deletes only
/// what really vanished. Starting the period over takes a new run id, so
/// nothing written before counts as seen.
async fn resume_knows_what_committed_batches_saw(postgres: bool) {
    let p = pipeline();
    let (db, store, schema) = with_table(postgres, &p).await;
    let key = key(&p, "2024-01-01");
    let delete = tidemark_load::Reconcile {
        on_missing: tidemark_core::spec::OnMissing::Delete,
        ..reconcile()
    };
    let original = [
        row(1, "one"),
        row(2, "two"),
        row(3, "three"),
        row(4, "four"),
    ];
    load_once(&store, &schema, &key, &request("a"), &original, &delete).await;

    // A forced re-run commits one batch (row 1 unchanged, row 2 changed), then dies.
    let forced = ClaimRequest {
        force: true,
        ..request("a")
    };
    let run = claimed(store.claim(&key, &forced).await.unwrap());
    let mut writer = store
        .writer(schema.clone(), &run, &key, OPTIONS)
        .await
        .unwrap();
    writer
        .write_batch(
            &[row(1, "one"), row(2, "TWO")],
            &[],
            2,
            &serde_json::json!({"n": 2}),
        )
        .await
        .unwrap();
    drop(writer);
    expire_lease(&db.url).await;

    let resumed = claimed(store.claim(&key, &request("b")).await.unwrap());
    assert_eq!(resumed.lease.run_id, run.lease.run_id);
    let mut writer = store
        .writer(schema.clone(), &resumed, &key, OPTIONS)
        .await
        .unwrap();
    assert!(
        seen(&mut writer, row(1, "one").key_hash),
        "skipped as unchanged"
    );
    assert!(
        seen(&mut writer, row(2, "TWO").key_hash),
        "written by the run"
    );
    assert!(!seen(&mut writer, row(3, "three").key_hash));

    // Starting over takes a new run id: nothing counts as seen any more.
    let run_id = store.restart_fresh(&resumed.lease).await.unwrap();
    assert_ne!(run_id, resumed.lease.run_id);
    let fresh = ClaimedRun {
        lease: tidemark_load::Lease {
            run_id,
            ..resumed.lease.clone()
        },
        resume: None,
        counts: Default::default(),
        batches: 0,
        seen: Default::default(),
        new_fields: Vec::new(),
    };
    let mut restarted = store
        .writer(schema.clone(), &fresh, &key, OPTIONS)
        .await
        .unwrap();
    assert!(!seen(&mut restarted, row(2, "TWO").key_hash));
    drop(restarted);

    // The resumed attempt reads on: row 3 comes back, row 4 has vanished.
    writer
        .write_batch(&[row(3, "three")], &[], 1, &serde_json::json!({"n": 3}))
        .await
        .unwrap();
    let result = writer.finish(&delete).await.unwrap();
    assert_eq!(result["rows_deleted"].as_u64(), Some(1), "{result}");
    assert_eq!(count_rows(&db.url).await, 3, "rows 1-3 stay");
}

/// Claims the run key, writes `rows` as one batch and finishes: the result.
/// A fresh database with `p`'s destination table: how most tests start.
async fn with_table(postgres: bool, p: &Pipeline) -> (TestDb, Store, TableSchema) {
    let db = TestDb::new(postgres).await;
    let store = Store::connect(&db.url).await.unwrap();
    let schema = TableSchema::from_pipeline(p);
    store.ensure_table(&schema).await.unwrap();
    (db, store, schema)
}

async fn load_once(
    store: &Store,
    schema: &TableSchema,
    key: &RunKey,
    request: &ClaimRequest,
    rows: &[Row],
    reconcile: &tidemark_load::Reconcile,
) -> serde_json::Value {
    let run = claimed(store.claim(key, request).await.unwrap());
    let mut writer = store
        .writer(schema.clone(), &run, key, OPTIONS)
        .await
        .unwrap();
    let read = rows.len() as u64;
    writer
        .write_batch(rows, &[], read, &serde_json::json!({}))
        .await
        .unwrap();
    writer.finish(reconcile).await.unwrap()
}

fn reconcile() -> tidemark_load::Reconcile {
    tidemark_load::Reconcile {
        on_missing: tidemark_core::spec::OnMissing::Keep,
        max_delete_fraction: 0.5,
        force_deletes: false,
    }
}

async fn expire_lease(url: &str) {
    let sql = if url.starts_with("sqlite") {
        "UPDATE _tm_runs SET lease_expires_at = '2000-01-01T00:00:00.000Z'"
    } else {
        "UPDATE _tm_runs SET lease_expires_at = now() - interval '1 second'"
    };
    execute(url, sql).await;
}

async fn execute(url: &str, sql: &str) {
    if url.starts_with("sqlite") {
        let mut c = sqlx::SqliteConnection::connect(url).await.unwrap();
        sqlx::query(sql).execute(&mut c).await.unwrap();
    } else {
        let mut c = sqlx::PgConnection::connect(url).await.unwrap();
        sqlx::query(sql).execute(&mut c).await.unwrap();
    }
}

async fn count_rows(url: &str) -> i64 {
    scalar(url, "SELECT count(*) FROM items").await
}

async fn scalar(url: &str, sql: &str) -> i64 {
    if url.starts_with("sqlite") {
        let mut c = sqlx::SqliteConnection::connect(url).await.unwrap();
        sqlx::query_scalar(sql).fetch_one(&mut c).await.unwrap()
    } else {
        let mut c = sqlx::PgConnection::connect(url).await.unwrap();
        sqlx::query_scalar(sql).fetch_one(&mut c).await.unwrap()
    }
}

/// A ledger created by the first migration, with a done run key, its
/// attempt history and a crashed run's remembered batch, survives the
/// upgrade to the current states intact (SQLite rebuilds its tables for
/// the new CHECK constraints: the cascade must not eat the history), and
/// the new states are then accepted.
async fn ledger_of_the_first_migration_upgrades_with_its_history(postgres: bool) {
    let db = TestDb::new(postgres).await;
    let dialect = if postgres { "postgres" } else { "sqlite" };
    let first = tempfile::tempdir().unwrap();
    let source = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join(format!("../../migrations/{dialect}/0001_ledger.sql"));
    std::fs::copy(&source, first.path().join("0001_ledger.sql")).unwrap();
    let migrator = sqlx::migrate::Migrator::new(first.path()).await.unwrap();
    let (now, bytes) = if postgres {
        ("now()", "'\\x00ff'::bytea")
    } else {
        ("'2024-01-01T00:00:00.000Z'", "x'00ff'")
    };
    let seed = [
        format!(
            "INSERT INTO _tm_runs (id, pipeline, source, export_type, period_start, period_end, status, attempt,
                                   run_id, rows_read, rows_inserted, created_at, updated_at)
             VALUES (7, 'p', 's', 'e', '2024-01-01T00:00:00Z', '2024-01-02T00:00:00Z', 'done', 2, 'r', 5, 5, {now}, {now})"
        ),
        format!(
            "INSERT INTO _tm_attempts (run_ref, attempt, run_id, worker, status, started_at)
             VALUES (7, 1, 'r', 'w', 'lost', {now}), (7, 2, 'r', 'w', 'done', {now})"
        ),
        format!("INSERT INTO _tm_batches (run_ref, run_id, batch_no, key_hashes) VALUES (7, 'r', 1, {bytes})"),
    ];
    if postgres {
        let mut c = sqlx::PgConnection::connect(&db.url).await.unwrap();
        migrator.run(&mut c).await.unwrap();
        for sql in &seed {
            sqlx::query(sql).execute(&mut c).await.unwrap();
        }
    } else {
        let options = sqlx::sqlite::SqliteConnectOptions::from_str(&db.url)
            .unwrap()
            .create_if_missing(true);
        let mut c = sqlx::SqliteConnection::connect_with(&options)
            .await
            .unwrap();
        migrator.run(&mut c).await.unwrap();
        for sql in &seed {
            sqlx::query(sql).execute(&mut c).await.unwrap();
        }
    }

    let store = Store::connect(&db.url).await.expect("upgrades");
    let entries = store.status("p", None).await.unwrap();
    assert_eq!(entries.len(), 1);
    assert_eq!(entries[0].status, tidemark_load::RunStatus::Done);
    assert_eq!(
        (entries[0].attempts, entries[0].counts.rows_inserted),
        (2, 5)
    );
    assert_eq!(
        scalar(
            &db.url,
            "SELECT count(*) FROM _tm_attempts WHERE run_ref = 7"
        )
        .await,
        2
    );
    assert_eq!(
        scalar(
            &db.url,
            "SELECT count(*) FROM _tm_batches WHERE run_ref = 7"
        )
        .await,
        1
    );
    execute(
        &db.url,
        "UPDATE _tm_runs SET status = 'cancelled' WHERE id = 7",
    )
    .await;
    execute(
        &db.url,
        "UPDATE _tm_attempts SET status = 'interrupted' WHERE attempt = 1",
    )
    .await;
    // Foreign keys still hold after the rebuild: deleting the run cascades.
    execute(&db.url, "DELETE FROM _tm_runs WHERE id = 7").await;
    assert_eq!(
        scalar(&db.url, "SELECT count(*) FROM _tm_attempts").await,
        0
    );
    store.close().await;
}

/// A long-lived process (`serve`) keeps its pooled connections, and
/// PostgreSQL keeps a connection's temporary staging table, made `LIKE`
/// the destination table, for as long as the connection lives. Once a new
/// field has added a column, changed rows must still merge (through a
/// stage that has the column), on the same pool.
async fn added_column_is_written_by_a_pool_that_merged_before(postgres: bool) {
    use tidemark_core::Value;
    let p = pipeline();
    let (db, store, schema) = with_table(postgres, &p).await;
    let key = key(&p, "2024-01-01");
    let forced = ClaimRequest {
        force: true,
        ..request("a")
    };
    let first = [row(1, "one"), row(2, "two")];
    load_once(&store, &schema, &key, &request("a"), &first, &reconcile()).await;
    // Changed rows of the run key merge through the staging table.
    let changed = [row(1, "ONE"), row(2, "two")];
    let result = load_once(&store, &schema, &key, &forced, &changed, &reconcile()).await;
    assert_eq!(result["rows_updated"], 1, "{result}");

    let wider = Pipeline::parse(
        &PIPELINE.replace(
            "name = { type = \"text\" }",
            "name = { type = \"text\" }\nnote = { type = \"text\" }",
        ),
        Path::new("p.toml"),
    )
    .unwrap();
    let wide = TableSchema::from_pipeline(&wider);
    store.ensure_table(&wide).await.unwrap();
    let shape = wide.shape();
    let noted = |id: i64, name: &str, note: Option<&str>| {
        let note = note.map_or(Value::Null, |n| Value::Text(n.into()));
        Row::new(
            &shape,
            &wide.key,
            vec![Value::Int(id), Value::Text(name.into()), note],
        )
    };
    let rows = [noted(1, "ONE", Some("n1")), noted(2, "two", None)];
    let result = load_once(&store, &wide, &key, &forced, &rows, &reconcile()).await;
    assert_eq!(result["rows_updated"], 1, "{result}");
    assert_eq!(
        result["rows_unchanged"], 1,
        "a NULL in the new column is no change: {result}"
    );
    assert_eq!(
        scalar(&db.url, "SELECT count(*) FROM items WHERE note = 'n1'").await,
        1
    );
    store.close().await;
}

// ---------------------------------------------------------------------------
// The work queue
// ---------------------------------------------------------------------------

fn queue_key(pipeline: &Pipeline, day: &str) -> tidemark_load::QueueKey {
    let period = pipeline.period(day).unwrap();
    tidemark_load::QueueKey {
        source: "s".into(),
        period_start: period.start_rfc3339(),
        period_end: period.end_rfc3339(),
    }
}

fn queue_pipelines() -> Vec<tidemark_load::QueuePipeline> {
    vec![tidemark_load::QueuePipeline {
        name: "p".into(),
        handler_version: "1".into(),
        fields_fingerprint: pipeline().fields_fingerprint().as_str().to_string(),
        // Every period of these tests is due.
        due_before: chrono::Utc::now(),
        notices: Default::default(),
    }]
}

async fn enqueue_days(
    store: &Store,
    days: &[&str],
    priority: i64,
    requeue: &[tidemark_load::RunStatus],
) -> u64 {
    let p = pipeline();
    let keys: Vec<_> = days.iter().map(|d| queue_key(&p, d)).collect();
    store
        .enqueue(&tidemark_load::Enqueue {
            pipeline: "p",
            export_type: "e",
            keys: &keys,
            priority,
            by: tidemark_load::EnqueuedBy::Backfill,
            requeue,
            respect_backoff: false,
        })
        .await
        .unwrap()
}

/// Queuing is idempotent (the run key is the identity), claims follow the
/// rank (priority as a head start, then age), and an empty queue claims
/// nothing.
async fn queue_claims_by_priority_then_age_once_each(postgres: bool) {
    let (_db, store, _) = with_table(postgres, &pipeline()).await;
    assert_eq!(
        enqueue_days(&store, &["2024-01-01", "2024-01-02"], 0, &[]).await,
        2
    );
    assert_eq!(
        enqueue_days(&store, &["2024-01-01", "2024-01-02"], 0, &[]).await,
        0
    );
    assert_eq!(enqueue_days(&store, &["2024-01-03"], 10, &[]).await, 1);
    let mut order = Vec::new();
    while let Some(queued) = store
        .claim_next(&queue_pipelines(), &request("w1"))
        .await
        .unwrap()
    {
        assert_eq!(queued.run.lease.attempt, 1);
        order.push(queued.period_start);
    }
    assert_eq!(
        order,
        [
            "2024-01-03T00:00:00Z",
            "2024-01-01T00:00:00Z",
            "2024-01-02T00:00:00Z"
        ],
        "priority first, then the order queued"
    );
    assert!(!store
        .work_left(&queue_pipelines(), &request("w1").worker)
        .await
        .unwrap());
    // A key queued for a pipeline this worker does not run is not its.
    assert!(store
        .claim_next(
            &[tidemark_load::QueuePipeline {
                name: "other".into(),
                ..queue_pipelines()[0].clone()
            }],
            &request("w1"),
        )
        .await
        .unwrap()
        .is_none());
    store.close().await;
}

/// Concurrent claims of the queue never take one key twice.
async fn concurrent_queue_claims_take_each_key_once(postgres: bool) {
    let (_db, store, _) = with_table(postgres, &pipeline()).await;
    let days: Vec<String> = (1..=20).map(|d| format!("2024-01-{d:02}")).collect();
    let refs: Vec<&str> = days.iter().map(String::as_str).collect();
    enqueue_days(&store, &refs, 0, &[]).await;
    let mut tasks = Vec::new();
    for w in 0..4 {
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            let mut got = Vec::new();
            loop {
                let next = store
                    .claim_next(&queue_pipelines(), &request(&format!("w{w}")))
                    .await;
                match next {
                    Ok(Some(q)) => got.push(q.period_start),
                    Ok(None) => return got,
                    // SQLite's one writer may be busy a moment; try again.
                    Err(e) if e.is_transient() => continue,
                    Err(e) => panic!("{e}"),
                }
            }
        }));
    }
    let mut all = Vec::new();
    for task in tasks {
        all.extend(task.await.unwrap());
    }
    all.sort();
    let unique: std::collections::BTreeSet<_> = all.iter().cloned().collect();
    assert_eq!(
        (all.len(), unique.len()),
        (20, 20),
        "each key claimed exactly once"
    );
    store.close().await;
}

/// Claims `k` with `request`, commits one batch (checkpoint `{"records": 1}`)
/// and hands the key back as a signal would; the attempt and its writer.
async fn interrupted_after_a_batch(
    store: &Store,
    schema: &TableSchema,
    k: &RunKey,
    request: &ClaimRequest,
) -> (ClaimedRun, RunWriter) {
    let run = claimed(store.claim(k, request).await.unwrap());
    let mut writer = store
        .writer(schema.clone(), &run, k, OPTIONS)
        .await
        .unwrap();
    writer
        .write_batch(&[row(1, "a")], &[], 1, &serde_json::json!({"records": 1}))
        .await
        .unwrap();
    store
        .interrupt(&run.lease, &writer.counts(), "signal")
        .await
        .unwrap();
    (run, writer)
}

/// The queue's open-period rule, at the flow: a pending key whose period
/// ends after its pipeline's due cut-off is neither claimed nor work left;
/// a provisional attempt's key is, and the claim continues it
/// provisionally; once due, the claim is final and starts over.
async fn queue_claims_open_periods_only_to_continue_a_provisional_attempt(postgres: bool) {
    let (db, store, schema) = with_table(postgres, &pipeline()).await;
    let p = pipeline();
    let at = |text: &str| {
        chrono::DateTime::parse_from_rfc3339(text)
            .unwrap()
            .with_timezone(&chrono::Utc)
    };
    let queue_at = |cutoff: &str| {
        let mut queue = queue_pipelines();
        queue[0].due_before = at(cutoff);
        queue
    };
    // 2024-01-05 ends 2024-01-06T00:00Z.
    let open = queue_at("2024-01-05T12:00:00Z");
    let due = queue_at("2024-01-06T00:00:00Z");
    let me = request("w1").worker;
    assert_eq!(enqueue_days(&store, &["2024-01-05"], 0, &[]).await, 1);
    assert!(store
        .claim_next(&open, &request("w1"))
        .await
        .unwrap()
        .is_none());
    assert!(!store.work_left(&open, &me).await.unwrap(), "not work left");
    assert!(store.work_left(&due, &me).await.unwrap());

    // A provisional attempt (`--allow-open`), interrupted after a batch.
    execute(&db.url, "DELETE FROM _tm_runs").await;
    let k = key(&p, "2024-01-05");
    let provisional = ClaimRequest {
        provisional: true,
        ..request("w1")
    };
    let (run, _) = interrupted_after_a_batch(&store, &schema, &k, &provisional).await;
    assert!(store.work_left(&open, &me).await.unwrap());
    let next = store
        .claim_next(&open, &request("w2"))
        .await
        .unwrap()
        .expect("a provisional attempt is continued while open");
    assert!(next.provisional);
    assert_eq!(next.run.lease.run_id, run.lease.run_id, "continued");
    store
        .interrupt(&next.run.lease, &next.run.counts, "signal")
        .await
        .unwrap();
    let last = store
        .claim_next(&due, &request("w2"))
        .await
        .unwrap()
        .expect("claimed once due");
    assert!(!last.provisional, "final once due");
    assert!(last.run.resume.is_none(), "read again from the start");
    assert_ne!(last.run.lease.run_id, run.lease.run_id);
    store.close().await;
}

/// An interrupted attempt hands its key back with its checkpoint: the next
/// claim (any worker) resumes under the same run id; the attempt history
/// says `interrupted`; and a cancelled pending key is claimed by nobody.
async fn interrupted_key_is_resumed_and_cancelled_key_is_left(postgres: bool) {
    let (db, store, schema) = with_table(postgres, &pipeline()).await;
    let p = pipeline();
    let k = key(&p, "2024-01-05");
    let (run, mut writer) = interrupted_after_a_batch(&store, &schema, &k, &request("w1")).await;
    let entry = &store.status("p", None).await.unwrap()[0];
    assert_eq!(entry.status, tidemark_load::RunStatus::Pending);
    assert_eq!(
        entry.error_class,
        Some(tidemark_load::StoredClass::Interrupted)
    );
    assert_eq!(
        scalar(
            &db.url,
            "SELECT count(*) FROM _tm_runs WHERE error_class = 'interrupted'"
        )
        .await,
        1,
        "stored as the contract's word"
    );
    assert!(entry.lease_owner.is_none());
    let next = store
        .claim_next(&queue_pipelines(), &request("w2"))
        .await
        .unwrap()
        .expect("the interrupted key is queued");
    assert_eq!(
        next.run.lease.run_id, run.lease.run_id,
        "same run id: a resume"
    );
    assert_eq!(next.run.resume, Some(serde_json::json!({"records": 1})));
    assert_eq!(next.run.lease.attempt, 2);
    assert_eq!(
        scalar(
            &db.url,
            "SELECT count(*) FROM _tm_attempts WHERE status = 'interrupted'"
        )
        .await,
        1
    );
    // The superseded attempt can commit nothing more.
    assert!(matches!(
        writer
            .write_batch(&[row(2, "b")], &[], 1, &serde_json::json!({"records": 2}))
            .await,
        Err(Error::LeaseLost(_))
    ));

    enqueue_days(&store, &["2024-01-06", "2024-01-07"], 0, &[]).await;
    let day6 = p.period("2024-01-06").unwrap().start_rfc3339();
    let cancelled = store
        .cancel("p", None, Some(&day6), Some(&day6))
        .await
        .unwrap();
    assert_eq!(cancelled, 1);
    let next = store
        .claim_next(&queue_pipelines(), &request("w2"))
        .await
        .unwrap()
        .expect("the other key");
    assert!(next.period_start.starts_with("2024-01-07"));
    assert!(store
        .claim_next(&queue_pipelines(), &request("w2"))
        .await
        .unwrap()
        .is_none());
    // Queued again by an operator, the cancelled key comes back.
    assert_eq!(
        enqueue_days(
            &store,
            &["2024-01-06"],
            0,
            &[tidemark_load::RunStatus::Cancelled]
        )
        .await,
        1
    );
    store.close().await;
}

/// A failure's class reads back typed; a stored class this tidemark does
/// not know is an invariant error naming it, not a panic and not a string
/// passed on.
async fn stored_error_class_reads_back_typed(postgres: bool) {
    let (db, store, _) = with_table(postgres, &pipeline()).await;
    let p = pipeline();
    fail_once(&store, &key(&p, "2024-01-05")).await;
    let entry = &store.status("p", None).await.unwrap()[0];
    assert_eq!(
        entry.error_class,
        Some(tidemark_load::StoredClass::Failure(
            tidemark_core::ErrorClass::Source
        ))
    );
    execute(&db.url, "UPDATE _tm_runs SET error_class = 'gremlins'").await;
    match store.status("p", None).await {
        Err(Error::Invariant(message)) => {
            assert!(message.contains("\"gremlins\""), "{message}");
            assert!(message.contains("error_class"), "{message}");
        }
        other => panic!("expected an invariant error, got {other:?}"),
    }
    store.close().await;
}

/// The values a state column's `CHECK (status IN (...))` allows, as the
/// freshly migrated database itself reports the constraint: SQLite's
/// table definition (`sqlite_master`), PostgreSQL's `pg_get_constraintdef`.
async fn allowed_states(url: &str, table: &str) -> Vec<String> {
    let definitions: Vec<String> = if url.starts_with("sqlite") {
        let mut c = sqlx::SqliteConnection::connect(url).await.unwrap();
        let sql: String =
            sqlx::query_scalar("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = $1")
                .bind(table)
                .fetch_one(&mut c)
                .await
                .unwrap();
        // The column's CHECK, up to its closing parentheses.
        let check = &sql[sql.find("CHECK (status IN (").expect(&sql)..];
        vec![check[..check.find("))").expect(check)].to_string()]
    } else {
        let mut c = sqlx::PgConnection::connect(url).await.unwrap();
        sqlx::query_scalar(
            "SELECT pg_get_constraintdef(oid) FROM pg_constraint
             WHERE conrelid = $1::regclass AND contype = 'c'
               AND pg_get_constraintdef(oid) LIKE '%status%'",
        )
        .bind(table)
        .fetch_all(&mut c)
        .await
        .unwrap()
    };
    assert_eq!(
        definitions.len(),
        1,
        "one status CHECK on {table}: {definitions:?}"
    );
    // The quoted literals: `'pending'` (SQLite), `'pending'::text` (PostgreSQL).
    let mut values: Vec<String> = definitions[0]
        .split('\'')
        .skip(1)
        .step_by(2)
        .map(str::to_string)
        .collect();
    values.sort();
    values
}

/// `RunStatus` and `AttemptStatus` are exactly the sets the migrated
/// database's CHECK constraints allow: a variant added without a migration
/// (or a migration without a variant) fails here, not at a user's first
/// write of the new state.
async fn state_enums_are_the_check_constraints(postgres: bool) {
    let db = TestDb::new(postgres).await;
    let store = Store::connect(&db.url).await.unwrap();
    store.close().await;
    let sorted = |mut names: Vec<&str>| {
        names.sort_unstable();
        names.into_iter().map(str::to_string).collect::<Vec<_>>()
    };
    let runs = tidemark_load::RunStatus::ALL.map(|s| s.as_str());
    let attempts = tidemark_load::AttemptStatus::ALL.map(|s| s.as_str());
    assert_eq!(
        allowed_states(&db.url, "_tm_runs").await,
        sorted(runs.to_vec())
    );
    assert_eq!(
        allowed_states(&db.url, "_tm_attempts").await,
        sorted(attempts.to_vec())
    );
}

/// Claims `k` and records a permanent failure of the attempt.
async fn fail_once(store: &Store, k: &RunKey) {
    let run = claimed(store.claim(k, &request("w1")).await.unwrap());
    let error = Error::source_permanent("404");
    store
        .mark_failed(&run.lease, &Default::default(), &error)
        .await
        .unwrap();
}

/// A failed key records a backoff (`not_before`: one minute, doubling,
/// capped at a day) from the database's clock (the failure's `finished_at`,
/// stamped by the same statement); a scheduler's queueing respects it, an
/// operator's does not.
async fn failed_key_backs_off_and_only_an_operator_skips_it(postgres: bool) {
    let (db, store, _) = with_table(postgres, &pipeline()).await;
    let p = pipeline();
    let k = key(&p, "2024-01-05");
    let time = |text: Option<&str>| {
        chrono::DateTime::parse_from_rfc3339(text.unwrap())
            .unwrap()
            .with_timezone(&chrono::Utc)
    };
    let mut waits = Vec::new();
    for _ in 0..13 {
        fail_once(&store, &k).await;
        let entry = &store.status("p", None).await.unwrap()[0];
        let not_before = time(entry.not_before.as_deref());
        let failed_at = time(entry.finished_at.as_deref());
        waits.push((not_before - failed_at).num_seconds());
        assert!(entry.backing_off, "by the database's clock");
    }
    assert_eq!(&waits[..4], &[60, 120, 240, 480]);
    assert_eq!(*waits.last().unwrap(), 86_400, "capped at a day");
    let schedule = |respect_backoff: bool| {
        let store = store.clone();
        let key = queue_key(&p, "2024-01-05");
        async move {
            store
                .enqueue(&tidemark_load::Enqueue {
                    pipeline: "p",
                    export_type: "e",
                    keys: &[key],
                    priority: 0,
                    by: tidemark_load::EnqueuedBy::Schedule,
                    requeue: &[tidemark_load::RunStatus::Failed],
                    respect_backoff,
                })
                .await
                .unwrap()
        }
    };
    assert_eq!(schedule(true).await, 0, "not before its backoff has passed");
    execute(
        &db.url,
        "UPDATE _tm_runs SET not_before = '2000-01-01T00:00:00.000Z'",
    )
    .await;
    assert!(!store.status("p", None).await.unwrap()[0].backing_off);
    assert_eq!(schedule(true).await, 1, "queued once it has");
    // An operator queues a failed key at once.
    fail_once(&store, &k).await;
    assert_eq!(schedule(true).await, 0);
    assert_eq!(schedule(false).await, 1, "an operator: at once");
    store.close().await;
}

/// A finished run's row and its attempt's row both say `done`, with the
/// same final counts, and only that attempt ends: on PostgreSQL the two are
/// one statement (`finish_done`), on SQLite two.
async fn a_finished_run_and_only_its_attempt_end_done(postgres: bool) {
    let p = pipeline();
    let (db, store, schema) = with_table(postgres, &p).await;
    let (day, other) = (key(&p, "2024-01-01"), key(&p, "2024-01-02"));
    let rows = [row(1, "a"), row(2, "b"), row(3, "c")];
    load_once(&store, &schema, &day, &request("a"), &rows, &reconcile()).await;
    // A second key's attempt, claimed and left running.
    claimed(store.claim(&other, &request("a")).await.unwrap());
    let forced = ClaimRequest {
        force: true,
        ..request("a")
    };
    load_once(&store, &schema, &day, &forced, &rows[..2], &reconcile()).await;
    let done = |attempt: i64| {
        format!(
            "SELECT count(*) FROM _tm_attempts a JOIN _tm_runs r ON r.id = a.run_ref
             WHERE r.period_start = (SELECT min(period_start) FROM _tm_runs) AND a.attempt = {attempt}
               AND a.status = 'done' AND a.finished_at IS NOT NULL AND a.error_class IS NULL"
        )
    };
    assert_eq!(
        scalar(&db.url, &done(1)).await,
        1,
        "the first attempt ended done"
    );
    assert_eq!(
        scalar(&db.url, &done(2)).await,
        1,
        "the forced attempt ended done"
    );
    // The forced attempt's counts, on its row and on the run row.
    let counts = "SELECT count(*) FROM _tm_attempts a JOIN _tm_runs r ON r.id = a.run_ref
                  WHERE a.attempt = 2 AND a.rows_read = 2 AND a.rows_unchanged = 2
                    AND r.rows_read = 2 AND r.rows_unchanged = 2 AND r.status = 'done'
                    AND r.finished_at IS NOT NULL";
    assert_eq!(
        scalar(&db.url, counts).await,
        1,
        "the same counts on both rows"
    );
    let first = "SELECT count(*) FROM _tm_attempts WHERE attempt = 1 AND rows_read = 3 AND rows_inserted = 3";
    assert_eq!(
        scalar(&db.url, first).await,
        1,
        "the first attempt's counts stay"
    );
    let running =
        "SELECT count(*) FROM _tm_attempts WHERE status = 'running' AND finished_at IS NULL";
    assert_eq!(
        scalar(&db.url, running).await,
        1,
        "the other key's attempt still runs"
    );
}

/// The names of `table`'s columns.
async fn column_names(url: &str, table: &str) -> Vec<String> {
    if url.starts_with("sqlite") {
        let mut c = sqlx::SqliteConnection::connect(url).await.unwrap();
        sqlx::query_scalar(&format!("SELECT name FROM pragma_table_info('{table}')"))
            .fetch_all(&mut c)
            .await
            .unwrap()
    } else {
        let mut c = sqlx::PgConnection::connect(url).await.unwrap();
        sqlx::query_scalar(
            "SELECT column_name::text FROM information_schema.columns
             WHERE table_name = $1 AND table_schema = current_schema()",
        )
        .bind(table)
        .fetch_all(&mut c)
        .await
        .unwrap()
    }
}

/// The first claim of a key with no ledger row creates the row `running`
/// with attempt 1 started (`create_running`: one statement on PostgreSQL,
/// two on SQLite) instead of inserting it `pending` and starting the
/// attempt through the claim rules. Both rows it writes must hold what
/// that longer way writes: a key whose row was created `pending` first is
/// claimed beside it, and every column of both tables (a column added
/// later is compared too) must match, except identity and clock columns.
async fn a_first_claim_writes_what_a_claim_of_a_new_pending_row_writes(postgres: bool) {
    let p = pipeline();
    let (db, store, _) = with_table(postgres, &p).await;
    let (new, pending) = (key(&p, "2024-01-01"), key(&p, "2024-01-02"));
    let (new_start, pending_start) = (new.period.start_rfc3339(), pending.period.start_rfc3339());
    // The row a first claim used to insert before it took the key.
    execute(
        &db.url,
        &format!(
            "INSERT INTO _tm_runs (pipeline, source, export_type, period_start, period_end, created_at, updated_at)
             VALUES ('p', 's', 'e', '{pending_start}', '{}', '2024-06-01T00:00:00.000Z', '2024-06-01T00:00:00.000Z')",
            pending.period.end_rfc3339()
        ),
    )
    .await;
    let first = claimed(store.claim(&new, &request("a")).await.unwrap());
    let taken = claimed(store.claim(&pending, &request("a")).await.unwrap());
    assert_eq!(first.lease.attempt, 1);
    assert_eq!(
        (
            first.lease.attempt,
            &first.lease.owner,
            first.batches,
            first.resume.is_none()
        ),
        (
            taken.lease.attempt,
            &taken.lease.owner,
            taken.batches,
            taken.resume.is_none()
        )
    );
    assert_eq!(first.counts, taken.counts);
    assert_eq!(first.new_fields, taken.new_fields);
    let same = if postgres {
        "IS NOT DISTINCT FROM"
    } else {
        "IS"
    };
    for (table, of_key, skip) in [
        (
            "_tm_runs",
            "period_start",
            &[
                "id",
                "period_start",
                "period_end",
                "run_id",
                "lease_expires_at",
                "started_at",
                "created_at",
                "updated_at",
            ][..],
        ),
        (
            "_tm_attempts",
            "run_ref",
            &["id", "run_ref", "run_id", "started_at"][..],
        ),
    ] {
        let (a, b) = match of_key {
            "period_start" => (format!("'{new_start}'"), format!("'{pending_start}'")),
            _ => (
                first.lease.run_ref.to_string(),
                taken.lease.run_ref.to_string(),
            ),
        };
        let columns = column_names(&db.url, table).await;
        assert!(columns.len() > skip.len() + 5, "{table}: {columns:?}");
        for column in columns.iter().filter(|c| !skip.contains(&c.as_str())) {
            let sql = format!(
                "SELECT count(*) FROM {table} a, {table} b
                 WHERE a.{of_key} = {a} AND b.{of_key} = {b} AND a.{column} {same} b.{column}"
            );
            assert_eq!(scalar(&db.url, &sql).await, 1, "{table}.{column} differs");
        }
    }
    // The clock columns are set, in the order the two claims ran.
    let clocks = format!(
        "SELECT count(*) FROM _tm_runs a, _tm_runs b
         WHERE a.period_start = '{new_start}' AND b.period_start = '{pending_start}'
           AND a.started_at <= b.started_at AND a.lease_expires_at <= b.lease_expires_at
           AND a.started_at < a.lease_expires_at AND a.updated_at IS NOT NULL
           AND a.created_at IS NOT NULL AND a.run_id = '{}'",
        first.lease.run_id
    );
    assert_eq!(scalar(&db.url, &clocks).await, 1, "clock columns");
    store.close().await;
}

both_backends!(
    a_first_claim_writes_what_a_claim_of_a_new_pending_row_writes,
    a_finished_run_and_only_its_attempt_end_done,
    queue_claims_by_priority_then_age_once_each,
    concurrent_queue_claims_take_each_key_once,
    interrupted_key_is_resumed_and_cancelled_key_is_left,
    queue_claims_open_periods_only_to_continue_a_provisional_attempt,
    failed_key_backs_off_and_only_an_operator_skips_it,
    ledger_of_the_first_migration_upgrades_with_its_history,
    concurrent_claims_have_exactly_one_winner,
    superseded_attempt_cannot_commit,
    changed_key_type_is_a_contract_error,
    key_from_another_run_key_is_taken_over,
    soft_deleted_row_that_returns_is_revived,
    stored_keys_of_every_type_read_back_unchanged,
    resume_knows_what_committed_batches_saw,
    run_key_rows_are_read_through_the_index,
    table_created_by_another_connection_is_checked_on_a_fresh_schema,
    added_column_is_written_by_a_pool_that_merged_before,
    stored_error_class_reads_back_typed,
    state_enums_are_the_check_constraints,
    a_large_backlog_is_claimed_through_the_queue_index,
);

/// Ends every session of the test database at the server, as a restart or
/// an idle-session reaper would, and waits until they are gone: how many
/// there were.
async fn end_sessions(url: &str) -> i64 {
    let name = url.rsplit('/').next().unwrap().split('?').next().unwrap();
    let admin = support::admin_url();
    let mut c = sqlx::PgConnection::connect(&admin).await.unwrap();
    let ended: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity
                               WHERE datname = $1 AND pid <> pg_backend_pid()) t",
    )
    .bind(name)
    .fetch_one(&mut c)
    .await
    .unwrap();
    for _ in 0..500 {
        let left: i64 =
            sqlx::query_scalar("SELECT count(*) FROM pg_stat_activity WHERE datname = $1")
                .bind(name)
                .fetch_one(&mut c)
                .await
                .unwrap();
        if left == 0 {
            return ended;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the sessions of {name} did not end");
}

/// The pool hands out a connection used within the last second without
/// pinging it first (sqlx pings every one by default: a round trip before
/// each transaction, two per small period), and pings one idle longer,
/// and every one for a while after a connection was found gone. So after
/// the server drops its sessions (a restart), the first transaction on a
/// just-used connection fails, transiently (the engine retries it); the
/// next is handed a pinged connection, a new one, though the pool still
/// held a second dead one; and a dead connection idle past the second is
/// replaced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_pooled_connection_is_pinged_and_a_fresh_one_is_not() {
    let p = pipeline();
    let db = TestDb::new(true).await;
    let two = tidemark_load::StoreOptions {
        max_connections: Some(2),
        pgbouncer: false,
    };
    let store = Store::connect_with(&db.url, &two).await.unwrap();
    let (first, second, asking) = (key(&p, "2024-01-01"), key(&p, "2024-01-02"), request("a"));
    let (one, other) = tokio::join!(store.claim(&first, &asking), store.claim(&second, &asking));
    claimed(one.unwrap());
    claimed(other.unwrap());
    assert_eq!(end_sessions(&db.url).await, 2, "two pooled connections");
    let error = store
        .claim(&key(&p, "2024-01-03"), &request("a"))
        .await
        .expect_err("a dead connection used within the second is not pinged");
    assert!(error.is_transient(), "{error}");
    // The pool's other connection is dead too, and was used within the
    // second: pinged all the same, now that one was found gone.
    claimed(
        store
            .claim(&key(&p, "2024-01-03"), &request("a"))
            .await
            .unwrap(),
    );
    // Dropped, then idle past the second: pinged, found dead, replaced.
    assert!(end_sessions(&db.url).await > 0);
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    claimed(
        store
            .claim(&key(&p, "2024-01-04"), &request("a"))
            .await
            .unwrap(),
    );
    store.close().await;
}

/// Two schedulers and a `status` started together on a new SQLite file:
/// the first switches the file to WAL while the others open it. Opening a
/// file not yet in WAL while another connection holds its write lock made
/// SQLite refuse at once ("database is locked", no busy wait), which failed
/// `status` in CI; opening now waits for the writer. This holds the write
/// lock on a rollback-journal file for half a second to make the race
/// certain.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_open_waits_for_a_writer_on_a_new_file() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}?mode=rwc", dir.path().join("t.db").display());
    let mut writer = sqlx::SqliteConnection::connect(&url).await.unwrap();
    execute_on(&mut writer, "CREATE TABLE first_writer (a INTEGER)").await;
    execute_on(&mut writer, "BEGIN IMMEDIATE").await;
    execute_on(&mut writer, "INSERT INTO first_writer VALUES (1)").await;
    let open = tokio::spawn({
        let url = url.clone();
        async move { Store::connect(&url).await.map(|_| ()) }
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!open.is_finished(), "opening must wait for the writer");
    execute_on(&mut writer, "COMMIT").await;
    let opened = open.await.unwrap();
    assert!(opened.is_ok(), "{opened:?}");
    assert_eq!(
        scalar(&url, "SELECT count(*) FROM first_writer").await,
        1,
        "the writer's row survived"
    );
}

const TIMES_PIPELINE: &str = concat!(
    pipeline_header!(),
    r#"[fields]
id = { type = "int", required = true }
day = { type = "date" }
ts = { type = "timestamp" }
tz = { type = "timestamptz" }
[load]
table = "times"
key = ["id"]
"#
);

/// New SQLite tables declare dates and times `*_TEXT` (TEXT affinity, so
/// SQLite stores the text without first trying to read it as a number);
/// tables created by earlier builds declared `DATE`, `TIMESTAMP` and
/// `TIMESTAMPTZ`, and are still accepted and loaded into, with the same
/// stored texts and hashes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_time_columns_of_earlier_tables_are_still_accepted() {
    use tidemark_core::{FieldType, Value};
    let p = Pipeline::parse(TIMES_PIPELINE, Path::new("p.toml")).unwrap();
    let schema = TableSchema::from_pipeline(&p);
    let values = |i: i64| {
        vec![
            Value::Int(i),
            Value::from_canonical_text(FieldType::Date, "2024-02-29").unwrap(),
            Value::from_canonical_text(FieldType::Timestamp, "2024-01-02T03:04:05.25").unwrap(),
            Value::from_canonical_text(FieldType::Timestamptz, "2024-01-02T03:04:05Z").unwrap(),
        ]
    };
    let rows: Vec<Row> = (1..=3)
        .map(|i| Row::new(&schema.shape(), &schema.key, values(i)))
        .collect();
    for earlier in [false, true] {
        let db = TestDb::new(false).await;
        let store = Store::connect(&db.url).await.unwrap();
        if earlier {
            execute(
                &db.url,
                "CREATE TABLE times (id INTEGER, day DATE, ts TIMESTAMP, tz TIMESTAMPTZ,
                   _tm_source TEXT NOT NULL, _tm_export_type TEXT NOT NULL,
                   _tm_period_start TEXT NOT NULL, _tm_run_id TEXT NOT NULL,
                   _tm_row_hash TEXT NOT NULL, _tm_loaded_at TEXT NOT NULL, UNIQUE (id))",
            )
            .await;
        }
        store.ensure_table(&schema).await.unwrap();
        let declared = scalar(
            &db.url,
            "SELECT count(*) FROM pragma_table_info('times')
             WHERE type IN ('DATE_TEXT', 'TIMESTAMP_TEXT', 'TIMESTAMPTZ_TEXT')",
        )
        .await;
        assert_eq!(
            declared,
            if earlier { 0 } else { 3 },
            "earlier table: {earlier}"
        );
        let key = key(&p, "2024-01-01");
        let first = load_once(&store, &schema, &key, &request("a"), &rows, &reconcile()).await;
        assert_eq!(first["rows_inserted"].as_u64(), Some(3), "{first}");
        let force = ClaimRequest {
            force: true,
            ..request("a")
        };
        let again = load_once(&store, &schema, &key, &force, &rows, &reconcile()).await;
        assert_eq!(again["rows_unchanged"].as_u64(), Some(3), "{again}");
        let stored = scalar(
            &db.url,
            "SELECT count(*) FROM times WHERE typeof(day) = 'text' AND day = '2024-02-29'
               AND ts = '2024-01-02T03:04:05.250' AND tz = '2024-01-02T03:04:05Z'",
        )
        .await;
        assert_eq!(stored, 3, "earlier table: {earlier}");
    }
}

async fn execute_on(conn: &mut sqlx::SqliteConnection, sql: &str) {
    sqlx::query(sql).execute(conn).await.unwrap();
}

/// Reading one run key's rows (every re-sync does) goes through the
/// run-key index, never a scan of the whole table. PostgreSQL is asked with
/// sequential scans discouraged, as its planner would scan a table this
/// small anyway.
async fn run_key_rows_are_read_through_the_index(postgres: bool) {
    let p = pipeline();
    let (db, _store, _schema) = with_table(postgres, &p).await;
    let query = "SELECT _tm_row_hash FROM items
         WHERE _tm_source = 's' AND _tm_export_type = 'e' AND _tm_period_start = '2024-01-01T00:00:00Z'";
    let plan: Vec<String> = if postgres {
        let mut c = sqlx::PgConnection::connect(&db.url).await.unwrap();
        sqlx::query("SET enable_seqscan = off")
            .execute(&mut c)
            .await
            .unwrap();
        sqlx::query_scalar(&format!("EXPLAIN {query}"))
            .fetch_all(&mut c)
            .await
            .unwrap()
    } else {
        let mut c = sqlx::SqliteConnection::connect(&db.url).await.unwrap();
        let rows = sqlx::query(&format!("EXPLAIN QUERY PLAN {query}"))
            .fetch_all(&mut c)
            .await
            .unwrap();
        rows.iter()
            .map(|r| sqlx::Row::get::<String, _>(r, "detail"))
            .collect()
    };
    assert!(
        plan.iter().any(|line| line.contains("items__tm_run_key")),
        "{plan:?}"
    );
}

/// A claim costs O(log n) in the backlog on both databases: with 20,000
/// keys queued on a new ledger, the plan of the claim's first pending key
/// (the statement itself, from `Store::explain_claim`) reads the queue
/// index in rank order and sorts nothing, and the takeover scan reads only
/// running keys through an index. On PostgreSQL the statistics are
/// refreshed once the keys are queued (`enqueued`), without which it sorted
/// every pending key on each claim (17 ms a claim at 10,000 keys); on
/// SQLite, which has no statistics, the planner sorted the backlog for
/// each claim (20 claims/s at 250,000 pending against 2,100 at 1,000)
/// until the statement named its index.
async fn a_large_backlog_is_claimed_through_the_queue_index(postgres: bool) {
    let (_db, store, _) = with_table(postgres, &pipeline()).await;
    let first = chrono::NaiveDate::from_ymd_opt(1950, 1, 1).unwrap();
    let days: Vec<String> = (0..20_000)
        .map(|i| {
            (first + chrono::Days::new(i))
                .format("%Y-%m-%d")
                .to_string()
        })
        .collect();
    let refs: Vec<&str> = days.iter().map(String::as_str).collect();
    for page in refs.chunks(10_000) {
        assert_eq!(enqueue_days(&store, page, 0, &[]).await, 10_000);
    }
    // A command queues a page per call, then says how many it queued.
    store.enqueued(20_000).await;
    let plan = store.explain_claim(&queue_pipelines()).await.unwrap();
    let queue_index = if postgres {
        "Index Scan using _tm_runs_queue"
    } else {
        "SCAN _tm_runs USING INDEX _tm_runs_queue"
    };
    assert!(
        plan.next.iter().any(|line| line.contains(queue_index)),
        "{plan:#?}"
    );
    for refused in ["Sort", "TEMP B-TREE", "Seq Scan"] {
        assert!(
            !plan.next.iter().any(|line| line.contains(refused)),
            "{refused}: {plan:#?}"
        );
    }
    // The takeover scan reads running keys only (through the running
    // keys' index or the state's), never the table or the backlog.
    let running_only = if postgres {
        "status = 'running'"
    } else {
        "status=?"
    };
    assert!(
        plan.takeover
            .iter()
            .any(|line| line.contains("_tm_runs_running") || line.contains(running_only)),
        "{plan:#?}"
    );
    assert!(
        !plan.takeover.iter().any(|line| line.contains("Seq Scan")
            || (line.starts_with("SCAN _tm_runs") && !line.contains("USING"))),
        "{plan:#?}"
    );
    // And a claim takes the oldest key.
    let claimed = store
        .claim_next(&queue_pipelines(), &request("a"))
        .await
        .unwrap()
        .expect("a claim");
    assert!(
        claimed.period_start.starts_with("1950-01-01"),
        "{claimed:?}"
    );
    store.close().await;
}

/// A table another process created after this store's connections read
/// the schema is checked against the fresh schema. On SQLite, periods
/// starting together on a new database hit this: one creates the table,
/// the other checked it on a pooled connection whose schema predated it
/// and saw no UNIQUE index ("no UNIQUE constraint on exactly the natural
/// key").
async fn table_created_by_another_connection_is_checked_on_a_fresh_schema(postgres: bool) {
    let p = pipeline();
    let db = TestDb::new(postgres).await;
    let store = Store::connect(&db.url).await.unwrap();
    // Every pooled connection reads the schema, before the table exists.
    let (a, b, c, d) = tokio::join!(
        store.status("p", None),
        store.status("p", None),
        store.status("p", None),
        store.status("p", None)
    );
    for result in [a, b, c, d] {
        result.unwrap();
    }
    let other = Store::connect(&db.url).await.unwrap();
    let schema = TableSchema::from_pipeline(&p);
    other.ensure_table(&schema).await.unwrap();
    for _ in 0..8 {
        store.ensure_table(&schema).await.unwrap();
    }
}
