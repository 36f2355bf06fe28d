//! What each command needs and how it exits: a failed run never exits 0,
//! `validate` catches what a run would only meet later, and commands that
//! only read or tidy the ledger never need a source's secrets.

use crate::support::{backend_tests, Backend, Env};

backend_tests! {
    mid_run_config_error_fails_the_run_with_exit_1: mid_run_config_error_fails_the_run_with_exit_1_sqlite, mid_run_config_error_fails_the_run_with_exit_1_postgres;
    ledger_commands_need_no_source_secrets: ledger_commands_need_no_source_secrets_sqlite, ledger_commands_need_no_source_secrets_postgres;
}

/// A field whose `default` does not fit its type: found only once a run
/// compiles `[fields]`, so the run is started, recorded as failed with class
/// `config`, and exits 1 (was 0 for `backfill` and 2 for `run`).
const BAD_DEFAULT: &str =
    "note = { type = \"text\" }\nquantity = { type = \"int\", default = \"abc\" }";

async fn mid_run_config_error_fails_the_run_with_exit_1(backend: Backend) {
    let env = Env::orders(backend).await;
    env.edit_pipeline("orders", |t| {
        t.replace("note       = { type = \"text\" }", BAD_DEFAULT)
    });
    let run = env.tidemark(&["run", "orders", "--period", "2024-01-02"]);
    run.expect_code(1, "run with a default that does not fit");
    assert!(run.stderr.contains("fields.quantity.default"), "{run}");
    let entry = env.status_of("orders", "2024-01-02").expect("recorded");
    assert_eq!(entry["status"], "failed");
    assert_eq!(entry["error_class"], "config");

    env.backfill_orders(3, 4)
        .expect_code(1, "backfill with a default that does not fit");
    // `sync` from two days before today: each due period fails the same way.
    let start = (chrono::Utc::now() - chrono::Duration::days(3))
        .format("%Y-%m-%d")
        .to_string();
    env.set_option("orders", "period", "start", &format!("\"{start}\""));
    env.tidemark(&["sync", "orders"])
        .expect_code(1, "sync with a default that does not fit");
    let failed = env
        .status("orders")
        .iter()
        .filter(|e| e["error_class"] == "config")
        .count();
    assert!(failed >= 4, "every run recorded its config error: {failed}");
}

/// `validate` compiles `[fields]` as a run would, so it reports the bad
/// default (exit 2, naming the key) without any database.
#[test]
fn validate_rejects_a_default_that_does_not_fit_its_type() {
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let env = runtime.block_on(Env::orders(Backend::Sqlite));
    env.edit_pipeline("orders", |t| {
        t.replace("note       = { type = \"text\" }", BAD_DEFAULT)
    });
    let out = env.tidemark_bare(&["validate", "orders"]);
    out.expect_code(2, "validate with a default that does not fit");
    assert!(out.stderr.contains("fields.quantity.default"), "{out}");
    assert!(out.stderr.contains("abc"), "the value is named\n{out}");
    assert!(
        !env.path("tidemark.db").exists(),
        "validate opens no database"
    );
}

/// `status`, `prune` and `migrate` work with the source's token unset; a
/// command that contacts the source still says which variable is missing.
async fn ledger_commands_need_no_source_secrets(backend: Backend) {
    let env = Env::new(backend).await;
    env.copy_example("http_orders");
    for args in [
        &["migrate"][..],
        &["status", "http_orders", "--json"][..],
        &["status", "http_orders", "--period", "2024-01-05"][..],
        &["prune", "--older-than", "30d"][..],
    ] {
        let out = env.tidemark_without(&["SHOP_API_TOKEN"], args);
        out.expect_code(
            0,
            &format!("tidemark {} without SHOP_API_TOKEN", args.join(" ")),
        );
        assert!(!out.stderr.contains("SHOP_API_TOKEN"), "{out}");
    }
    let run = env.tidemark_without(
        &["SHOP_API_TOKEN"],
        &["run", "http_orders", "--period", "2024-01-05"],
    );
    run.expect_code(2, "run needs the token");
    assert!(run.stderr.contains("SHOP_API_TOKEN"), "{run}");
}
