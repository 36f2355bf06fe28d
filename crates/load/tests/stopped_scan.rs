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
//! Two ways a scan stops early, each on both reads of stored rows' shared
//! `scan`: the spill file cannot be made (at the writer's start), and a
//! stored key does not parse. And two ways a `COPY` is dropped unfinished
//! (a program embedding the engine cancels a run): mid-scan (`COPY … TO
//! STDOUT`) and mid-batch (`COPY … FROM STDIN`).
//!
//! A test binary of its own: one test points `TMPDIR` at a missing
//! directory, which no other test may see; the two here take turns
//! ([`ONE_AT_A_TIME`]).

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

/// The test pipeline with the key field `id` of `key_type`.
fn pipeline(key_type: &str) -> Pipeline {
    let text = PIPELINE.replace("KEY_TYPE", key_type);
    Pipeline::parse(&text, Path::new("p.toml")).unwrap()
}

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
id = { type = "KEY_TYPE", required = true }
name = { type = "text" }
[load]
table = "items"
key = ["id"]
"#;

/// Held by each test for its whole run: `TMPDIR` is the process's.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

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

/// [`ROWS`] rows, their key `id` typed as `key`.
fn rows(key: FieldType) -> Vec<Row> {
    let shape = RowShape::new([("id", key), ("name", FieldType::Text)]);
    (0..ROWS)
        .map(|id| {
            let key = match key {
                FieldType::Decimal => Value::Decimal(id.into()),
                _ => Value::Int(id),
            };
            let values = vec![key, Value::Text(format!("row {id}"))];
            Row::new(&shape, &[0], values)
        })
        .collect()
}

/// A period loaded once, on a store whose pool holds one connection: the
/// statement after a scan is certain to get the connection it used.
struct Loaded {
    db: TestDb,
    store: Store,
    pipeline: Pipeline,
    schema: TableSchema,
    key: RunKey,
}

/// Writer options of a period that fits the memory budget.
const IN_MEMORY: WriterOptions = WriterOptions {
    memory_budget: 64 << 20,
    track_new_keys: false,
};

impl Loaded {
    async fn new(key_type: FieldType) -> Loaded {
        let db = TestDb::new(true).await;
        let one = StoreOptions {
            max_connections: Some(1),
            pgbouncer: false,
        };
        let store = Store::connect_with(&db.url, &one).await.unwrap();
        let name = if key_type == FieldType::Decimal {
            "decimal"
        } else {
            "int"
        };
        let pipeline = pipeline(name);
        let schema = TableSchema::from_pipeline(&pipeline);
        store.ensure_table(&schema).await.unwrap();
        let key = RunKey::new("p", "s", "e", pipeline.period("2024-01-01").unwrap());
        let first = claimed(store.claim(&key, &request(&pipeline, false)).await.unwrap());
        let mut writer = store
            .writer(schema.clone(), &first, &key, IN_MEMORY)
            .await
            .unwrap();
        let rows = rows(key_type);
        writer
            .write_batch(&rows, &[], rows.len() as u64, &serde_json::json!({}))
            .await
            .unwrap();
        let reconcile = Reconcile {
            on_missing: tidemark_core::spec::OnMissing::Keep,
            max_delete_fraction: 0.5,
            force_deletes: false,
        };
        writer.finish(&reconcile).await.unwrap();
        Loaded {
            db,
            store,
            pipeline,
            schema,
            key,
        }
    }

    /// A forced re-run's claim.
    async fn again(&self) -> ClaimedRun {
        let request = request(&self.pipeline, true);
        claimed(self.store.claim(&self.key, &request).await.unwrap())
    }

    /// Records `error` as `run`'s failure (on the pool's one connection),
    /// and returns the ledger's status and error class.
    async fn fail(&self, run: &ClaimedRun, error: &Error) -> (String, String) {
        self.store
            .mark_failed(&run.lease, &run.counts, error)
            .await
            .expect("the failure is recorded on the connection the scan used");
        let mut check = sqlx::PgConnection::connect(&self.db.url).await.unwrap();
        sqlx::query_as("SELECT status, error_class FROM _tm_runs")
            .fetch_one(&mut check)
            .await
            .unwrap()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scan_stopped_early_leaves_its_connection_usable() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let loaded = Loaded::new(FieldType::Int).await;
    // A forced re-run whose stored rows need the spill file, which cannot
    // be made: the scan stops after its first rows.
    let again = loaded.again().await;
    let nowhere = tempfile::tempdir().unwrap().path().join("missing");
    std::env::set_var("TMPDIR", &nowhere);
    let spilling = WriterOptions {
        memory_budget: 1024,
        ..IN_MEMORY
    };
    let error = loaded
        .store
        .writer(loaded.schema.clone(), &again, &loaded.key, spilling)
        .await
        .expect_err("the spill file cannot be made");
    std::env::remove_var("TMPDIR");
    assert!(matches!(error, Error::TempFile { .. }), "{error:?}");
    let (status, class) = loaded.fail(&again, &error).await;
    assert_eq!((status.as_str(), class.as_str()), ("failed", "config"));
}

/// The same for a stored key that does not parse: a decimal key column
/// holding `NaN` (PostgreSQL's numeric has it, tidemark's decimal does
/// not), written by hand ahead of the period's other rows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scan_stopped_by_an_unreadable_key_leaves_its_connection_usable() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let loaded = Loaded::new(FieldType::Decimal).await;
    // Rewritten in heap order with the NaN row first, so the scan meets
    // it first and most of the `COPY` is still unread.
    let mut admin = sqlx::PgConnection::connect(&loaded.db.url).await.unwrap();
    for sql in [
        "CREATE TEMP TABLE kept AS SELECT * FROM items",
        "UPDATE kept SET id = 'NaN' WHERE id = 2500",
        "DELETE FROM items",
        "INSERT INTO items SELECT * FROM kept ORDER BY id = 'NaN' DESC, id",
    ] {
        sqlx::query(sql).execute(&mut admin).await.unwrap();
    }
    let _ = admin.close().await;
    let again = loaded.again().await;
    let error = loaded
        .store
        .writer(loaded.schema.clone(), &again, &loaded.key, IN_MEMORY)
        .await
        .expect_err("the stored key NaN is not a decimal tidemark reads");
    let message = error.to_string();
    assert!(
        matches!(error, Error::Contract { .. })
            && message.contains("items")
            && message.contains("`id`")
            && message.contains("NaN"),
        "{error:?}"
    );
    let (status, class) = loaded.fail(&again, &error).await;
    assert_eq!((status.as_str(), class.as_str()), ("failed", "contract"));
}

/// A scan whose future is dropped mid-`COPY` (a program embedding the
/// engine cancels a run): its transaction closes the connection instead of
/// handing it back with the rest of the `COPY` unread, so the next
/// statements on the pool's one connection (the failure record, a forced
/// claim) work. Dropped after 1 to 34 polls, a millisecond apart:
/// while the `COPY` starts and at several points of its data.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scan_cancelled_mid_copy_leaves_its_pool_usable() {
    use std::future::Future as _;
    use std::task::Poll;
    let _turn = ONE_AT_A_TIME.lock().await;
    let loaded = Loaded::new(FieldType::Int).await;
    // 64 times the period's rows (copies under new keys): a `COPY` that
    // takes many polls to read.
    let mut admin = sqlx::PgConnection::connect(&loaded.db.url).await.unwrap();
    for _ in 0..6 {
        sqlx::query("INSERT INTO items SELECT id + (SELECT max(id) + 1 FROM items), name, _tm_source, _tm_export_type, _tm_period_start, _tm_run_id, _tm_row_hash, _tm_loaded_at, _tm_raw_hash FROM items")
            .execute(&mut admin)
            .await
            .unwrap();
    }
    let _ = admin.close().await;
    let mut cancelled = 0;
    let mut again = loaded.again().await;
    for polls in [1, 2, 3, 5, 8, 13, 21, 34] {
        let finished = {
            let writer = loaded
                .store
                .writer(loaded.schema.clone(), &again, &loaded.key, IN_MEMORY);
            let mut writer = std::pin::pin!(writer);
            let mut finished = false;
            for _ in 0..polls {
                let ready =
                    std::future::poll_fn(|cx| Poll::Ready(writer.as_mut().poll(cx).is_ready()));
                if ready.await {
                    finished = true;
                    break;
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            finished
        };
        cancelled += usize::from(!finished);
        // The pool's one connection (or its replacement) takes the next
        // statements: the attempt's failure record, then a forced claim.
        let error = Error::Invariant("cancelled".into());
        let (status, _) = loaded.fail(&again, &error).await;
        assert_eq!(status, "failed", "after {polls} polls");
        again = loaded.again().await;
    }
    assert!(
        cancelled >= 3,
        "the scan was cancelled mid-way {cancelled} times"
    );
}

/// The same for a batch whose write is dropped mid-`COPY … FROM STDIN`
/// (sqlx's `COPY` in, dropped, sends `CopyFail` without counting the
/// answer it is owed): nothing of the batch is written, and the pool's one
/// connection takes the failure record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_cancelled_mid_copy_leaves_its_pool_usable_and_writes_nothing() {
    use std::future::Future as _;
    use std::task::Poll;
    let _turn = ONE_AT_A_TIME.lock().await;
    let loaded = Loaded::new(FieldType::Int).await;
    let next = RunKey::new("p", "s", "e", loaded.pipeline.period("2024-01-02").unwrap());
    let request = request(&loaded.pipeline, false);
    let run = claimed(loaded.store.claim(&next, &request).await.unwrap());
    let mut writer = loaded
        .store
        .writer(loaded.schema.clone(), &run, &next, IN_MEMORY)
        .await
        .unwrap();
    let shape = RowShape::new([("id", FieldType::Int), ("name", FieldType::Text)]);
    let big: Vec<Row> = (ROWS..ROWS + 200_000)
        .map(|id| {
            Row::new(
                &shape,
                &[0],
                vec![Value::Int(id), Value::Text(format!("row {id:>40}"))],
            )
        })
        .collect();
    let checkpoint = serde_json::json!({});
    let mut cancelled = 0;
    for polls in [1, 2, 3, 5, 8, 13, 21, 34] {
        let write = writer.write_batch(&big, &[], big.len() as u64, &checkpoint);
        let mut write = std::pin::pin!(write);
        let mut finished = false;
        for _ in 0..polls {
            let ready = std::future::poll_fn(|cx| Poll::Ready(write.as_mut().poll(cx).is_ready()));
            if ready.await {
                finished = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        assert!(
            !finished,
            "the batch was written in {polls} polls; it must be cancelled"
        );
        cancelled += 1;
    }
    assert_eq!(cancelled, 8);
    drop(writer);
    loaded
        .store
        .mark_failed(
            &run.lease,
            &run.counts,
            &Error::Invariant("cancelled".into()),
        )
        .await
        .expect("the failure is recorded on the pool's connection");
    let mut check = sqlx::PgConnection::connect(&loaded.db.url).await.unwrap();
    let status: String =
        sqlx::query_scalar("SELECT status FROM _tm_runs ORDER BY period_start DESC LIMIT 1")
            .fetch_one(&mut check)
            .await
            .unwrap();
    assert_eq!(status, "failed", "the failure record ran on the pool");
    let stored: i64 = sqlx::query_scalar("SELECT count(*) FROM items")
        .fetch_one(&mut check)
        .await
        .unwrap();
    assert_eq!(stored, ROWS, "nothing of the cancelled batches was written");
}
