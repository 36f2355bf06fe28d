//! Database faults during a run: a transient error inside a batch
//! transaction is retried and the run completes exactly once.

use std::time::Duration;

use sqlx::Connection;

use crate::support::{Backend, Env};

fn day_count(env: &Env, day: &str) -> i64 {
    let entry = env.status_of("orders", day).expect("ledger entry");
    entry["rows_inserted"].as_i64().unwrap_or(-1)
}

/// PostgreSQL: a trigger terminates the backend in the middle of the first
/// batch's COPY (once: a sequence survives the rollback). The connection
/// error is transient, the batch is retried on a new connection, and the
/// period ends with exactly its rows, in one attempt.
#[tokio::test]
async fn terminated_backend_in_a_batch_is_retried_postgres() {
    let env = Env::orders(Backend::Postgres).await;
    env.tidemark(&["run", "orders", "--period", "2024-01-01"])
        .expect_code(0, "creates the table");
    let mut conn = sqlx::PgConnection::connect(&env.db.url())
        .await
        .expect("connect");
    for sql in [
        "CREATE SEQUENCE fault_once",
        "CREATE FUNCTION fault() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
           IF nextval('fault_once') = 1 THEN PERFORM pg_terminate_backend(pg_backend_pid()); END IF;
           RETURN NEW;
         END $$",
        "CREATE TRIGGER fault BEFORE INSERT ON orders FOR EACH ROW EXECUTE FUNCTION fault()",
    ] {
        sqlx::query(sql).execute(&mut conn).await.expect(sql);
    }
    let out = env.tidemark(&["run", "orders", "--period", "2024-01-02"]);
    out.expect_code(0, "the run survives a killed database session");
    assert!(
        out.stderr.contains("retrying"),
        "the retry is logged\n{out}"
    );
    assert!(
        out.stderr.contains("period=2024-01-02"),
        "with the run key\n{out}"
    );
    let fired: i64 = sqlx::query_scalar("SELECT last_value FROM fault_once")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert!(
        fired >= 2,
        "the trigger fired, then the retry went through ({fired})"
    );
    assert_eq!(
        env.db
            .count("FROM orders WHERE order_id LIKE 'O-20240102-%'")
            .await,
        20
    );
    let entry = env.status_of("orders", "2024-01-02").expect("ledger");
    assert_eq!(entry["status"], "done");
    assert_eq!(
        entry["attempts"], 1,
        "retried inside the attempt, not a new claim"
    );
    assert_eq!(day_count(&env, "2024-01-02"), 20);
}

/// SQLite: another process holds the write lock for two seconds in the
/// middle of a backfill; tidemark waits (busy timeout) and completes.
#[tokio::test]
async fn write_lock_held_by_another_process_is_waited_out_sqlite() {
    let env = Env::orders(Backend::Sqlite).await;
    env.tidemark(&["run", "orders", "--period", "2024-01-01"])
        .expect_code(0, "creates the database");
    let mut conn = sqlx::SqliteConnection::connect(&env.db.url())
        .await
        .expect("connect");
    sqlx::query("BEGIN EXCLUSIVE")
        .execute(&mut conn)
        .await
        .expect("lock");
    let running = env.spawn(&[
        "backfill",
        "orders",
        "--from",
        "2024-01-02",
        "--to",
        "2024-01-05",
    ]);
    tokio::time::sleep(Duration::from_secs(2)).await;
    sqlx::query("COMMIT")
        .execute(&mut conn)
        .await
        .expect("unlock");
    let out = running.finish(Duration::from_secs(60));
    out.expect_code(0, "backfill completes once the lock is released");
    assert!(
        out.elapsed >= Duration::from_millis(1500),
        "it did wait: {:?}",
        out.elapsed
    );
    assert_eq!(env.db.count("FROM orders").await, 100);
}

/// SQLite: a finished command leaves its rows in the database file itself,
/// not in a write-ahead log for the next opener to replay. A copy of the
/// main file alone holds every row, and the WAL is gone or empty.
#[tokio::test]
async fn finished_backfill_leaves_its_rows_in_the_database_file_sqlite() {
    let env = Env::orders(Backend::Sqlite).await;
    env.backfill_orders(1, 10).expect_code(0, "backfill");
    let crate::support::TestDb::Sqlite { path } = &env.db else {
        unreachable!("an SQLite test database")
    };
    let wal = path.with_extension("db-wal");
    let wal_bytes = std::fs::metadata(&wal).map(|m| m.len()).unwrap_or(0);
    assert_eq!(wal_bytes, 0, "{} should be gone or empty", wal.display());
    let copy = path.with_file_name("copy-of-main-file.db");
    std::fs::copy(path, &copy).expect("copy the main file");
    let mut conn = sqlx::SqliteConnection::connect(&format!("sqlite://{}", copy.display()))
        .await
        .expect("open the copy");
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM orders")
        .fetch_one(&mut conn)
        .await
        .expect("count");
    assert_eq!(rows, 200, "10 days of 20 orders, all in the main file");
}

/// `prune` removes attempt history and rejects older than the cut-off, and
/// never the ledger rows that make re-runs idempotent.
async fn prune_removes_only_old_history(backend: Backend) {
    let env = Env::orders(backend).await;
    env.set_option("orders", "load", "max_rejects", "1");
    let csv = env.path("pipelines/data/orders/2024/01/02/orders.csv");
    let mut lines: Vec<String> = std::fs::read_to_string(&csv)
        .expect("csv")
        .lines()
        .map(String::from)
        .collect();
    let mut cells: Vec<String> = lines[1].split(',').map(String::from).collect();
    cells[2] = "not-a-number".into(); // `total`, read as the decimal `amount`
    lines[1] = cells.join(",");
    std::fs::write(&csv, lines.join("\n") + "\n").expect("csv");
    env.backfill_orders(1, 2).expect_code(0, "backfill");
    assert_eq!(env.db.count("FROM _tm_rejects").await, 1);
    assert_eq!(env.db.count("FROM _tm_attempts").await, 2);

    let out = env.tidemark(&["prune", "--older-than", "1h"]);
    out.expect_code(0, "prune");
    assert!(
        out.stdout
            .contains("pruned 0 attempt record(s) and 0 rejected record(s)"),
        "{out}"
    );

    env.db
        .execute("UPDATE _tm_rejects SET created_at = '2000-01-01T00:00:00.000Z'")
        .await;
    env.db.execute("UPDATE _tm_attempts SET finished_at = '2000-01-01T00:00:00.000Z' WHERE attempt = 1 AND run_ref = (SELECT min(run_ref) FROM _tm_attempts)").await;
    let out = env.tidemark(&["prune", "--older-than", "30d"]);
    out.expect_code(0, "prune");
    assert!(
        out.stdout
            .contains("pruned 1 attempt record(s) and 1 rejected record(s)"),
        "{out}"
    );
    assert_eq!(env.db.count("FROM _tm_rejects").await, 0);
    assert_eq!(env.db.count("FROM _tm_attempts").await, 1);
    // The ledger itself stays: the periods are still done and not re-run.
    let out = env.tidemark(&[
        "backfill",
        "orders",
        "--from",
        "2024-01-01",
        "--to",
        "2024-01-02",
    ]);
    out.expect_code(0, "re-run after prune");
    assert!(out.stdout.contains("2 already done"), "{out}");
}

crate::support::backend_tests! {
    prune_removes_only_old_history: prune_removes_only_old_history_sqlite, prune_removes_only_old_history_postgres;
}

/// PostgreSQL: an administrator (or a failover) terminates tidemark's
/// sessions again and again during a backfill. Every database step of a
/// run (claim, opening the writer, reading stored rows, each batch, the
/// finish, recording a failure) goes through the retry policy, so every
/// period still ends `done` exactly once with exactly its rows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terminated_sessions_during_a_backfill_are_retried_postgres() {
    let env = Env::orders(Backend::Postgres).await;
    env.set_option("orders", "load", "batch_size", "7");
    // Enough tries that a run outlasts a burst of kills; what must not
    // happen is a step that is not retried at all.
    env.set_option("orders", "retry", "max_attempts", "10");
    env.set_option("orders", "retry", "max_delay", "\"2s\"");
    env.tidemark(&["migrate"]).expect_code(0, "migrate");
    let url = format!("{}?application_name=tm_chaos", env.db.url());
    let admin = env.db.url();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    // The backfill starts once the killer is connected: on a loaded
    // machine its connection could otherwise come after a short backfill.
    let (connected, ready) = tokio::sync::oneshot::channel();
    let killer = {
        let stop = std::sync::Arc::clone(&stop);
        tokio::spawn(async move {
            let mut conn = sqlx::PgConnection::connect(&admin).await.expect("connect");
            let _ = connected.send(());
            let mut killed = 0u64;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                let n: i64 = sqlx::query_scalar(
                    "SELECT COUNT(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity
                     WHERE application_name = 'tm_chaos' AND pid <> pg_backend_pid()) t",
                )
                .fetch_one(&mut conn)
                .await
                .expect("terminate");
                killed += u64::try_from(n).unwrap_or(0);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            killed
        })
    };
    ready.await.expect("the killer connects");
    let out = env.tidemark_at(
        &url,
        &[
            "backfill",
            "orders",
            "--from",
            "2024-01-01",
            "--to",
            "2024-01-31",
            "--concurrency",
            "2",
        ],
    );
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let killed = killer.await.expect("killer");
    assert!(
        killed > 5,
        "sessions were terminated during the backfill ({killed})"
    );
    out.expect_code(0, "backfill under terminated sessions");
    assert!(
        out.stderr.contains("retrying"),
        "the retries are logged\n{out}"
    );
    let entries = env.status("orders");
    assert_eq!(entries.len(), 31);
    for entry in &entries {
        assert_eq!(entry["status"], "done", "{entry}");
    }
    assert_eq!(env.db.count("FROM orders").await, 31 * 20, "each row once");
}
