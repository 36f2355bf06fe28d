//! `backfill --only failed|missing|stale|all`: only run keys in that
//! state are touched, down to their source (requests counted at a local
//! HTTP server).

use super::{count, ledger, text};
use crate::http::api::{Api, Fault};
use crate::support::{backend_tests, Backend, Env};

backend_tests! {
    backfill_only_failed_touches_only_the_failed_periods_source: backfill_only_failed_touches_only_the_failed_periods_source_sqlite, backfill_only_failed_touches_only_the_failed_periods_source_postgres;
}

/// The `shop` pipeline reading one CSV response per day from `base`.
fn http_shop(env: &Env, base: &str) {
    env.write(
        "pipelines/shop.toml",
        &format!(
            r#"name = "shop"
export_type = "shop_daily"

[period]
granularity = "day"

[[sources]]
id = "api"
transport = "http"
format = "csv"
url = "{base}/none"
query = {{ day = "{{period.start:%Y-%m-%d}}" }}

[fields]
id = {{ type = "text", required = true }}
day = {{ type = "date" }}
amount = {{ type = "decimal" }}

[load]
table = "shop"
key = ["id"]

[retry]
max_attempts = 2
base_delay = "10ms"
max_delay = "50ms"
"#
        ),
    );
}

/// The days requested since the first `since` requests.
fn requested(api: &Api, since: usize) -> Vec<String> {
    api.hits()[since..].iter().map(|h| h.day.clone()).collect()
}

fn backfill_only(env: &Env, to: &str, only: &str) -> crate::support::Out {
    env.tidemark(&[
        "backfill",
        "shop",
        "--from",
        "2024-01-01",
        "--to",
        to,
        "--only",
        only,
    ])
}

async fn backfill_only_failed_touches_only_the_failed_periods_source(backend: Backend) {
    let env = Env::new(backend).await;
    // The server makes its own runtime: start it off this test's one.
    let api = std::thread::spawn(|| Api::start(|_| 3, None))
        .join()
        .expect("start the test API");
    http_shop(&env, &api.base);
    api.faults(|req| {
        (req.day == "2024-01-02").then(|| Fault::Status(404, None, "gone for now".into()))
    });
    env.tidemark(&[
        "backfill",
        "shop",
        "--from",
        "2024-01-01",
        "--to",
        "2024-01-03",
    ])
    .expect_code(1, "backfill with day 2 failing");
    let entries = ledger(&env);
    assert_eq!(text(&entries["2024-01-02"], "status"), "failed");
    assert_eq!(text(&entries["2024-01-02"], "error_class"), "source");
    api.faults(|_| None);

    let since = api.hits().len();
    let out = backfill_only(&env, "2024-01-03", "failed");
    out.expect_code(0, "--only failed");
    assert_eq!(
        requested(&api, since),
        ["2024-01-02"],
        "only the failed period's source is read\n{out}"
    );
    let entries = ledger(&env);
    assert_eq!(text(&entries["2024-01-02"], "status"), "done");
    assert_eq!(count(&entries["2024-01-02"], "attempts"), 2);
    for day in ["2024-01-01", "2024-01-03"] {
        assert_eq!(count(&entries[day], "attempts"), 1, "{day} untouched");
    }
    assert!(
        out.stdout
            .contains("2 run key(s) of the range left alone (not failed)"),
        "{out}"
    );

    // Nothing failed any more: nothing is read.
    let since = api.hits().len();
    backfill_only(&env, "2024-01-03", "failed").expect_code(0, "--only failed again");
    assert!(requested(&api, since).is_empty());

    // --only missing reads only the period never run.
    let since = api.hits().len();
    backfill_only(&env, "2024-01-04", "missing").expect_code(0, "--only missing");
    assert_eq!(requested(&api, since), ["2024-01-04"]);

    // --only all re-runs every period, like --force.
    let since = api.hits().len();
    backfill_only(&env, "2024-01-04", "all").expect_code(0, "--only all");
    assert_eq!(requested(&api, since).len(), 4);
    assert_eq!(count(&ledger(&env)["2024-01-01"], "attempts"), 2);

    // --only and --force say the same thing twice: refused.
    let out = env.tidemark(&[
        "backfill",
        "shop",
        "--from",
        "2024-01-01",
        "--to",
        "2024-01-04",
        "--only",
        "failed",
        "--force",
    ]);
    out.expect_code(2, "--only with --force");
}
