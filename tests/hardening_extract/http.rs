//! HTTP sources: a complete body that does not decode is a parse error,
//! not a truncation (issue 11 defect 1); page bodies are capped (item 9);
//! pagination that goes round in circles stops (10); a capped page size is
//! warned about (18); a web page is called one (16); a page that changed
//! between a crash and the resume is not skipped into (3); a bad NDJSON
//! line is a reject (13).

use std::io::Write as _;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::{ids, ledger, run, tidemark, write_pipeline};
use crate::support::http::{Reply, Request, Server};
use crate::support::{backend_tests, Backend, Env};

backend_tests! {
    cut_json_in_a_complete_response_is_a_parse_error_without_retry: cut_json_in_a_complete_response_is_a_parse_error_without_retry_sqlite, cut_json_in_a_complete_response_is_a_parse_error_without_retry_postgres;
    endless_body_fails_fast_at_max_page_bytes: endless_body_fails_fast_at_max_page_bytes_sqlite, endless_body_fails_fast_at_max_page_bytes_postgres;
    gzip_bomb_fails_at_max_page_bytes_by_its_decompressed_size: gzip_bomb_fails_at_max_page_bytes_by_its_decompressed_size_sqlite, gzip_bomb_fails_at_max_page_bytes_by_its_decompressed_size_postgres;
    server_ignoring_the_page_parameter_fails_the_period: server_ignoring_the_page_parameter_fails_the_period_sqlite, server_ignoring_the_page_parameter_fails_the_period_postgres;
    cursor_or_link_seen_before_fails_the_period: cursor_or_link_seen_before_fails_the_period_sqlite, cursor_or_link_seen_before_fails_the_period_postgres;
    max_pages_stops_a_server_that_pages_forever: max_pages_stops_a_server_that_pages_forever_sqlite, max_pages_stops_a_server_that_pages_forever_postgres;
    short_first_page_warns_naming_size: short_first_page_warns_naming_size_sqlite, short_first_page_warns_naming_size_postgres;
    html_page_is_reported_as_html: html_page_is_reported_as_html_sqlite, html_page_is_reported_as_html_postgres;
    changed_page_after_a_crash_starts_the_period_over: changed_page_after_a_crash_starts_the_period_over_sqlite, changed_page_after_a_crash_starts_the_period_over_postgres;
    bad_ndjson_line_from_an_api_is_a_reject: bad_ndjson_line_from_an_api_is_a_reject_sqlite, bad_ndjson_line_from_an_api_is_a_reject_postgres;
}

const DAY: &str = "2024-02-01";

/// Pipeline `api` reading `url` with these extra source settings.
fn api_pipeline(env: &Env, server: &Server, path: &str, settings: &str, load: &str) {
    write_pipeline(
        env,
        "api",
        &format!(
            "transport = \"http\"\nurl = \"{}{path}\"\n{settings}",
            server.base
        ),
        "id = { type = \"text\", required = true }",
        load,
    );
}

/// `{"data": [{"id": "ID"}, ...]}`.
fn page_of(ids: impl IntoIterator<Item = String>) -> String {
    let records: Vec<String> = ids
        .into_iter()
        .map(|id| format!("{{\"id\":\"{id}\"}}"))
        .collect();
    format!("{{\"data\":[{}]}}", records.join(","))
}

fn requests(server: &Server, path: &str) -> usize {
    server.hits().iter().filter(|h| h.path == path).count()
}

#[track_caller]
fn assert_failed(env: &Env, class: &str) -> serde_json::Value {
    let entry = ledger(env, "api", DAY);
    assert_eq!(entry["status"], "failed", "{entry}");
    assert_eq!(entry["error_class"], class, "{entry}");
    entry
}

/// Issue 11 defect 1: `200` with a `Content-Length` that matches a body
/// whose JSON is cut arrived whole: one request, exit 1, class `parse`
/// (before, six requests "truncated response"). The same for an NDJSON
/// body whose last line is cut.
async fn cut_json_in_a_complete_response_is_a_parse_error_without_retry(backend: Backend) {
    let env = Env::new(backend).await;
    let server = Server::start(|r| match r.path.as_str() {
        "/json" => Reply::json(r#"[{"id":1},{"id":"#),
        _ => Reply::ndjson("{\"id\":1}\n{\"id\":"),
    });
    for (path, format) in [("/json", "json"), ("/ndjson", "ndjson")] {
        api_pipeline(&env, &server, path, &format!("format = \"{format}\""), "");
        let out = run(&env, "api", DAY, &["--force"]);
        out.expect_code(1, format);
        assert_failed(&env, "parse");
        assert_eq!(requests(&server, path), 1, "no retry\n{out}");
        assert!(!out.stderr.contains("retrying"), "{out}");
    }
}

/// The peak resident memory of a running process, sampled until it exits.
fn peak_rss_kib(run: &mut crate::support::Running) -> u64 {
    let mut peak = 0;
    while !run.exited() {
        let status =
            std::fs::read_to_string(format!("/proc/{}/status", run.pid())).unwrap_or_default();
        let rss = status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or(0);
        peak = peak.max(rss);
        std::thread::sleep(Duration::from_millis(10));
    }
    peak
}

/// Item 9: an endless chunked body (it reached 1.86 GB RSS in 3 s) fails
/// the period as soon as the page passes `max_page_bytes`: a permanent
/// `source` error naming the limit, one request, memory bounded.
async fn endless_body_fails_fast_at_max_page_bytes(backend: Backend) {
    let env = Env::new(backend).await;
    let server = Server::start(|_| Reply::Endless {
        prefix: b"[".to_vec(),
        chunk: b"{\"id\":\"x\"},".repeat(6000),
        limit: 4 << 30,
    });
    api_pipeline(
        &env,
        &server,
        "/endless",
        "format = \"json\"\nmax_page_bytes = \"1MiB\"",
        "",
    );
    let started = Instant::now();
    let mut child = env.spawn(&["run", "api", "--period", DAY]);
    let peak = peak_rss_kib(&mut child);
    let out = child.finish(Duration::from_secs(5));
    out.expect_code(1, "a body without end");
    eprintln!(
        "item 9: endless body stopped after {:?}, server sent {} KiB, peak RSS {peak} KiB",
        started.elapsed(),
        server.sent() >> 10
    );
    assert!(started.elapsed() < Duration::from_secs(20), "fails fast");
    assert!(
        out.stderr.contains("max_page_bytes = 1048576 bytes"),
        "{out}"
    );
    let entry = assert_failed(&env, "source");
    assert!(
        entry["error_message"]
            .as_str()
            .unwrap()
            .contains("max_page_bytes"),
        "{entry}"
    );
    assert_eq!(
        server.hits().len(),
        1,
        "a page over the limit is not retried"
    );
    assert!(
        server.sent() < 64 << 20,
        "reading stopped near the limit: {}",
        server.sent()
    );
    assert!(peak < 200 << 10, "peak RSS {peak} KiB");
}

/// Item 9: a gzip body is limited by its decompressed size: 16 MiB of
/// JSON that compresses to a few KiB fails a 1 MiB limit.
async fn gzip_bomb_fails_at_max_page_bytes_by_its_decompressed_size(backend: Backend) {
    let env = Env::new(backend).await;
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    encoder.write_all(b"[").unwrap();
    let zeros = b"0,".repeat(1 << 16);
    for _ in 0..(16 << 20) / zeros.len() {
        encoder.write_all(&zeros).unwrap();
    }
    encoder.write_all(b"0]").unwrap();
    let bomb = Arc::new(encoder.finish().unwrap());
    let compressed = bomb.len();
    let served = Arc::clone(&bomb);
    let server = Server::start(move |_| {
        Reply::json(served.as_slice()).with_header("content-encoding", "gzip")
    });
    api_pipeline(
        &env,
        &server,
        "/bomb",
        "format = \"json\"\nmax_page_bytes = \"1MiB\"",
        "",
    );
    let out = run(&env, "api", DAY, &[]);
    out.expect_code(1, "a gzip bomb");
    eprintln!("item 9: a {compressed}-byte gzip body of 16 MiB");
    assert!(
        compressed < 1 << 20,
        "the compressed body is under the limit"
    );
    assert!(
        out.stderr.contains("max_page_bytes = 1048576 bytes"),
        "{out}"
    );
    assert_failed(&env, "source");
    assert_eq!(server.hits().len(), 1);
}

/// Item 10: a server that ignores `page` sends the same records for every
/// page; before, tidemark asked forever (343 requests in 15 s). The second
/// page's body is the first's again: the period fails, after two requests.
async fn server_ignoring_the_page_parameter_fails_the_period(backend: Backend) {
    let env = Env::new(backend).await;
    let server = Server::start(|_| Reply::json(page_of((1..=10).map(|i| i.to_string()))));
    api_pipeline(
        &env,
        &server,
        "/page",
        "format = \"json\"\nrecords = \"/data\"\npagination = { style = \"page\", size_param = \"per_page\", size = 10 }",
        "",
    );
    let out = run(&env, "api", DAY, &[]);
    out.expect_code(1, "a server ignoring the page parameter");
    assert!(out.stderr.contains("identical to page 1"), "{out}");
    assert_failed(&env, "source");
    assert_eq!(server.hits().len(), 2, "{out}");
}

/// Item 10: a cursor that comes back after another one (A, B, A), and a
/// `Link` that points to a page already read (1, 2, 3, 2), are caught,
/// not only a cursor repeating the one just sent.
async fn cursor_or_link_seen_before_fails_the_period(backend: Backend) {
    let env = Env::new(backend).await;
    let server = Server::start(|r: &Request| {
        if r.path == "/cursor" {
            let (ids, next) = match r.query.get("cursor").map(String::as_str) {
                None => (1..=3, "A"),
                Some("A") => (4..=6, "B"),
                _ => (7..=9, "A"),
            };
            let body = page_of(ids.map(|i| i.to_string()));
            return Reply::json(format!(
                "{},\"next\":\"{next}\"}}",
                body.trim_end_matches('}')
            ));
        }
        let page = r.num("page").unwrap_or(1);
        let next = if page == 3 { 2 } else { page + 1 };
        let body: String = (0..3)
            .map(|i| format!("{{\"id\":\"{page}-{i}\"}}\n"))
            .collect();
        Reply::ndjson(body).with_header(
            "link",
            &format!("<{}/link?page={next}>; rel=\"next\"", r.base),
        )
    });
    api_pipeline(
        &env,
        &server,
        "/cursor",
        "format = \"json\"\nrecords = \"/data\"\npagination = { style = \"cursor\", cursor = \"/next\", param = \"cursor\" }",
        "",
    );
    let out = run(&env, "api", DAY, &[]);
    out.expect_code(1, "cursors A, B, A");
    assert!(out.stderr.contains("the request of page 2 again"), "{out}");
    assert_failed(&env, "source");
    assert_eq!(requests(&server, "/cursor"), 3);

    api_pipeline(
        &env,
        &server,
        "/link",
        "format = \"ndjson\"\npagination = { style = \"link_header\" }",
        "",
    );
    let out = run(&env, "api", DAY, &["--force"]);
    out.expect_code(1, "links 1, 2, 3, 2");
    assert!(out.stderr.contains("the request of page 2 again"), "{out}");
    assert_failed(&env, "source");
    assert_eq!(requests(&server, "/link"), 3);
}

/// Item 10: `max_pages` is the last guard, for a server whose pages all
/// differ but never end.
async fn max_pages_stops_a_server_that_pages_forever(backend: Backend) {
    let env = Env::new(backend).await;
    let server = Server::start(|r| {
        let page = r.num("page").unwrap_or(1);
        Reply::json(page_of((0..10).map(|i| format!("{page}-{i}"))))
    });
    api_pipeline(
        &env,
        &server,
        "/forever",
        "format = \"json\"\nrecords = \"/data\"\nmax_pages = 5\npagination = { style = \"page\", size_param = \"per_page\", size = 10 }",
        "",
    );
    let out = run(&env, "api", DAY, &[]);
    out.expect_code(1, "more pages than max_pages");
    assert!(
        out.stderr.contains("more than max_pages = 5 pages"),
        "{out}"
    );
    assert_failed(&env, "source");
    assert_eq!(server.hits().len(), 5);
}

/// Item 18: a server that caps its pages at 25 while `size = 100` makes
/// the first page look like the last. The period is read as the server
/// says, but a warning names `size` and what arrived.
async fn short_first_page_warns_naming_size(backend: Backend) {
    let env = Env::new(backend).await;
    let server = Server::start(|r| {
        let page = r.num("page").unwrap_or(1);
        Reply::json(page_of((0..25).map(|i| format!("{page}-{i:02}"))))
    });
    api_pipeline(
        &env,
        &server,
        "/capped",
        "format = \"json\"\nrecords = \"/data\"\npagination = { style = \"page\", size_param = \"per_page\", size = 100 }",
        "",
    );
    let out = tidemark(
        &env,
        &[],
        &["--log-format", "json", "run", "api", "--period", DAY],
        Duration::from_secs(60),
    );
    out.expect_code(0, "a capped first page");
    let warning = out
        .stderr
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|l| l["level"] == "WARN" && l["fields"]["size"] == 100)
        .unwrap_or_else(|| panic!("no warning naming size\n{out}"));
    assert_eq!(warning["fields"]["records"], 25, "{warning}");
    let message = warning["fields"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("fewer than pagination.size = 100"),
        "{warning}"
    );
    assert_eq!(
        warning["span"]["period"], DAY,
        "the warning carries the run's context: {warning}"
    );
    assert_eq!(ids(&env, "api").await.len(), 25);
}

/// Item 16: an HTML `200` (a login wall, a proxy's error page) is not
/// reported as plain "invalid JSON": the message names the Content-Type
/// and quotes the first bytes.
async fn html_page_is_reported_as_html(backend: Backend) {
    let env = Env::new(backend).await;
    let page = "<!DOCTYPE html>\n<html><body>Please log in</body></html>";
    let server = Server::start(move |_| Reply::status(200, "text/html; charset=utf-8", page));
    api_pipeline(&env, &server, "/json", "format = \"json\"", "");
    let out = run(&env, "api", DAY, &[]);
    out.expect_code(1, "HTML as JSON");
    for named in [
        "Content-Type is text/html; charset=utf-8",
        "\"<!DOCTYPE html> <html><body>Please log in",
    ] {
        assert!(out.stderr.contains(named), "names {named:?}\n{out}");
    }
    assert_failed(&env, "parse");
    assert_eq!(server.hits().len(), 1);

    api_pipeline(
        &env,
        &server,
        "/ndjson",
        "format = \"ndjson\"",
        "max_rejects = 10",
    );
    let out = run(&env, "api", DAY, &["--force"]);
    out.expect_code(1, "HTML as NDJSON");
    assert!(
        out.stderr
            .contains("the response is a web page, not ndjson"),
        "{out}"
    );
    assert_failed(&env, "parse");
}

/// Item 3 for HTTP: killed with a checkpoint inside page 1 (8 of its 10
/// records loaded), then the server inserts a record at the front. The
/// resumed attempt fetches page 1 again; its first 8 records are not the
/// ones handed out before, so the period starts over instead of skipping
/// 8 records of the new page (which would never load the new record).
async fn changed_page_after_a_crash_starts_the_period_over(backend: Backend) {
    let env = Env::new(backend).await;
    let data: Arc<Mutex<Vec<String>>> =
        Arc::new(Mutex::new((1..=25).map(|i| format!("r{i:02}")).collect()));
    let hold = Arc::new(Mutex::new(true));
    let (served, held) = (Arc::clone(&data), Arc::clone(&hold));
    let server = Server::start(move |r| {
        let page = usize::try_from(r.num("page").unwrap_or(1)).unwrap_or(1);
        let ids: Vec<String> = served
            .lock()
            .unwrap()
            .iter()
            .skip((page - 1) * 10)
            .take(10)
            .cloned()
            .collect();
        let reply = Reply::json(page_of(ids));
        if page == 2 && *held.lock().unwrap() {
            Reply::Hold(Duration::from_secs(30), Box::new(reply))
        } else {
            reply
        }
    });
    api_pipeline(
        &env,
        &server,
        "/page",
        "format = \"json\"\nrecords = \"/data\"\npagination = { style = \"page\", size_param = \"per_page\", size = 10 }",
        "batch_size = 4",
    );
    let first = env.spawn(&["run", "api", "--period", DAY]);
    let deadline = Instant::now() + Duration::from_secs(30);
    while !matches!(env.status_of("api", DAY), Some(e) if e["rows_read"] == 8) {
        assert!(
            Instant::now() < deadline,
            "two batches of page 1 were not committed"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    first.kill9();
    data.lock().unwrap().insert(0, "r00".to_string());
    *hold.lock().unwrap() = false;

    let out = run(&env, "api", DAY, &[]);
    out.expect_code(0, "the resume after page 1 changed");
    assert!(
        out.stderr
            .contains("checkpoint no longer matches the source"),
        "{out}"
    );
    let expected: Vec<String> = (0..=25).map(|i| format!("r{i:02}")).collect();
    assert_eq!(
        ids(&env, "api").await,
        expected,
        "the new first record is loaded"
    );
    let entry = ledger(&env, "api", DAY);
    assert_eq!(
        (entry["status"].clone(), entry["rows_read"].clone()),
        ("done".into(), 26.into()),
        "{entry}"
    );
}

/// Item 13 for HTTP: an NDJSON page's bad line is a reject like a file's,
/// located by the page.
async fn bad_ndjson_line_from_an_api_is_a_reject(backend: Backend) {
    let env = Env::new(backend).await;
    let server = Server::start(|_| Reply::ndjson("{\"id\":\"a\"}\nNaN\n{\"id\":\"b\"}\n"));
    api_pipeline(
        &env,
        &server,
        "/nd",
        "format = \"ndjson\"",
        "max_rejects = 1",
    );
    run(&env, "api", DAY, &[]).expect_code(0, "one bad line, max_rejects = 1");
    assert_eq!(ids(&env, "api").await, ["a", "b"]);
    let rejects = env
        .db
        .select(&["record", "location"], "FROM _tm_rejects")
        .await;
    assert_eq!(rejects.len(), 1, "{rejects:?}");
    assert_eq!(rejects[0][0].as_deref(), Some("\"NaN\""));
    let location = rejects[0][1].clone().unwrap_or_default();
    assert!(location.contains("/nd page 1 row 2 (line 2)"), "{location}");
}
