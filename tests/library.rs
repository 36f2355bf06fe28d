//! The engine as a library: `examples/custom_source.rs`, a program of its
//! own that runs one period with a source tidemark does not ship, is
//! killed (`kill -9`) after its second committed batch and run again. The
//! second run resumes at the third batch (the source is opened from the
//! checkpoint the engine committed), and the table equals the one an
//! uninterrupted run loads.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::{Backend, TestDb, BIN};

/// The example's binary, built when missing (`cargo test --test
/// integration` alone does not build examples).
fn example() -> PathBuf {
    let path = std::path::Path::new(BIN)
        .parent()
        .expect("target dir")
        .join("examples")
        .join("custom_source");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let built = Command::new(cargo)
        .args(["build", "--quiet", "--example", "custom_source"])
        .current_dir(crate::support::repo_root())
        .status()
        .expect("cargo build --example custom_source");
    assert!(built.success(), "the example builds");
    path
}

/// Runs the example to its end; its stdout.
fn run_example(example: &PathBuf, url: &str) -> String {
    let out = Command::new(example)
        .args([url, "2024-01-02"])
        .output()
        .expect("run the example");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "the example exits 0\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// The loaded rows, without the lineage columns (load times differ).
async fn readings(db: &TestDb) -> Vec<Vec<Option<String>>> {
    db.rows("SELECT id, sensor, CAST(reading AS TEXT) FROM readings ORDER BY id")
        .await
}

async fn batches_committed(db: &TestDb) -> i64 {
    if let TestDb::Sqlite { path } = db {
        if !path.exists() {
            return 0; // the example has not opened it yet
        }
    }
    if !db.table_exists("_tm_runs").await {
        return 0;
    }
    db.rows("SELECT CAST(batches AS TEXT) FROM _tm_runs")
        .await
        .first()
        .and_then(|row| row[0].as_deref().map(|n| n.parse().unwrap_or(0)))
        .unwrap_or(0)
}

async fn killed_example_resumes_at_its_third_batch(backend: Backend) {
    let example = example();
    let dir = tempfile::tempdir().expect("temp dir");
    let clean = TestDb::new(backend, dir.path()).await;
    std::fs::create_dir_all(dir.path().join("killed")).expect("dir");
    let killed = TestDb::new(backend, &dir.path().join("killed")).await;

    let first = run_example(&example, &clean.url());
    assert!(
        first.contains("opened 2024-01-02 at record 0 (batch 1)"),
        "{first}"
    );
    let expected = readings(&clean).await;
    assert_eq!(
        expected.len(),
        5_000,
        "an uninterrupted run loads every record"
    );

    let mut child = Command::new(&example)
        .args([killed.url().as_str(), "2024-01-02"])
        .env("CUSTOM_SOURCE_BATCH_DELAY_MS", "400")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start the example");
    let deadline = Instant::now() + Duration::from_secs(60);
    while batches_committed(&killed).await < 2 {
        assert!(
            Instant::now() < deadline,
            "two batches committed within 60 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    child.kill().expect("kill -9");
    child.wait().expect("reap");
    assert_eq!(
        batches_committed(&killed).await,
        2,
        "killed after its second batch"
    );
    assert_eq!(killed.count("FROM readings").await, 2_000);

    let second = run_example(&example, &killed.url());
    assert!(
        second.contains("opened 2024-01-02 at record 2000 (batch 3)"),
        "the second run resumes at the third batch\n{second}"
    );
    assert!(second.contains("done"), "{second}");
    assert_eq!(
        readings(&killed).await,
        expected,
        "equal to an uninterrupted run"
    );
    let runs = killed
        .rows("SELECT status, CAST(attempt AS TEXT) FROM _tm_runs")
        .await;
    assert_eq!(
        runs,
        vec![vec![Some("done".to_string()), Some("2".to_string())]],
        "one run key, done by its second attempt"
    );
}

#[tokio::test]
async fn killed_example_resumes_at_its_third_batch_sqlite() {
    killed_example_resumes_at_its_third_batch(Backend::Sqlite).await;
}

#[tokio::test]
async fn killed_example_resumes_at_its_third_batch_postgres() {
    killed_example_resumes_at_its_third_batch(Backend::Postgres).await;
}
