//! Issue 19, database-level behaviour: row-lock waits on PostgreSQL (a
//! batch that waits on its destination table keeps its lease, and claims
//! of its key answer "held" at once instead of waiting on its row), and a
//! command that stops on a full disk leaves no key `running`.

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use sqlx::Connection as _;

use crate::support::{Backend, Env, FifoWriter};

/// Pipeline `p`: daily UTC periods, one CSV file per day, `batch_size = 500`.
fn pipeline_p(env: &Env) {
    env.write(
        "pipelines/p.toml",
        r#"name = "p"
export_type = "t"
[period]
granularity = "day"
timezone = "UTC"
start = "2024-01-01"
[[sources]]
id = "files"
transport = "file"
format = "csv"
path = "../data/{period.start:%Y-%m-%d}.csv"
[fields]
id = { type = "text", required = true }
v = { type = "int" }
[load]
table = "p"
key = ["id"]
batch_size = 500
max_rejects = 1000
"#,
    );
}

/// A day's file of `rows` rows.
fn day_file(env: &Env, day: &str, rows: usize) {
    day_file_with_rejects(env, day, rows, usize::MAX);
}

/// A day's file of `rows` rows, every `bad_every`th of them with a `v` that
/// is not an integer (a reject).
fn day_file_with_rejects(env: &Env, day: &str, rows: usize, bad_every: usize) {
    let mut text = String::from("id,v\n");
    for i in 0..rows {
        if (i + 1) % bad_every == 0 {
            let _ = writeln!(text, "{day}-{i},x");
        } else {
            let _ = writeln!(text, "{day}-{i},{i}");
        }
    }
    env.write(format!("data/{day}.csv"), &text);
}

/// Waits until the run of 2024-01-01 has committed a batch.
async fn first_batch_committed(env: &Env) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let batches = env
            .db
            .rows(
                "SELECT CAST(batches AS TEXT) FROM _tm_runs
                 WHERE period_start LIKE '2024-01-01%' AND status = 'running'",
            )
            .await;
        if batches
            .first()
            .and_then(|r| r[0].as_deref())
            .is_some_and(|b| b != "0")
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the holder never committed a batch"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The holder is mid-batch while another session holds the destination
/// table (`LOCK TABLE … ACCESS EXCLUSIVE`, as a `CREATE INDEX` or `ALTER`
/// would): a second run of the key answers 75 at once instead of waiting
/// on the run row, and the holder's heartbeat is not queued behind its own
/// batch, so it keeps its lease (attempt 1) and finishes once the lock goes.
#[tokio::test]
async fn batch_waiting_on_its_table_keeps_its_lease_and_claims_answer_held_postgres() {
    let env = Env::new(Backend::Postgres).await;
    pipeline_p(&env);
    day_file(&env, "2024-01-02", 10);
    day_file(&env, "2024-01-01", 200_000);
    // The destination table exists before the holder starts.
    env.tidemark(&["run", "p", "--period", "2024-01-02"])
        .expect_code(0, "a small day creates the table");

    let ttl = ["--lease-ttl", "3s"];
    let mut args = vec!["run", "p", "--period", "2024-01-01"];
    args.extend(ttl);
    let holder = env.spawn(&args);
    first_batch_committed(&env).await;
    let mut locker = sqlx::PgConnection::connect(&env.db.url())
        .await
        .expect("connect");
    let mut lock = locker.begin().await.expect("begin");
    sqlx::query("LOCK TABLE p IN ACCESS EXCLUSIVE MODE")
        .execute(&mut *lock)
        .await
        .expect("lock the destination table");
    let locked_at = Instant::now();

    // Longer than the lease: a heartbeat queued behind the batch would let
    // it expire.
    tokio::time::sleep(Duration::from_secs(5)).await;
    // Spawned: on a claim that waits on the row, `finish` fails the test
    // instead of waiting for a lock this test would release only later.
    let second = env.spawn(&args).finish(Duration::from_secs(10));
    second.expect_code(75, "a second run of a key whose batch waits on its table");
    assert!(
        second.elapsed < Duration::from_secs(4),
        "the claim answers at once, not after the lock\n{second}"
    );
    let live: i64 = env
        .db
        .rows(
            "SELECT CAST(COUNT(*) AS TEXT) FROM _tm_runs
             WHERE period_start LIKE '2024-01-01%' AND status = 'running'
               AND attempt = 1 AND lease_expires_at > now()",
        )
        .await[0][0]
        .as_deref()
        .unwrap_or("0")
        .parse()
        .expect("count");
    assert_eq!(live, 1, "the holder's heartbeat kept its lease");

    tokio::time::sleep(Duration::from_secs(8).saturating_sub(locked_at.elapsed())).await;
    lock.rollback().await.expect("release the table");
    let out = holder.finish(Duration::from_secs(120));
    out.expect_code(0, "the holder finishes once the table is free");
    let rows = env
        .db
        .rows(
            "SELECT status, CAST(attempt AS TEXT) FROM _tm_runs
             WHERE period_start LIKE '2024-01-01%'",
        )
        .await;
    assert_eq!(
        rows,
        vec![vec![Some("done".to_string()), Some("1".to_string())]],
        "done by its first attempt"
    );
    assert_eq!(env.db.count("FROM p").await, 200_010);
}

/// `backfill --concurrency 2` onto a SQLite file whose disk fills: the
/// command fails, and once it has exited no key is left `running` (the
/// failure of every in-flight period is recorded, so the next command sees
/// the truth without waiting for a lease to run out).
#[tokio::test]
async fn full_disk_leaves_no_key_running_sqlite() {
    let env = Env::orders(Backend::Sqlite).await;
    // The first two days are large (about 2 MiB each) and the disk keeps
    // 512 KiB free: a claim (a few pages per commit, whatever indexes the
    // ledger has) always fits, and the disk fills inside a period's batch,
    // the case this test is about. A margin that a claim could use up would
    // fail the claims instead, which leaves nothing in flight to record.
    for day in ["01", "02"] {
        big_orders_day(&env, day, 20_000);
    }
    let (disk, file, url) = crate::storage::sqlite_on_small_disk(&env, "64M");
    env.tidemark_at(&url, &["migrate"])
        .expect_code(0, "migrate on the roomy disk");
    disk.resize(&format!("{}k", disk.used_kib() + 512));
    let out = crate::storage::january(&env, &url);
    out.expect_code(1, "backfill onto a full disk");
    assert!(out.stderr.contains("disk is full"), "{out}");
    disk.resize("64M");
    let mut db = sqlx::SqliteConnection::connect(&format!("sqlite://{}", file.display()))
        .await
        .expect("open the ledger");
    let running: Vec<(String, String)> =
        sqlx::query_as("SELECT period_start, status FROM _tm_runs WHERE status = 'running'")
            .fetch_all(&mut db)
            .await
            .expect("read the ledger");
    assert!(running.is_empty(), "keys left running: {running:?}\n{out}");
    let failed: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM _tm_runs WHERE status = 'failed'")
        .fetch_one(&mut db)
        .await
        .expect("read the ledger");
    assert!(failed >= 1, "the failure is recorded\n{out}");
}

/// Replaces the orders example's file of 2024-01-DAY with `rows` orders.
fn big_orders_day(env: &Env, day: &str, rows: usize) {
    let mut csv = String::from("order_id,customer,total,currency,status,created,note\n");
    for i in 0..rows {
        csv.push_str(&format!(
            "O-202401{day}-{i:06},customer-{i},{}.{:02},,paid,{day}.01.2024 12:00,a note long enough to weigh {i}\n",
            i % 1000,
            i % 100
        ));
    }
    env.write(
        format!("pipelines/data/orders/2024/01/{day}/orders.csv"),
        &csv,
    );
}

/// A holder stopped (`SIGSTOP`) inside its batch transaction frees the run
/// row: the server ends its session idle in the transaction, and once its
/// lease has expired another run takes the key over and finishes it, where
/// a claim used to wait on the row for as long as the holder stayed stopped.
#[tokio::test]
async fn stopped_holder_frees_its_row_and_is_taken_over_postgres() {
    let env = Env::new(Backend::Postgres).await;
    pipeline_p(&env);
    day_file(&env, "2024-01-02", 10);
    // One reject per batch: the holder's batch inserts it after its rows.
    day_file_with_rejects(&env, "2024-01-01", 200_000, 500);
    env.tidemark(&["run", "p", "--period", "2024-01-02"])
        .expect_code(0, "a small day creates the table");
    let args = ["run", "p", "--period", "2024-01-01", "--lease-ttl", "3s"];
    let holder = env.spawn(&args);
    first_batch_committed(&env).await;
    // Hold the holder's next batch at its reject (after its rows), stop it
    // there, then let the table go: the statement completes and the
    // session sits idle inside the batch transaction.
    let mut locker = sqlx::PgConnection::connect(&env.db.url())
        .await
        .expect("connect");
    let mut lock = locker.begin().await.expect("begin");
    sqlx::query("LOCK TABLE _tm_rejects IN ACCESS EXCLUSIVE MODE")
        .execute(&mut *lock)
        .await
        .expect("lock the rejects table");
    tokio::time::sleep(Duration::from_secs(1)).await;
    holder.signal("STOP");
    lock.rollback().await.expect("release the table");
    let started = Instant::now();
    let taken = loop {
        let out = env.spawn(&args).finish(Duration::from_secs(40));
        if out.code == Some(0) {
            break out;
        }
        out.expect_code(
            75,
            "held while the stopped holder's row is locked or its lease live",
        );
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the stopped holder's row was never freed\n{out}"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    holder.signal("CONT");
    let _ = holder.kill9();
    assert!(taken.stderr.contains("run done"), "{taken}");
    let rows = env
        .db
        .rows("SELECT status FROM _tm_runs WHERE period_start LIKE '2024-01-01%'")
        .await;
    assert_eq!(rows, vec![vec![Some("done".to_string())]]);
    assert_eq!(env.db.count("FROM p").await, 200_010 - 400);
}

/// A run that reads a slow source for longer than its lease keeps it: the
/// renewing task starts when the first renewal is due (a third of the
/// lease after the claim, ADR 0022), so a second run answers held, and the
/// first ends done on attempt 1.
async fn slow_source_keeps_its_lease(backend: Backend) {
    let env = Env::new(backend).await;
    pipeline_p(&env);
    let fifo = FifoWriter::create(&env.path("data/2024-01-05.csv"));
    let args = ["run", "p", "--period", "2024-01-05", "--lease-ttl", "3s"];
    let holder = env.spawn(&args);
    fifo.write("id,v\na,1\n");
    // More than two leases, with the period claimed and its source open.
    tokio::time::sleep(Duration::from_secs(7)).await;
    env.spawn(&args)
        .finish(Duration::from_secs(10))
        .expect_code(75, "a second run while the first still reads its source");
    fifo.write("b,2\n");
    fifo.close(Duration::from_secs(10));
    holder
        .finish(Duration::from_secs(30))
        .expect_code(0, "the holder ends done");
    let runs = env
        .db
        .rows(
            "SELECT CAST(attempt AS TEXT), status FROM _tm_runs
             WHERE period_start LIKE '2024-01-05%'",
        )
        .await;
    assert_eq!(
        runs,
        vec![vec![Some("1".to_string()), Some("done".to_string())]],
        "one attempt, never taken over"
    );
    let rows = env.db.rows("SELECT CAST(COUNT(*) AS TEXT) FROM p").await;
    assert_eq!(rows[0][0].as_deref(), Some("2"), "both rows loaded");
}

#[tokio::test]
async fn slow_source_keeps_its_lease_sqlite() {
    slow_source_keeps_its_lease(Backend::Sqlite).await;
}

#[tokio::test]
async fn slow_source_keeps_its_lease_postgres() {
    slow_source_keeps_its_lease(Backend::Postgres).await;
}
