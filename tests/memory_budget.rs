//! Issue 13: a period whose stored rows exceed `load.memory_budget` is
//! compared through a sorted temporary file instead of memory (ADR 0007).
//! The budget is set deliberately tiny here, so a few hundred rows take
//! that path in CI; it must be exactly as correct as the in-memory one.

use std::fs;
use std::time::Duration;

use serde_json::Value as Json;

use crate::support::{backend_tests, Backend, Env, FifoWriter};

backend_tests! {
    over_the_budget_a_resync_is_exactly_the_in_memory_one: over_the_budget_a_resync_is_exactly_the_in_memory_one_sqlite, over_the_budget_a_resync_is_exactly_the_in_memory_one_postgres;
    over_the_budget_first_duplicates_win_as_in_memory: over_the_budget_first_duplicates_win_as_in_memory_sqlite, over_the_budget_first_duplicates_win_as_in_memory_postgres;
    kill_9_in_a_period_over_the_budget_resumes_to_the_same_end: kill_9_in_a_period_over_the_budget_resumes_to_the_same_end_sqlite, kill_9_in_a_period_over_the_budget_resumes_to_the_same_end_postgres;
    a_resync_over_the_budget_writes_exactly_what_changed: a_resync_over_the_budget_writes_exactly_what_changed_sqlite, a_resync_over_the_budget_writes_exactly_what_changed_postgres;
}

/// Pipeline `NAME` loading `data/YYYY-MM-DD.csv` (`id,n,note`) into table
/// `NAME`, with the given `[load]` extras.
fn pipeline(env: &Env, name: &str, load: &str) {
    env.write(
        format!("pipelines/{name}.toml"),
        &format!(
            r#"name = "{name}"
export_type = "{name}_export"
[period]
granularity = "day"
timezone = "UTC"
[[sources]]
id = "files"
transport = "file"
format = "csv"
path = "data/{{period.start:%Y-%m-%d}}.csv"
[fields]
id = {{ type = "text", required = true }}
n = {{ type = "int" }}
note = {{ type = "text" }}
[load]
table = "{name}"
key = ["id"]
on_missing = "delete"
max_delete_fraction = 1.0
{load}
"#
        ),
    );
}

type Rows = Vec<(String, String, String)>;

fn csv(rows: &Rows) -> String {
    let mut text = String::from("id,n,note\n");
    for (id, n, note) in rows {
        text.push_str(&format!("{id},{n},{note}\n"));
    }
    text
}

fn first_version(count: usize) -> Rows {
    (0..count)
        .map(|i| (format!("K{i:04}"), i.to_string(), "v1".to_string()))
        .collect()
}

/// Every 10th row changed, every 25th deleted, 20 new keys, then five keys
/// again at the end (in later batches): three with other values, two the
/// same as their first occurrence.
fn second_version(first: &Rows) -> Rows {
    let mut rows: Rows = Vec::new();
    for (i, (id, n, note)) in first.iter().enumerate() {
        if i % 25 == 3 {
            continue;
        }
        if i % 10 == 0 {
            rows.push((id.clone(), format!("{}", 1000 + i), "v2".into()));
        } else {
            rows.push((id.clone(), n.clone(), note.clone()));
        }
    }
    for i in 0..20 {
        rows.push((format!("N{i:04}"), i.to_string(), "new".into()));
    }
    for (i, id) in ["K0001", "K0002", "K0005"].iter().enumerate() {
        rows.push(((*id).to_string(), format!("{}", 5000 + i), "dup".into()));
    }
    for id in ["K0010", "K0020"] {
        let again = rows
            .iter()
            .find(|r| r.0 == id)
            .cloned()
            .expect("changed row");
        rows.push(again);
    }
    rows
}

/// The table a load of `rows` must leave: one row per key, the first or
/// last occurrence winning.
fn expected(rows: &Rows, last_wins: bool) -> Rows {
    let mut by_key = std::collections::BTreeMap::new();
    for row in rows {
        if last_wins || !by_key.contains_key(&row.0) {
            by_key.insert(row.0.clone(), row.clone());
        }
    }
    by_key.into_values().collect()
}

async fn table(env: &Env, name: &str) -> Rows {
    env.db
        .select(&["id", "n", "note"], &format!("FROM {name} ORDER BY id"))
        .await
        .into_iter()
        .map(|r| {
            let text = |i: usize| r[i].clone().unwrap_or_default();
            (text(0), text(1), text(2))
        })
        .collect()
}

async fn run_ids(env: &Env, name: &str) -> Vec<Option<String>> {
    env.db
        .select(&["_tm_run_id"], &format!("FROM {name} ORDER BY id"))
        .await
        .into_iter()
        .map(|mut r| r.remove(0))
        .collect()
}

const COUNTS: [&str; 7] = [
    "rows_read",
    "rows_inserted",
    "rows_updated",
    "rows_unchanged",
    "rows_deleted",
    "rows_rejected",
    "rows_superseded",
];

fn counts(result: &Json) -> Vec<u64> {
    COUNTS
        .iter()
        .map(|c| {
            result
                .get(*c)
                .and_then(Json::as_u64)
                .unwrap_or_else(|| panic!("no {c} in {result}"))
        })
        .collect()
}

/// Runs `pipeline` for the day and returns its result; with the debug log
/// of the load stage, to see which path the stored hashes took.
fn run(env: &Env, pipeline: &str, force: bool) -> (Json, String) {
    let mut args = vec!["run", pipeline, "--period", "2024-01-01"];
    if force {
        args.push("--force");
    }
    let out = env.tidemark_env(&[("TIDEMARK_LOG", "info,tidemark_load=debug")], &args);
    out.expect_code(0, pipeline);
    (out.json(), out.stderr)
}

/// The same loads through a pipeline with the default budget (`roomy`) and
/// one with a 1 KiB budget (`tiny`, about 25 stored rows): first load,
/// re-sync with changes, deletes, new keys and duplicates across batches,
/// then an unchanged re-sync. Tables and counts agree, and equal the source.
async fn budget_scenario(backend: Backend, policy: &str) {
    let env = Env::new(backend).await;
    let load = format!("batch_size = 40\non_duplicate_key = \"{policy}\"");
    pipeline(&env, "roomy", &load);
    pipeline(&env, "tiny", &format!("{load}\nmemory_budget = \"1KiB\""));
    let v1 = first_version(300);
    env.write("pipelines/data/2024-01-01.csv", &csv(&v1));
    for name in ["roomy", "tiny"] {
        let (result, _) = run(&env, name, false);
        assert_eq!(counts(&result)[1], 300, "{name} first load: {result}");
    }

    let v2 = second_version(&v1);
    env.write("pipelines/data/2024-01-01.csv", &csv(&v2));
    let want = expected(&v2, policy == "last");
    let (roomy, roomy_log) = run(&env, "roomy", true);
    let (tiny, tiny_log) = run(&env, "tiny", true);
    assert!(roomy_log.contains("spilled=false"), "{roomy_log}");
    assert!(
        tiny_log.contains("spilled=true"),
        "the tiny budget spills\n{tiny_log}"
    );
    assert_eq!(table(&env, "roomy").await, want, "in memory");
    assert_eq!(table(&env, "tiny").await, want, "over the budget");
    assert_eq!(counts(&tiny), counts(&roomy), "tiny {tiny}\nroomy {roomy}");
    let c = counts(&tiny);
    assert_eq!((c[1], c[4]), (20, 12), "20 inserted, 12 deleted: {tiny}");
    // Each of the re-syncs' batches remembered the keys it saw unchanged;
    // finishing deleted them.
    assert_eq!(
        env.db.count("FROM _tm_batches").await,
        0,
        "finished runs leave no batch rows"
    );

    // Unchanged (the export as the table now holds it, without the
    // duplicates, which "last" would write twice each time): nothing is
    // written on either path.
    env.write("pipelines/data/2024-01-01.csv", &csv(&want));
    let before = run_ids(&env, "tiny").await;
    let (roomy, _) = run(&env, "roomy", true);
    let (tiny, _) = run(&env, "tiny", true);
    assert_eq!(counts(&tiny), counts(&roomy), "unchanged re-sync");
    let c = counts(&tiny);
    assert_eq!(
        (c[1], c[2], c[4]),
        (0, 0, 0),
        "an unchanged re-sync writes nothing: {tiny}"
    );
    assert_eq!(run_ids(&env, "tiny").await, before, "rows not rewritten");
}

async fn over_the_budget_a_resync_is_exactly_the_in_memory_one(backend: Backend) {
    budget_scenario(backend, "last").await;
}

async fn over_the_budget_first_duplicates_win_as_in_memory(backend: Backend) {
    budget_scenario(backend, "first").await;
}

/// `kill -9` in the middle of a forced re-sync whose stored rows went to
/// the file: the next run takes the dead holder's key over, resumes from
/// the checkpoint and ends with exactly the source's rows.
async fn kill_9_in_a_period_over_the_budget_resumes_to_the_same_end(backend: Backend) {
    let env = Env::new(backend).await;
    pipeline(&env, "tiny", "batch_size = 10\nmemory_budget = \"1KiB\"");
    let path = env.path("pipelines/data/2024-01-01.csv");
    let v1 = first_version(120);
    env.write("pipelines/data/2024-01-01.csv", &csv(&v1));
    run(&env, "tiny", false);

    let v2 = second_version(&v1);
    let export = csv(&v2);
    let fifo = FifoWriter::create(&path);
    let killed = env.spawn(&["run", "tiny", "--period", "2024-01-01", "--force"]);
    let lines: Vec<&str> = export.lines().collect();
    fifo.write(&(lines[..36].join("\n") + "\n"));
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let batches = env.db.select(&["batches", "status"], "FROM _tm_runs").await;
        if batches
            .first()
            .is_some_and(|r| r[0].as_deref() == Some("3") && r[1].as_deref() == Some("running"))
        {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "three batches were not committed: {batches:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    killed.kill9();
    drop(fifo);
    fs::remove_file(&path).expect("remove the FIFO");
    fs::write(&path, &export).expect("the whole export");

    let (result, log) = run(&env, "tiny", false);
    assert!(log.contains("spilled=true"), "{log}");
    assert_eq!(table(&env, "tiny").await, expected(&v2, true), "{result}");
    let entry = env.status_of("tiny", "2024-01-01").expect("in the ledger");
    assert_eq!(entry["status"], "done", "{entry}");
    assert_eq!(
        entry["attempts"], 3,
        "first load, killed re-sync, resume: {entry}"
    );
    let c = counts(&result);
    assert_eq!((c[1], c[4]), (20, 5), "20 inserted, 5 deleted: {result}");
}

/// A period far larger than the budget (20,000 rows, 64 KiB: about 1,600
/// rows in memory), re-synced: unchanged, nothing is written; after a few
/// rows were updated, deleted and added upstream (one of them in the middle
/// of the export, so a key misses the stored order's cursor), exactly
/// those. On SQLite the stored rows are read while the run compares
/// (ADR 0021, "Overlapping the stored scan").
async fn a_resync_over_the_budget_writes_exactly_what_changed(backend: Backend) {
    let env = Env::new(backend).await;
    pipeline(&env, "big", "batch_size = 1000\nmemory_budget = \"64KiB\"");
    let n = 20_000;
    let v1: Rows = (0..n)
        .map(|i| (format!("K{i:05}"), i.to_string(), "v1".to_string()))
        .collect();
    env.write("pipelines/data/2024-01-01.csv", &csv(&v1));
    let (first, _) = run(&env, "big", false);
    assert_eq!(counts(&first)[1], 20_000, "first load: {first}");

    let before = run_ids(&env, "big").await;
    let (unchanged, log) = run(&env, "big", true);
    assert!(log.contains("spilled=true"), "{log}");
    if backend == Backend::Sqlite {
        assert!(
            log.contains("comparing while the stored rows are read"),
            "{log}"
        );
    }
    let c = counts(&unchanged);
    assert_eq!(
        (c[0], c[1], c[2], c[3], c[4]),
        (20_000, 0, 0, 20_000, 0),
        "an unchanged re-sync writes nothing: {unchanged}"
    );
    assert_eq!(run_ids(&env, "big").await, before, "rows not rewritten");

    let updated = [3, 7, 5_000, 12_345, 19_999];
    let deleted = [10, 8_191, 8_192, 15_000];
    let mut v2: Rows = Vec::new();
    for (i, (id, k, note)) in v1.iter().enumerate() {
        if deleted.contains(&i) {
            continue;
        }
        if updated.contains(&i) {
            v2.push((id.clone(), k.clone(), "v2".into()));
        } else {
            v2.push((id.clone(), k.clone(), note.clone()));
        }
        if i == 9_000 {
            v2.push(("N1".into(), "1".into(), "new".into()));
        }
    }
    v2.push(("N2".into(), "2".into(), "new".into()));
    v2.push(("N3".into(), "3".into(), "new".into()));
    env.write("pipelines/data/2024-01-01.csv", &csv(&v2));
    let (changed, log) = run(&env, "big", true);
    assert!(log.contains("spilled=true"), "{log}");
    let c = counts(&changed);
    assert_eq!(
        (c[0], c[1], c[2], c[3], c[4]),
        (20_000 - 4 + 3, 3, 5, 20_000 - 4 - 5, 4),
        "3 inserted, 5 updated, 4 deleted: {changed}"
    );
    assert_eq!(table(&env, "big").await, expected(&v2, true));

    // Unchanged again; the row added in the middle is now stored last.
    let before = run_ids(&env, "big").await;
    let (again, _) = run(&env, "big", true);
    let c = counts(&again);
    assert_eq!(
        (c[1], c[2], c[3], c[4]),
        (0, 0, 20_000 - 4 + 3, 0),
        "{again}"
    );
    assert_eq!(run_ids(&env, "big").await, before, "rows not rewritten");
}
