//! Issue 11, its last two items: source drift and completeness. A CSV
//! header that lost a column `[fields]` reads is a `contract` error before
//! anything of the period is written; a JSON batch in which a field is
//! absent from every record is warned about; a source that declares its
//! total (`expect_count`) and returns another number of records fails the
//! period as `incomplete`, reconciling nothing. Every scenario runs the
//! real binary on SQLite and PostgreSQL.

mod completeness;

use serde_json::Value as Json;

use crate::hardening_extract::{ledger, write_pipeline};
use crate::support::{backend_tests, Backend, Env};

backend_tests! {
    renamed_csv_column_fails_with_contract_and_keeps_the_period: renamed_csv_column_fails_with_contract_and_keeps_the_period_sqlite, renamed_csv_column_fails_with_contract_and_keeps_the_period_postgres;
    ndjson_batch_lacking_a_field_in_every_record_warns_and_runs: ndjson_batch_lacking_a_field_in_every_record_warns_and_runs_sqlite, ndjson_batch_lacking_a_field_in_every_record_warns_and_runs_postgres;
}

const DAY: &str = "2024-01-01";

/// Every row of `table` with its load time: `id, amount, note, _tm_loaded_at`.
async fn rows(env: &Env, table: &str) -> Vec<Vec<Option<String>>> {
    env.db
        .select(
            &["id", "amount", "note", "_tm_loaded_at"],
            &format!("FROM {table} ORDER BY id"),
        )
        .await
}

fn field<'a>(entry: &'a Json, key: &str) -> &'a Json {
    entry
        .get(key)
        .unwrap_or_else(|| panic!("no {key:?} in {entry}"))
}

/// A renamed upstream column (`amount` → `amount_eur`) on a forced
/// re-sync: exit 1, class `contract`, the file and the column named and
/// the header found shown; the period's rows keep their values and their
/// `_tm_loaded_at` (nothing was written, not even the unchanged `id`s),
/// and the run key is `failed`, not `done`. Two files in the glob, the
/// drifted one second: its header is read before the first file's rows.
async fn renamed_csv_column_fails_with_contract_and_keeps_the_period(backend: Backend) {
    let env = Env::new(backend).await;
    write_pipeline(
        &env,
        "shop",
        "transport = \"file\"\nformat = \"csv\"\npath = \"data/{period.start:%Y-%m-%d}/*.csv\"",
        "id = { type = \"int\", required = true }\n\
         amount = { type = \"decimal\", default = \"0\" }\n\
         note = { type = \"text\", from = \"remark\" }",
        "batch_size = 1\non_missing = \"delete\"",
    );
    env.write(
        "pipelines/data/2024-01-01/a.csv",
        "id,amount,remark\n1,1.50,x\n2,2.50,y\n",
    );
    env.write(
        "pipelines/data/2024-01-01/b.csv",
        "id,amount,remark\n3,3.50,z\n",
    );
    env.tidemark(&["run", "shop", "--period", DAY])
        .expect_code(0, "first load");
    let before = rows(&env, "shop").await;
    assert_eq!(before.len(), 3);

    // Upstream renames `amount` in the second file and `remark` too; the
    // first file changes values, which must not be written either.
    env.write(
        "pipelines/data/2024-01-01/a.csv",
        "id,amount,remark\n1,9.99,changed\n2,2.50,y\n",
    );
    env.write(
        "pipelines/data/2024-01-01/b.csv",
        "id,amount_eur,comment\n3,3.50,z\n",
    );
    let out = env.tidemark(&["run", "shop", "--period", DAY, "--force"]);
    out.expect_code(1, "drift on a forced re-sync");
    assert!(out.stderr.contains("contract error"), "{out}");
    assert!(out.stderr.contains("b.csv"), "names the file\n{out}");
    assert!(
        out.stderr
            .contains("lacks the columns `amount`, `remark` (fields.note.from)"),
        "names the columns\n{out}"
    );
    assert!(
        out.stderr.contains("\"id\", \"amount_eur\", \"comment\""),
        "shows the header found\n{out}"
    );
    assert_eq!(rows(&env, "shop").await, before, "the period is untouched");

    let entry = ledger(&env, "shop", DAY);
    assert_eq!(entry["status"], "failed", "{entry}");
    assert_eq!(entry["error_class"], "contract", "{entry}");
    assert!(
        field(&entry, "error_message")
            .as_str()
            .is_some_and(|m| m.contains("b.csv") && m.contains("`amount`")),
        "{entry}"
    );

    // Pointing `from` at the new names repairs it.
    env.edit_pipeline("shop", |t| {
        t.replace(
            "default = \"0\" }",
            "default = \"0\", from = \"amount_eur\" }",
        )
    });
    env.write(
        "pipelines/data/2024-01-01/a.csv",
        "id,amount_eur,comment\n1,9.99,changed\n2,2.50,y\n",
    );
    env.edit_pipeline("shop", |t| {
        t.replace("from = \"remark\"", "from = \"comment\"")
    });
    env.tidemark(&["run", "shop", "--period", DAY, "--force"])
        .expect_code(0, "repaired");
    let after = rows(&env, "shop").await;
    assert_eq!(
        after[0][1].as_deref().map(crate::support::norm_decimal),
        Some("9.99".into())
    );
    assert_eq!(after[0][2].as_deref(), Some("changed"));
}

/// An NDJSON batch whose records all lack `note` (not required): one
/// warning naming the field, the source and the batch's records, and the
/// run is done; a batch where one record has it is not warned about.
async fn ndjson_batch_lacking_a_field_in_every_record_warns_and_runs(backend: Backend) {
    let env = Env::new(backend).await;
    write_pipeline(
        &env,
        "feed",
        "transport = \"file\"\nformat = \"ndjson\"\npath = \"data/{period.start:%Y-%m-%d}.ndjson\"",
        "id = { type = \"int\", required = true }\n\
         amount = { type = \"decimal\" }\n\
         note = { type = \"text\" }",
        "batch_size = 2",
    );
    // Batch 1 (records 1-2): `note` absent from both; batch 2 (3-4): one has it.
    env.write(
        "pipelines/data/2024-01-01.ndjson",
        "{\"id\":1,\"amount\":1}\n{\"id\":2,\"amount\":2}\n\
         {\"id\":3,\"amount\":3}\n{\"id\":4,\"amount\":4,\"note\":\"n\"}\n",
    );
    let out = env.tidemark(&["run", "feed", "--period", DAY]);
    out.expect_code(0, "a warning, not a failure");
    let warnings: Vec<&str> = out
        .stderr
        .lines()
        .filter(|l| l.contains("absent from every record"))
        .collect();
    assert_eq!(warnings.len(), 1, "once, for the first batch only\n{out}");
    let warning = warnings[0];
    for part in [
        "WARN",
        "`note`",
        "first=pipelines/data/2024-01-01.ndjson row 1",
        "last=pipelines/data/2024-01-01.ndjson row 2",
        "source=src",
        "pipeline=feed",
    ] {
        assert!(warning.contains(part), "{part:?} in {warning}");
    }
    assert!(!warning.contains("`amount`"), "{warning}");
    let entry = ledger(&env, "feed", DAY);
    assert_eq!(entry["status"], "done", "{entry}");
    assert_eq!(entry["rows_read"], 4, "{entry}");
}
