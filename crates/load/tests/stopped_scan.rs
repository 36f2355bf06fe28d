//! A scan of a run key's stored rows that stops early leaves its
//! connection fit for the next statement (PostgreSQL).
//!
//! The stored rows are read with `COPY … TO STDOUT`, which sqlx does not
//! count among the answers a connection still owes. A scan that stopped at
//! its first rows (here: the spill file of a period larger than the memory
//! budget cannot be made) used to put its connection back in the pool with
//! the rest of the `COPY` unread; the next statement on it (the attempt's
//! failure record) read that data as its answer and failed, and the key
//! stayed `running` until its lease ran out. CI met it under load, where
//! the next statement happened to get that connection; a pool of one
//! connection makes it certain.
//!
//! A test binary of its own: it points `TMPDIR` at a missing directory,
//! which no other test in this process may see.

mod support;

use std::path::Path;
use std::time::Duration;

use sqlx::Connection as _;

use support::TestDb;
use tidemark_core::{Error, FieldType, Pipeline, Row, RowShape, RunKey, Value};
use tidemark_load::{
    Claim, ClaimRequest, ClaimedRun, Reconcile, Store, StoreOptions, TableSchema, WorkerId,
    WriterOptions,
};

const PIPELINE: &str = r#"
name = "p"
export_type = "e"
[period]
granularity = "day"
[[sources]]
id = "s"
transport = "file"
format = "csv"
path = "x.csv"
[fields]
id = { type = "int", required = true }
name = { type = "text" }
[load]
table = "items"
key = ["id"]
"#;

/// Rows of the period: far more than one `COPY` chunk, so most of the
/// data is still on its way when the scan stops.
const ROWS: i64 = 5_000;

fn request(pipeline: &Pipeline, force: bool) -> ClaimRequest {
    ClaimRequest {
        force,
        handler_version: "1".into(),
        fields_fingerprint: pipeline.fields_fingerprint().as_str().to_string(),
        provisional: false,
        worker: WorkerId {
            host: "test-host-scan".into(),
            pid: 1,
            instance: "scan".into(),
        },
        lease_ttl: Duration::from_secs(30),
        notices: Default::default(),
    }
}

fn claimed(claim: Claim) -> ClaimedRun {
    match claim {
        Claim::Claimed(run) => *run,
        other => panic!("expected a claim, got {other:?}"),
    }
}

fn rows() -> Vec<Row> {
    let shape = RowShape::new([("id", FieldType::Int), ("name", FieldType::Text)]);
    (0..ROWS)
        .map(|id| {
            let values = vec![Value::Int(id), Value::Text(format!("row {id}"))];
            Row::new(&shape, &[0], values)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scan_stopped_early_leaves_its_connection_usable() {
    let db = TestDb::new(true).await;
    let one = StoreOptions {
        max_connections: Some(1),
        pgbouncer: false,
    };
    let store = Store::connect_with(&db.url, &one).await.unwrap();
    let pipeline = Pipeline::parse(PIPELINE, Path::new("p.toml")).unwrap();
    let schema = TableSchema::from_pipeline(&pipeline);
    store.ensure_table(&schema).await.unwrap();
    let key = RunKey::new("p", "s", "e", pipeline.period("2024-01-01").unwrap());
    let reconcile = Reconcile {
        on_missing: tidemark_core::spec::OnMissing::Keep,
        max_delete_fraction: 0.5,
        force_deletes: false,
    };
    let in_memory = WriterOptions {
        memory_budget: 64 << 20,
        track_new_keys: false,
    };

    let first = claimed(store.claim(&key, &request(&pipeline, false)).await.unwrap());
    let mut writer = store
        .writer(schema.clone(), &first, &key, in_memory)
        .await
        .unwrap();
    writer
        .write_batch(&rows(), &[], rows().len() as u64, &serde_json::json!({}))
        .await
        .unwrap();
    writer.finish(&reconcile).await.unwrap();

    // A forced re-run whose stored rows need the spill file, which cannot
    // be made: the scan stops after its first rows.
    let again = claimed(store.claim(&key, &request(&pipeline, true)).await.unwrap());
    let nowhere = tempfile::tempdir().unwrap().path().join("missing");
    std::env::set_var("TMPDIR", &nowhere);
    let spilling = WriterOptions {
        memory_budget: 1024,
        ..in_memory
    };
    let error = store
        .writer(schema.clone(), &again, &key, spilling)
        .await
        .expect_err("the spill file cannot be made");
    std::env::remove_var("TMPDIR");
    assert!(matches!(error, Error::TempFile { .. }), "{error:?}");

    // The attempt's failure is recorded on the pool's one connection.
    store
        .mark_failed(&again.lease, &again.counts, &error)
        .await
        .expect("the failure is recorded on the connection the scan used");
    let mut check = sqlx::PgConnection::connect(&db.url).await.unwrap();
    let (status, class): (String, String) =
        sqlx::query_as("SELECT status, error_class FROM _tm_runs")
            .fetch_one(&mut check)
            .await
            .unwrap();
    assert_eq!((status.as_str(), class.as_str()), ("failed", "config"));
}
