//! Dry runs: one line per run key with what the command would do and why,
//! reading no source and writing nothing (no SQLite file created), and
//! agreeing with what the real command then does.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde_json::Value as Json;

use super::{at, csv, day_file, day_path, ledger, shop, text, FIELDS};
use crate::support::{backend_tests, Backend, Env, FifoWriter, TestDb};

backend_tests! {
    dry_run_changes_nothing_and_agrees_with_the_real_backfill: dry_run_changes_nothing_and_agrees_with_the_real_backfill_sqlite, dry_run_changes_nothing_and_agrees_with_the_real_backfill_postgres;
    dry_run_of_a_new_database_creates_nothing_and_every_key_is_new: dry_run_of_a_new_database_creates_nothing_and_every_key_is_new_sqlite, dry_run_of_a_new_database_creates_nothing_and_every_key_is_new_postgres;
}

const DAYS: [&str; 6] = [
    "2024-01-01",
    "2024-01-02",
    "2024-01-03",
    "2024-01-04",
    "2024-01-05",
    "2024-01-06",
];

fn rows_of(day: usize) -> Vec<(i64, &'static str, &'static str)> {
    let base = i64::try_from(day).unwrap() * 10;
    vec![
        (base + 1, "1.5", ""),
        (base + 2, "2.5", ""),
        (base + 3, "3.5", ""),
        (base + 4, "4.5", ""),
    ]
}

/// Everything a dry run could change: on SQLite the bytes of the database
/// and its WAL (read before anything else opens the file: closing a
/// writable connection checkpoints), on PostgreSQL the table's row count
/// and newest `_tm_loaded_at`, and every ledger row and attempt.
async fn snapshot(db: &TestDb) -> Vec<String> {
    match db {
        TestDb::Sqlite { path } => ["", "-wal"]
            .iter()
            .map(|suffix| {
                let file = format!("{}{suffix}", path.display());
                let bytes = std::fs::read(&file).unwrap_or_default();
                format!("{file}: {} bytes, {:x}", bytes.len(), md5ish(&bytes))
            })
            .collect(),
        TestDb::Postgres { .. } => {
            let mut state = Vec::new();
            for sql in [
                "SELECT CAST(COUNT(*) AS TEXT), CAST(MAX(_tm_loaded_at) AS TEXT) FROM shop",
                "SELECT CAST(COUNT(*) AS TEXT), CAST(MAX(finished_at) AS TEXT) FROM _tm_attempts",
                "SELECT CAST(id AS TEXT), status, CAST(attempt AS TEXT), CAST(batches AS TEXT), CAST(updated_at AS TEXT), CAST(checkpoint AS TEXT) FROM _tm_runs ORDER BY id",
            ] {
                state.push(format!("{:?}", db.rows(sql).await));
            }
            state
        }
    }
}

/// A cheap 64-bit digest (FNV-1a) of a file's bytes, for messages.
fn md5ish(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The dry run's lines (`PERIOD SOURCE ACTION: REASON`) by period.
fn dry_lines(out: &crate::support::Out) -> BTreeMap<String, (String, String)> {
    out.stdout
        .lines()
        .filter(|l| l.starts_with("20"))
        .map(|l| {
            let (head, reason) = l.split_once(": ").unwrap_or_else(|| panic!("{l}"));
            let mut parts = head.split(' ');
            let period = parts.next().unwrap().to_string();
            assert_eq!(parts.next(), Some("files"), "{l}");
            let action = parts.next().unwrap().to_string();
            (period, (action, reason.to_string()))
        })
        .collect()
}

/// The STATUS column of a backfill's summary, by period.
fn summary(out: &crate::support::Out) -> BTreeMap<String, String> {
    out.stdout
        .lines()
        .filter(|l| l.starts_with("20"))
        .map(|l| {
            let cols: Vec<&str> = l.split_whitespace().collect();
            (cols[0].to_string(), cols[2].to_string())
        })
        .collect()
}

/// What the real command reports for a key the dry run gave `action`.
fn expected_status(action: &str) -> &'static str {
    match action {
        "skip" => "skipped",
        "run" | "re-run" | "resume" => "done",
        "held" => "held",
        other => panic!("unknown dry-run action {other}"),
    }
}

async fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !done() {
        assert!(Instant::now() < deadline, "{what} did not happen in time");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn dry_run_changes_nothing_and_agrees_with_the_real_backfill(backend: Backend) {
    let env = Env::new(backend).await;
    shop(&env, FIELDS);
    for (i, day) in DAYS.iter().enumerate() {
        day_file(&env, day, &rows_of(i + 1));
    }
    // Day 1 done; day 2 failed (a bad amount), then its file mended.
    env.tidemark(&["run", "shop", "--period", DAYS[0]])
        .expect_code(0, "day 1");
    day_file(&env, DAYS[1], &[(21, "x", "")]);
    env.tidemark(&["run", "shop", "--period", DAYS[1]])
        .expect_code(1, "day 2 fails");
    day_file(&env, DAYS[1], &rows_of(2));
    // Day 4: killed after committing its first batch of 2 rows.
    let path = env.path(day_path(DAYS[3]));
    let fifo = FifoWriter::create(&path);
    let run = env.spawn(&["run", "shop", "--period", DAYS[3]]);
    fifo.write(&csv(&rows_of(4)[..3]));
    let batches = format!(
        "FROM _tm_runs WHERE period_start LIKE '{}%' AND batches = 1",
        DAYS[3]
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    while !(env.db.table_exists("_tm_runs").await && env.db.count(&batches).await == 1) {
        assert!(Instant::now() < deadline, "day 4's first batch in time");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    run.kill9();
    drop(fifo);
    std::fs::remove_file(&path).expect("remove FIFO");
    day_file(&env, DAYS[3], &rows_of(4));
    // The killed run left its last batch in SQLite's WAL: a connection that
    // could write would checkpoint it into the database file on closing.

    // The dry run reads the ledger and changes nothing.
    let before = snapshot(&env.db).await;
    let dry = env.tidemark(&[
        "backfill",
        "shop",
        "--from",
        DAYS[0],
        "--to",
        DAYS[5],
        "--dry-run",
    ]);
    let after = snapshot(&env.db).await;
    dry.expect_code(0, "dry run");
    assert_eq!(before, after, "a dry run writes nothing\n{dry}");
    let lines = dry_lines(&dry);
    let action = |day: &str| lines[day].0.as_str();
    let reason = |day: &str| lines[day].1.as_str();
    assert_eq!(action(DAYS[0]), "skip", "{dry}");
    assert!(reason(DAYS[0]).starts_with("done at 20"), "{dry}");
    assert_eq!(
        lines[DAYS[1]],
        ("re-run".into(), "failed: validation".into())
    );
    assert_eq!(lines[DAYS[2]], ("run".into(), "new".into()));
    assert_eq!(lines[DAYS[3]], ("resume".into(), "from batch 2".into()));
    assert_eq!(lines[DAYS[4]], ("run".into(), "new".into()));
    assert!(
        dry.stdout.contains(
            "dry run: 6 run key(s): 3 run, 1 resume, 1 re-run, 1 skip, 0 held; nothing was read or written"
        ),
        "{dry}"
    );
    assert_eq!(
        env.db
            .count(&format!(
                "FROM _tm_runs WHERE period_start LIKE '{}%'",
                DAYS[2]
            ))
            .await,
        0,
        "no ledger row made for the new period"
    );

    // Day 5 is held by a live run waiting for its input.
    let path5 = env.path(day_path(DAYS[4]));
    let fifo5 = FifoWriter::create(&path5);
    let holder = env.spawn(&["run", "shop", "--period", DAYS[4]]);
    let pid = holder.pid();
    wait_until("day 5 running", || {
        ledger(&env)
            .get(DAYS[4])
            .is_some_and(|e| text(e, "status") == "running")
    })
    .await;
    let dry = at(
        &env,
        None,
        &[
            "--log-format",
            "json",
            "backfill",
            "shop",
            "--from",
            DAYS[0],
            "--to",
            DAYS[5],
            "--dry-run",
        ],
    );
    dry.expect_code(0, "dry run with a held key");
    let objects: Vec<Json> = dry.json_lines();
    let per_key: BTreeMap<String, (String, String)> = objects
        .iter()
        .filter(|o| o.get("period_start").is_some())
        .map(|o| {
            assert_eq!(text(o, "source"), "files");
            (
                text(o, "period_start")[..10].to_string(),
                (text(o, "action").to_string(), text(o, "reason").to_string()),
            )
        })
        .collect();
    assert_eq!(per_key.len(), 6, "{dry}");
    let (held, by) = &per_key[DAYS[4]];
    assert_eq!(held, "held", "{dry}");
    assert!(
        by.starts_with("by ") && by.contains(&format!(":{pid}:")) && by.contains(" until "),
        "{by}"
    );
    let summary_line = objects
        .iter()
        .find_map(|o| o.get("dry_run_summary"))
        .unwrap_or_else(|| panic!("a summary object\n{dry}"));
    assert_eq!(summary_line["held"], 1);

    // The real backfill does what the dry run said, key by key.
    let real = env.tidemark(&["backfill", "shop", "--from", DAYS[0], "--to", DAYS[5]]);
    real.expect_code(75, "backfill with one key held elsewhere");
    let done = summary(&real);
    for (day, (action, reason)) in &per_key {
        assert_eq!(
            done.get(day).map(String::as_str),
            Some(expected_status(action)),
            "{day}: the dry run said {action}: {reason}\n{real}"
        );
    }
    let resumed = env
        .db
        .rows(&format!(
            "SELECT CAST(a.resumed AS TEXT) FROM _tm_attempts a JOIN _tm_runs r ON r.id = a.run_ref
             WHERE r.period_start LIKE '{}%' ORDER BY a.attempt DESC",
            DAYS[3]
        ))
        .await;
    assert!(
        matches!(resumed[0][0].as_deref(), Some("1" | "true")),
        "day 4's new attempt resumed: {resumed:?}"
    );
    assert_eq!(
        env.db.count("FROM shop WHERE id BETWEEN 41 AND 44").await,
        4
    );

    fifo5.write(&csv(&rows_of(5)));
    fifo5.close(Duration::from_secs(30));
    holder
        .finish(Duration::from_secs(60))
        .expect_code(0, "the holder finishes");
}

async fn dry_run_of_a_new_database_creates_nothing_and_every_key_is_new(backend: Backend) {
    let env = Env::new(backend).await;
    shop(&env, FIELDS);
    // No source files at all: a dry run reads none.
    let now = Some("2024-01-03T03:00:00Z");
    for args in [
        vec![
            "backfill",
            "shop",
            "--from",
            "2024-01-01",
            "--to",
            "2024-01-02",
            "--dry-run",
        ],
        vec!["run", "shop", "--period", "2024-01-01", "--dry-run"],
        vec!["sync", "shop", "--dry-run"],
    ] {
        let out = at(&env, now, &args);
        out.expect_code(0, &args.join(" "));
        let lines = dry_lines(&out);
        assert!(!lines.is_empty(), "{out}");
        assert!(
            lines.values().all(|(a, r)| a == "run" && r == "new"),
            "every key is new\n{out}"
        );
        assert!(
            env.db.untouched().await,
            "{}: nothing created",
            args.join(" ")
        );
    }
    // sync's dry run lists the due periods, which the real sync then runs.
    let dry = dry_lines(&at(&env, now, &["sync", "shop", "--dry-run"]));
    assert_eq!(dry.keys().collect::<Vec<_>>(), ["2024-01-01", "2024-01-02"]);
    day_file(&env, "2024-01-01", &[(1, "1.5", "")]);
    day_file(&env, "2024-01-02", &[(2, "2.5", "")]);
    let real = at(&env, now, &["sync", "shop"]);
    real.expect_code(0, "sync");
    let ran: Vec<String> = summary(&real)
        .into_iter()
        .filter(|(_, status)| status == "done")
        .map(|(day, _)| day)
        .collect();
    assert_eq!(ran, ["2024-01-01", "2024-01-02"], "{real}");
}
