//! Completeness: `expect_count` against a local server that declares a
//! total (a header, or a JSON pointer) and then misbehaves: a last page
//! missing, an early empty page, a total that changes during the crawl
//! and disagrees at the end. Each fails the period as `incomplete` with
//! nothing deleted (the rows of an earlier clean load stay, though
//! `on_missing = "delete"`); a clean period is `done` with
//! `rows_expected = rows_read`. A page without the header is a `source`
//! error naming it.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use serde_json::Value as Json;

use crate::hardening_extract::{ids, ledger, run, write_pipeline};
use crate::support::http::{Reply, Request, Server};
use crate::support::{backend_tests, Backend, Env};

backend_tests! {
    expect_count_header_fails_incomplete_crawls_and_deletes_nothing: expect_count_header_fails_incomplete_crawls_and_deletes_nothing_sqlite, expect_count_header_fails_incomplete_crawls_and_deletes_nothing_postgres;
    expect_count_pointer_uses_the_last_pages_total: expect_count_pointer_uses_the_last_pages_total_sqlite, expect_count_pointer_uses_the_last_pages_total_postgres;
    absent_expect_count_header_is_a_source_error_naming_it: absent_expect_count_header_is_a_source_error_naming_it_sqlite, absent_expect_count_header_is_a_source_error_naming_it_postgres;
}

const DAY: &str = "2024-02-01";

/// How the server misbehaves, switched between runs.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Pages 1-3 of 2, 2 and 1 records (ids 1-5), total 5.
    Clean,
    /// Page 3 answers as if empty: 4 of 5 records.
    LastPageMissing,
    /// Page 2 answers empty: the crawl ends after 2 of 5.
    EarlyEmptyPage,
    /// The total grows to 7 from page 2 on, but only 5 records come.
    TotalChanges,
}

const MODES: [Mode; 4] = [
    Mode::Clean,
    Mode::LastPageMissing,
    Mode::EarlyEmptyPage,
    Mode::TotalChanges,
];

/// Page `page` (size 2) in `mode`: its ids and the total it declares.
fn page(mode: Mode, page: u64) -> (Vec<u64>, u64) {
    let ids: Vec<u64> = (1..=5).filter(|id| (id - 1) / 2 + 1 == page).collect();
    match mode {
        Mode::LastPageMissing if page == 3 => (vec![], 5),
        Mode::EarlyEmptyPage if page >= 2 => (vec![], 5),
        Mode::TotalChanges if page >= 2 => (ids, 7),
        _ => (ids, 5),
    }
}

/// A server whose mode is the index stored in `mode`; `pointer` puts the
/// total at `/meta/total` of the body, else in `X-Total-Count`.
fn server(mode: &Arc<AtomicUsize>, pointer: bool) -> Server {
    let mode = Arc::clone(mode);
    Server::start(move |r: &Request| {
        let (ids, total) = page(
            MODES[mode.load(Ordering::SeqCst)],
            r.num("page").unwrap_or(1),
        );
        let records: Vec<String> = ids
            .iter()
            .map(|id| format!("{{\"id\":\"{id}\"}}"))
            .collect();
        if pointer {
            Reply::json(format!(
                "{{\"meta\":{{\"total\":{total}}},\"data\":[{}]}}",
                records.join(",")
            ))
        } else {
            Reply::json(format!("{{\"data\":[{}]}}", records.join(",")))
                .with_header("X-Total-Count", &total.to_string())
        }
    })
}

fn api(env: &Env, server: &Server, expect: &str) {
    write_pipeline(
        env,
        "api",
        &format!(
            "transport = \"http\"\nformat = \"json\"\nurl = \"{}/orders\"\nrecords = \"/data\"\n\
             pagination = {{ style = \"page\", size_param = \"per_page\", size = 2 }}\n\
             expect_count = {expect}",
            server.base
        ),
        "id = { type = \"text\", required = true }",
        "batch_size = 3\non_missing = \"delete\"",
    );
}

fn num(entry: &Json, key: &str) -> Option<u64> {
    entry.get(key).and_then(Json::as_u64)
}

/// A clean crawl: `done`, `rows_expected = rows_read` in status and in the
/// result printed.
async fn clean_load(env: &Env) {
    let out = run(env, "api", DAY, &["--force"]);
    out.expect_code(0, "clean period");
    let result = out.json();
    assert_eq!(num(&result, "rows_expected"), Some(5), "{result}");
    let entry = ledger(env, "api", DAY);
    assert_eq!(entry["status"], "done", "{entry}");
    assert_eq!(num(&entry, "rows_read"), Some(5), "{entry}");
    assert_eq!(num(&entry, "rows_expected"), Some(5), "{entry}");
    assert_eq!(ids(env, "api").await, ["1", "2", "3", "4", "5"]);
}

#[track_caller]
fn assert_incomplete(env: &Env, out: &crate::support::Out, read: u64, expected: u64) {
    out.expect_code(1, "incomplete");
    assert!(out.stderr.contains("incomplete error"), "{out}");
    assert!(
        out.stderr.contains(&format!("declared {expected} records")),
        "{out}"
    );
    assert!(
        out.stderr.contains(&format!("but {read} were read")),
        "{out}"
    );
    let entry = ledger(env, "api", DAY);
    assert_eq!(entry["status"], "failed", "{entry}");
    assert_eq!(entry["error_class"], "incomplete", "{entry}");
    assert_eq!(num(&entry, "rows_read"), Some(read), "{entry}");
    assert_eq!(num(&entry, "rows_expected"), Some(expected), "{entry}");
    assert_eq!(num(&entry, "rows_deleted"), Some(0), "{entry}");
}

async fn expect_count_header_fails_incomplete_crawls_and_deletes_nothing(backend: Backend) {
    let env = Env::new(backend).await;
    let mode = Arc::new(AtomicUsize::new(0));
    let server = server(&mode, false);
    api(&env, &server, "{ header = \"X-Total-Count\" }");
    clean_load(&env).await;

    for (index, read, expected) in [(1, 4, 5), (2, 2, 5)] {
        mode.store(index, Ordering::SeqCst);
        let out = run(&env, "api", DAY, &["--force"]);
        assert_incomplete(&env, &out, read, expected);
        assert_eq!(
            ids(&env, "api").await,
            ["1", "2", "3", "4", "5"],
            "nothing deleted"
        );
    }
    // The attempt records the expected total too.
    let attempts = env
        .db
        .select(&["rows_expected"], "FROM _tm_attempts ORDER BY attempt")
        .await;
    assert_eq!(
        attempts,
        vec![vec![Some("5".to_string())]; 3],
        "each attempt's rows_expected"
    );

    mode.store(0, Ordering::SeqCst);
    clean_load(&env).await;
}

/// The pointer form, and a total that changes during the crawl: the last
/// page's total (7) is the one compared, and the change is logged.
async fn expect_count_pointer_uses_the_last_pages_total(backend: Backend) {
    let env = Env::new(backend).await;
    let mode = Arc::new(AtomicUsize::new(0));
    let server = server(&mode, true);
    api(&env, &server, "{ pointer = \"/meta/total\" }");
    clean_load(&env).await;

    mode.store(3, Ordering::SeqCst);
    let out = run(&env, "api", DAY, &["--force"]);
    assert_incomplete(&env, &out, 5, 7);
    assert!(
        out.stderr
            .contains("declared total changed during the crawl, from 5 (page 1) to 7 (page 2)"),
        "{out}"
    );
    assert!(out.stderr.contains("pointer /meta/total"), "{out}");
    assert_eq!(ids(&env, "api").await, ["1", "2", "3", "4", "5"]);

    mode.store(2, Ordering::SeqCst);
    let out = run(&env, "api", DAY, &["--force"]);
    assert_incomplete(&env, &out, 2, 5);
    assert_eq!(ids(&env, "api").await, ["1", "2", "3", "4", "5"]);
}

/// A response without the header: a permanent `source` error naming it,
/// at the first request (no retry).
async fn absent_expect_count_header_is_a_source_error_naming_it(backend: Backend) {
    let env = Env::new(backend).await;
    let mode = Arc::new(AtomicUsize::new(0));
    let server = server(&mode, false);
    api(&env, &server, "{ header = \"X-Record-Total\" }");
    let out = run(&env, "api", DAY, &[]);
    out.expect_code(1, "absent header");
    assert!(out.stderr.contains("source error"), "{out}");
    assert!(
        out.stderr
            .contains("page 1: the response has no X-Record-Total header"),
        "{out}"
    );
    let entry = ledger(&env, "api", DAY);
    assert_eq!(entry["status"], "failed", "{entry}");
    assert_eq!(entry["error_class"], "source", "{entry}");
    assert_eq!(server.hits().len(), 1, "not retried");
}
