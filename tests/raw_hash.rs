//! The raw-record hash (ADR 0021, "The raw-record hash"): a re-sync skips
//! typing a record whose raw bytes are those of the stored row, under the
//! same configuration. It must never hide a change: a configuration that
//! types differently rewrites what it changes, a table created before the
//! column gets it and re-syncs exactly, and the counts stay exact.

use serde_json::Value as Json;

use crate::support::{backend_tests, Backend, Env};

backend_tests! {
    a_config_change_that_types_differently_rewrites_what_it_changes: a_config_change_that_types_differently_rewrites_what_it_changes_sqlite, a_config_change_that_types_differently_rewrites_what_it_changes_postgres;
    a_table_created_before_the_raw_hash_is_evolved_and_resyncs_exactly: a_table_created_before_the_raw_hash_is_evolved_and_resyncs_exactly_sqlite, a_table_created_before_the_raw_hash_is_evolved_and_resyncs_exactly_postgres;
}

/// Pipeline `t` loading `data/2024-01-01.csv` (`id,n,note`), in batches of
/// 10 so that most batches are prepared once the writer knows the stored
/// rows; `note` has the given default.
fn pipeline(env: &Env, note_default: &str) {
    env.write(
        "pipelines/t.toml",
        &format!(
            r#"name = "t"
export_type = "t_export"
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
note = {{ type = "text", default = "{note_default}" }}
[load]
table = "t"
key = ["id"]
batch_size = 10
on_missing = "delete"
max_delete_fraction = 1.0
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

/// 100 rows; every 7th has an empty note (it takes the default).
fn first_version() -> Rows {
    (0..100)
        .map(|i| {
            let note = if i % 7 == 0 {
                String::new()
            } else {
                format!("v{i}")
            };
            (format!("K{i:03}"), i.to_string(), note)
        })
        .collect()
}

const COUNTS: [&str; 5] = [
    "rows_read",
    "rows_inserted",
    "rows_updated",
    "rows_unchanged",
    "rows_deleted",
];

fn counts(result: &Json) -> [u64; 5] {
    COUNTS.map(|c| {
        result
            .get(c)
            .and_then(Json::as_u64)
            .unwrap_or_else(|| panic!("no {c} in {result}"))
    })
}

/// A forced run of the day: its result and debug log.
fn resync(env: &Env) -> (Json, String) {
    let out = env.tidemark_env(
        &[("TIDEMARK_LOG", "info,tidemark_engine=debug")],
        &["run", "t", "--period", "2024-01-01", "--force"],
    );
    out.expect_code(0, "t");
    (out.json(), out.stderr)
}

async fn table(env: &Env) -> Vec<Vec<Option<String>>> {
    env.db
        .select(&["id", "n", "note"], "FROM t ORDER BY id")
        .await
}

async fn run_ids(env: &Env) -> Vec<Option<String>> {
    env.db
        .select(&["_tm_run_id"], "FROM t ORDER BY id")
        .await
        .into_iter()
        .map(|mut r| r.remove(0))
        .collect()
}

/// How many records a run found unchanged by their raw hash (the debug
/// lines of the shortcut, summed).
fn raw_unchanged(log: &str) -> u64 {
    log.lines()
        .filter(|l| l.contains("raw records compared"))
        .filter_map(|l| {
            let at = l.find(" unchanged=")? + " unchanged=".len();
            let digits: String = l[at..].chars().take_while(char::is_ascii_digit).collect();
            digits.parse::<u64>().ok()
        })
        .sum()
}

/// (a) and (c): an unchanged re-sync takes the shortcut and writes nothing;
/// records whose raw bytes changed but not their typed values are not
/// written; real changes are, with exact counts; a changed `default` (the
/// same raw bytes, typed differently) rewrites exactly the rows it changes.
async fn a_config_change_that_types_differently_rewrites_what_it_changes(backend: Backend) {
    let env = Env::new(backend).await;
    pipeline(&env, "none");
    let v1 = first_version();
    env.write("pipelines/data/2024-01-01.csv", &csv(&v1));
    let (first, _) = resync(&env);
    assert_eq!(counts(&first), [100, 100, 0, 0, 0], "{first}");
    assert_eq!(
        env.db.count("FROM t WHERE _tm_raw_hash IS NULL").await,
        0,
        "every written row has its raw hash"
    );

    // Unchanged: most records skip typing, nothing is written.
    let before = run_ids(&env).await;
    let (unchanged, log) = resync(&env);
    assert_eq!(counts(&unchanged), [100, 0, 0, 100, 0], "{unchanged}");
    assert!(raw_unchanged(&log) >= 50, "the shortcut was taken\n{log}");
    assert_eq!(run_ids(&env).await, before, "rows not rewritten");

    // Raw bytes changed but not the typed value (`n` with spaces), real
    // changes, a deleted and a new key.
    let mut v2 = v1.clone();
    v2[15].1 = " 15 ".into();
    v2[40].1 = "4000".into();
    v2[60].2 = "changed".into();
    v2.remove(80);
    v2.push(("K999".into(), "999".into(), "new".into()));
    env.write("pipelines/data/2024-01-01.csv", &csv(&v2));
    let (mutated, log) = resync(&env);
    assert_eq!(counts(&mutated), [100, 1, 2, 97, 1], "{mutated}");
    assert!(raw_unchanged(&log) > 0, "{log}");
    let rows = table(&env).await;
    assert_eq!(rows.len(), 100);
    let row = |id: &str| rows.iter().find(|r| r[0].as_deref() == Some(id)).cloned();
    assert_eq!(row("K040").unwrap()[1].as_deref(), Some("4000"));
    assert_eq!(row("K060").unwrap()[2].as_deref(), Some("changed"));
    assert_eq!(row("K015").unwrap()[1].as_deref(), Some("15"));
    assert!(row("K080").is_none());

    // The same export again: the row whose raw bytes changed without a
    // typed change kept its old raw hash, so it is typed, and still not
    // written; the rest take the shortcut.
    let before = run_ids(&env).await;
    let (again, _) = resync(&env);
    assert_eq!(counts(&again), [100, 0, 0, 100, 0], "{again}");
    assert_eq!(run_ids(&env).await, before, "rows not rewritten");

    // A new default: the same raw records now type differently where the
    // note is empty. Every such row is rewritten; no other.
    pipeline(&env, "other");
    let (changed, log) = resync(&env);
    let empty = v2.iter().filter(|r| r.2.is_empty()).count() as u64;
    assert!(empty >= 10, "{empty}");
    assert_eq!(
        counts(&changed),
        [100, 0, empty, 100 - empty, 0],
        "{changed}"
    );
    assert_eq!(
        raw_unchanged(&log),
        0,
        "no raw hash matches a new plan\n{log}"
    );
    let defaulted = env.db.count("FROM t WHERE note = 'other'").await;
    assert_eq!(defaulted, i64::try_from(empty).unwrap());
    assert_eq!(env.db.count("FROM t WHERE note = 'none'").await, 0);

    // And under the new plan the shortcut works again for rewritten rows.
    let (settled, log) = resync(&env);
    assert_eq!(counts(&settled), [100, 0, 0, 100, 0], "{settled}");
    assert!(raw_unchanged(&log) > 0, "{log}");
}

/// (b): a table written before the raw-hash column existed (the column
/// dropped here) gets it back; its rows hold NULL, which takes no
/// shortcut: the re-sync types everything and writes nothing unchanged;
/// changed rows are written with their raw hash, and take the shortcut
/// from then on.
async fn a_table_created_before_the_raw_hash_is_evolved_and_resyncs_exactly(backend: Backend) {
    let env = Env::new(backend).await;
    pipeline(&env, "none");
    let v1 = first_version();
    env.write("pipelines/data/2024-01-01.csv", &csv(&v1));
    resync(&env);
    env.db
        .execute("ALTER TABLE t DROP COLUMN _tm_raw_hash")
        .await;

    let before = run_ids(&env).await;
    let (unchanged, log) = resync(&env);
    assert_eq!(counts(&unchanged), [100, 0, 0, 100, 0], "{unchanged}");
    assert_eq!(raw_unchanged(&log), 0, "NULL takes no shortcut\n{log}");
    assert_eq!(run_ids(&env).await, before, "rows not rewritten");
    assert_eq!(
        env.db.count("FROM t WHERE _tm_raw_hash IS NULL").await,
        100,
        "the column is back, NULL for rows not written since"
    );

    let mut v2 = v1.clone();
    for i in [5, 25, 45, 65, 85] {
        v2[i].2 = format!("w{i}");
    }
    env.write("pipelines/data/2024-01-01.csv", &csv(&v2));
    let (mutated, _) = resync(&env);
    assert_eq!(counts(&mutated), [100, 0, 5, 95, 0], "{mutated}");
    assert_eq!(
        env.db.count("FROM t WHERE _tm_raw_hash IS NOT NULL").await,
        5,
        "written rows carry their raw hash"
    );

    let (again, _) = resync(&env);
    assert_eq!(counts(&again), [100, 0, 0, 100, 0], "{again}");
    assert_eq!(
        table(&env)
            .await
            .iter()
            .filter(|r| r[2].as_deref().is_some_and(|n| n.starts_with('w')))
            .count(),
        5
    );
}
