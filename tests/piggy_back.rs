//! The claim piggy-back (ADR 0022): a backfill worker claims its next key
//! in the transaction that finishes its current period. A stop must leave
//! no key leased that nobody runs: a key claimed that way but not started
//! is handed back at once, and the next command runs every period exactly
//! once. Real processes, a real signal, both databases.

use std::time::{Duration, Instant};

use crate::support::{backend_tests, Backend, Env};

backend_tests! {
    stopped_backfill_of_tiny_periods_leaves_no_key_leased: stopped_backfill_of_tiny_periods_leaves_no_key_leased_sqlite, stopped_backfill_of_tiny_periods_leaves_no_key_leased_postgres;
}

/// Days of the backfill: enough that the signal lands mid-way.
const DAYS: i64 = 1_200;

/// Rows of a day file: every period fits in one batch, the path that
/// finishes a period (and claims the next) in one transaction.
const ROWS: i64 = 3;

/// `p`: daily UTC periods from 2020-01-01, one CSV file a day.
fn tiny_days(env: &Env) {
    env.write(
        "pipelines/p.toml",
        r#"name = "p"
export_type = "days"
version = "1"

[period]
granularity = "day"
start = "2020-01-01"

[[sources]]
id = "a"
transport = "file"
format = "csv"
path = "../data/{period.start:%Y-%m-%d}.csv"

[fields]
id = { type = "text", required = true }
v = { type = "int" }

[load]
table = "p"
key = ["id"]
batch_size = 100
"#,
    );
    for day in days() {
        let mut text = "id,v\n".to_string();
        for i in 0..ROWS {
            text.push_str(&format!("{day}-{i},{i}\n"));
        }
        env.write(format!("data/{day}.csv"), &text);
    }
}

fn days() -> impl Iterator<Item = String> {
    let first = chrono::NaiveDate::from_ymd_opt(2020, 1, 1).expect("date");
    (0..DAYS).map(move |n| (first + chrono::Duration::days(n)).to_string())
}

/// A backfill of 1,200 one-batch days at concurrency 4, stopped by SIGTERM
/// once some are done: every worker either runs a key, or hands back the
/// one its last transaction claimed. Then no row is `running` (the stop is
/// graceful, so no lease is left to run out), and a second backfill does
/// every period not yet done, exactly once: the rows are the files', and
/// each run key has one `done` attempt whose rows were inserted once.
async fn stopped_backfill_of_tiny_periods_leaves_no_key_leased(backend: Backend) {
    let env = Env::new(backend).await;
    tiny_days(&env);
    env.tidemark(&["migrate"]).expect_code(0, "migrate");
    let last = days().last().expect("a day");
    let args = [
        "backfill",
        "p",
        "--from",
        "2020-01-01",
        "--to",
        &last,
        "--concurrency",
        "4",
    ];
    let first = env.spawn(&args);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let done = env.db.count("FROM _tm_runs WHERE status = 'done'").await;
        if done >= 100 {
            break;
        }
        assert!(Instant::now() < deadline, "{done} periods done in 60 s");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    first.signal("TERM");
    let out = first.finish(Duration::from_secs(30));
    out.expect_code(0, "a first SIGTERM exits 0");
    let running = env
        .db
        .count("FROM _tm_runs WHERE status = 'running' OR lease_owner IS NOT NULL")
        .await;
    assert_eq!(running, 0, "no key is left leased after the stop\n{out}");
    let done_first = env.db.count("FROM _tm_runs WHERE status = 'done'").await;
    assert!(
        done_first < DAYS,
        "the signal came after the backfill ended\n{out}"
    );

    let second = env.tidemark(&args);
    second.expect_code(0, "the second backfill");
    let total = DAYS * ROWS;
    assert_eq!(env.db.count("FROM p").await, total, "{second}");
    assert_eq!(
        env.db
            .count("FROM _tm_runs WHERE status = 'done' AND rows_inserted = 3 AND rows_updated = 0 AND rows_unchanged = 0")
            .await,
        DAYS,
        "each period inserted its rows once\n{second}"
    );
    assert_eq!(
        env.db
            .count("FROM _tm_attempts WHERE status = 'done'")
            .await,
        DAYS,
        "one done attempt a period\n{second}"
    );
    assert_eq!(
        env.db
            .count("FROM _tm_attempts WHERE status = 'running'")
            .await,
        0,
        "{second}"
    );
}
