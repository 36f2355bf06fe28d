//! The claim piggy-back (ADR 0022): a backfill worker claims its next key
//! in the transaction that finishes its current period. A stop must leave
//! no key leased that nobody runs: a key claimed that way but not started
//! is handed back at once, and the next command runs every period exactly
//! once. Real processes, a real signal, both databases.
//!
//! And the shared commit (ADR 0022, SQLite; PostgreSQL commits each period
//! at once and must pass the same tests): a period is reported done only
//! once what it wrote is on disk, and a period that fails inside a shared
//! transaction fails alone.

use std::time::{Duration, Instant};

use crate::support::{backend_tests, Backend, Env, Out};

backend_tests! {
    stopped_backfill_of_tiny_periods_leaves_no_key_leased: stopped_backfill_of_tiny_periods_leaves_no_key_leased_sqlite, stopped_backfill_of_tiny_periods_leaves_no_key_leased_postgres;
    a_period_reported_done_is_on_disk_when_the_process_dies: a_period_reported_done_is_on_disk_when_the_process_dies_sqlite, a_period_reported_done_is_on_disk_when_the_process_dies_postgres;
    a_period_failing_among_shared_ones_fails_alone: a_period_failing_among_shared_ones_fails_alone_sqlite, a_period_failing_among_shared_ones_fails_alone_postgres;
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
    every_day_loaded_once(&env, &second).await;
    assert_eq!(
        env.db
            .count("FROM _tm_attempts WHERE status = 'running'")
            .await,
        0,
        "{second}"
    );
}

/// Every day's rows are stored, each period inserted them once, and has
/// one `done` attempt (`out`: the last command, shown on failure).
async fn every_day_loaded_once(env: &Env, out: &Out) {
    assert_eq!(env.db.count("FROM p").await, DAYS * ROWS, "{out}");
    assert_eq!(
        env.db
            .count("FROM _tm_runs WHERE status = 'done' AND rows_inserted = 3 AND rows_updated = 0 AND rows_unchanged = 0")
            .await,
        DAYS,
        "each period inserted its rows once\n{out}"
    );
    assert_eq!(
        env.db
            .count("FROM _tm_attempts WHERE status = 'done'")
            .await,
        DAYS,
        "one done attempt a period\n{out}"
    );
}

/// The days a backfill's output reported `done` so far.
fn reported_done(stdout: &str) -> Vec<String> {
    stdout
        .lines()
        .filter_map(|line| {
            let mut words = line.split_whitespace();
            let period = words.next()?;
            let done = words.nth(1)? == "done";
            (done && chrono::NaiveDate::parse_from_str(period, "%Y-%m-%d").is_ok())
                .then(|| period.to_string())
        })
        .collect()
}

/// A backfill of tiny periods is frozen (`SIGSTOP`) as soon as its output
/// has reported 150 of them done, and the database is read while it
/// cannot commit anything more: every period reported done must be `done`
/// with its rows (a shared commit not yet made would show them missing).
/// Then `kill -9`, and the next backfill does the rest exactly once.
async fn a_period_reported_done_is_on_disk_when_the_process_dies(backend: Backend) {
    let env = Env::new(backend).await;
    tiny_days(&env);
    env.tidemark(&["migrate"]).expect_code(0, "migrate");
    let last = days().last().expect("a day");
    let args = ["backfill", "p", "--from", "2020-01-01", "--to", &last];
    let running = env.spawn(&args);
    let deadline = Instant::now() + Duration::from_secs(60);
    while reported_done(&running.output_so_far().stdout).len() < 150 {
        assert!(
            Instant::now() < deadline,
            "150 periods not reported in 60 s\n{}",
            running.output_so_far()
        );
        std::thread::sleep(Duration::from_millis(2));
    }
    running.signal("STOP");
    let reported = reported_done(&running.output_so_far().stdout);
    let reported_count = i64::try_from(reported.len()).expect("a count");
    assert!(
        reported_count < DAYS,
        "the backfill ended before it was frozen"
    );
    let done: std::collections::HashSet<String> = env
        .db
        .select(&["period_start"], "FROM _tm_runs WHERE status = 'done'")
        .await
        .into_iter()
        .filter_map(|row| row[0].clone())
        .map(|start| start[..10].to_string())
        .collect();
    let rows = env.db.count("FROM p").await;
    let missing: Vec<&String> = reported.iter().filter(|d| !done.contains(*d)).collect();
    assert!(
        missing.is_empty(),
        "{} of {} periods reported done are not done in the database: {missing:?}",
        missing.len(),
        reported.len()
    );
    assert!(
        rows >= reported_count * ROWS,
        "{rows} rows stored for {} periods reported done",
        reported.len()
    );
    running.kill9();

    let second = env.tidemark(&args);
    second.expect_code(0, "the backfill after the kill");
    every_day_loaded_once(&env, &second).await;
}

/// Sixty tiny days, three of which the destination refuses (a trigger
/// raises on one of their rows, inside the period's finishing
/// transaction): those periods fail and write nothing, and every other one
/// is done with its rows, including those that shared a commit with them.
/// No write waits on the shared transaction's lock (the command ends well
/// within SQLite's 60 s busy timeout).
async fn a_period_failing_among_shared_ones_fails_alone(backend: Backend) {
    let env = Env::new(backend).await;
    tiny_days(&env);
    // The first day creates the table the trigger goes on.
    env.tidemark(&["run", "p", "--period", "2020-01-01"])
        .expect_code(0, "the first day");
    const REFUSED: [&str; 3] = ["2020-01-03", "2020-01-20", "2020-02-10"];
    let refused = REFUSED.map(|day| format!("'{day}-1'")).join(", ");
    match backend {
        Backend::Sqlite => {
            env.db
                .execute(&format!(
                    "CREATE TRIGGER refuse BEFORE INSERT ON p WHEN NEW.id IN ({refused}) \
                     BEGIN SELECT RAISE(ABORT, 'refused by a trigger'); END"
                ))
                .await;
        }
        Backend::Postgres => {
            env.db
                .execute(&format!(
                    "CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS $$ \
                     BEGIN IF NEW.id IN ({refused}) THEN RAISE EXCEPTION 'refused by a trigger'; \
                     END IF; RETURN NEW; END $$"
                ))
                .await;
            env.db
                .execute(
                    "CREATE TRIGGER refuse BEFORE INSERT ON p FOR EACH ROW EXECUTE FUNCTION refuse()",
                )
                .await;
        }
    }
    let out = env.tidemark(&[
        "backfill",
        "p",
        "--from",
        "2020-01-01",
        "--to",
        "2020-02-29",
    ]);
    out.expect_code(1, "three periods failed");
    assert!(
        out.elapsed < Duration::from_secs(30),
        "a write waited on a lock: {:?}\n{out}",
        out.elapsed
    );
    let failed = env
        .db
        .select(
            &["period_start", "error_message"],
            "FROM _tm_runs WHERE status = 'failed' ORDER BY period_start",
        )
        .await;
    let days: Vec<String> = failed
        .iter()
        .map(|row| row[0].clone().unwrap_or_default()[..10].to_string())
        .collect();
    assert_eq!(days, REFUSED, "{failed:?}\n{out}");
    for row in &failed {
        let error = row[1].as_deref().unwrap_or_default();
        assert!(error.contains("refused by a trigger"), "{error}");
    }
    let done = env.db.count("FROM _tm_runs WHERE status = 'done'").await;
    assert_eq!(done, 57, "every other day is done\n{out}");
    assert_eq!(env.db.count("FROM p").await, 57 * ROWS, "{out}");
    for day in REFUSED {
        let rows = env
            .db
            .count(&format!("FROM p WHERE id LIKE '{day}-%'"))
            .await;
        assert_eq!(rows, 0, "the refused period {day} wrote nothing");
    }
}
