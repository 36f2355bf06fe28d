//! Tests 2, 4 and 5: transient failures are retried (honouring
//! `Retry-After`) without fetching finished pages again; a complete but
//! malformed page is not retried.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::api::{ids, Api, Fault};
use super::case::{Case, Source, QUICK_RETRY};

const PAGED: &str = r#"url = "BASE/page"
format = "json"
query = { day = "{period.start:%Y-%m-%d}" }
records = "/data"
pagination = { style = "page", param = "page", size_param = "per_page", size = 10 }"#;

fn paged(api: &Api) -> String {
    PAGED.replace("BASE", &api.base)
}

/// Test 2: about 30% of responses are 503 and the first request for page 2
/// of every day is a 429 with `Retry-After: 1`. The backfill still loads
/// exactly the source, and every retry waited at least what was asked.
#[test]
fn flaky_api_backfill_succeeds_and_honours_retry_after() {
    let days = ["2024-01-01", "2024-01-02", "2024-01-03", "2024-01-04"];
    let api = Api::start(|_| 35, None);
    // (requests seen, 503s sent): a 503 whenever that keeps them at 30%,
    // but never more than twice in a row for one page.
    let tally = Mutex::new((0u32, 0u32));
    api.faults(move |r| {
        let mut tally = tally.lock().unwrap();
        tally.0 += 1;
        if r.page == 2 && r.nth == 1 {
            Some(Fault::Status(429, Some("1".into()), "slow down".into()))
        } else if r.nth <= 2 && (tally.1 + 1) * 10 <= tally.0 * 3 {
            tally.1 += 1;
            Some(Fault::Status(503, None, "temporarily unavailable".into()))
        } else {
            None
        }
    });
    let case = Case::new();
    case.pipeline(&Source {
        settings: &paged(&api),
        batch_size: 10,
        retry: QUICK_RETRY,
    });
    let out = case.run(&[
        "backfill",
        "orders",
        "--from",
        days[0],
        "--to",
        days[3],
        "--concurrency",
        "2",
    ]);
    out.expect_code(0, "run");
    for day in days {
        assert_eq!(case.ids(day), ids(day, 35), "{day}");
    }

    let hits = api.hits();
    let count = |status: u16| hits.iter().filter(|h| h.status == status).count();
    let (ok, unavailable, throttled) = (count(200), count(503), count(429));
    eprintln!(
        "test 2 request counts: {} requests = {ok} ok + {unavailable} x 503 + {throttled} x 429 ({:.0}% 503)",
        hits.len(),
        100.0 * unavailable as f64 / hits.len() as f64
    );
    assert_eq!(
        ok, 16,
        "4 days x 4 pages, each fetched successfully exactly once"
    );
    assert_eq!(throttled, 4);
    assert!(unavailable >= 4, "the plan injects 503s: {unavailable}");
    assert_eq!(hits.len(), ok + unavailable + throttled);
    for (i, failed) in hits.iter().enumerate().filter(|(_, h)| h.status != 200) {
        let retry = hits[i + 1..]
            .iter()
            .find(|h| h.target == failed.target)
            .unwrap_or_else(|| {
                panic!(
                    "{} failed with {} and was never retried",
                    failed.target, failed.status
                )
            });
        if failed.retry_after.is_some() {
            let waited = retry.at.duration_since(failed.done);
            assert!(
                waited >= Duration::from_secs(1),
                "{}: retried after {waited:?}, Retry-After was 1s",
                failed.target
            );
        }
    }
    let warnings: Vec<&str> = out
        .stderr
        .lines()
        .filter(|l| l.contains("retrying"))
        .collect();
    eprintln!("a retry as logged: {}", warnings[0]);
    let warnings = warnings.len();
    assert_eq!(
        warnings,
        unavailable + throttled,
        "one warning per retry:\n{}",
        out.stderr
    );
    assert!(
        out.stderr.contains("HTTP 429") && out.stderr.contains("HTTP 503"),
        "{}",
        out.stderr
    );
}

/// Test 4: page 3's first response is reset mid-body and its second is
/// shorter than its Content-Length; the third try succeeds. Pages 1-2 are
/// fetched once.
#[test]
fn reset_and_truncated_body_are_retried_without_refetching_earlier_pages() {
    let day = "2024-02-01";
    let api = Api::start(|_| 45, None);
    api.faults(|r| match (r.page, r.nth) {
        (3, 1) => Some(Fault::Reset),
        (3, 2) => Some(Fault::Truncate),
        _ => None,
    });
    let case = Case::new();
    case.pipeline(&Source {
        settings: &paged(&api),
        batch_size: 10,
        retry: QUICK_RETRY,
    });
    let out = case.run(&["run", "orders", "--period", day]);
    out.expect_code(0, "run");
    assert_eq!(case.ids(day), ids(day, 45));
    let per_page = api.per_page(day);
    eprintln!("test 4 requests per page (reset + truncation): {per_page:?}");
    assert_eq!(
        per_page.into_iter().collect::<Vec<_>>(),
        [(1, 1), (2, 1), (3, 3), (4, 1), (5, 1)]
    );
    let page3: Vec<_> = api
        .hits()
        .iter()
        .filter(|h| h.day == day && h.page == 3)
        .map(|h| h.fault)
        .collect();
    assert_eq!(page3, [Some("reset"), Some("truncate"), None]);
    let retries: Vec<&str> = out
        .stderr
        .lines()
        .filter(|l| l.contains("retrying"))
        .collect();
    assert_eq!(retries.len(), 2, "{}", out.stderr);
    assert!(retries.iter().all(|l| l.contains("page=3")), "{retries:#?}");
}

/// Test 4, across attempts: the process is killed while page 3 is in
/// flight; the next run resumes from the committed checkpoint and fetches
/// neither page 1 nor page 2 again.
#[test]
fn a_killed_run_resumes_at_the_page_in_progress() {
    let day = "2024-02-02";
    let api = Api::start(|_| 45, None);
    api.faults(|r| (r.page == 3 && r.nth == 1).then_some(Fault::Hold(Duration::from_secs(60))));
    let case = Case::new();
    case.pipeline(&Source {
        settings: &paged(&api),
        batch_size: 10,
        retry: QUICK_RETRY,
    });
    let mut child = case.spawn(&["run", "orders", "--period", day]);
    let started = Instant::now();
    while !api.hits().iter().any(|h| h.page == 3) {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "page 3 was never requested"
        );
        assert!(!child.exited(), "tidemark exited early");
        std::thread::sleep(Duration::from_millis(20));
    }
    // Reading runs one batch ahead of loading: page 3 can be requested
    // while the batch of page 2 is still committing. Kill once it is in.
    while case.status_of(day)["rows_read"] != 20 {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "pages 1-2 were never committed"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    child.kill9();
    let status = case.status_of(day);
    assert_eq!(status["status"], "running", "{status}");
    assert_eq!(
        status["rows_read"], 20,
        "pages 1-2 were committed: {status}"
    );

    api.faults(|_| None);
    case.run(&["run", "orders", "--period", day])
        .expect_code(0, "run");
    assert_eq!(case.ids(day), ids(day, 45));
    let per_page = api.per_page(day);
    eprintln!("test 4 requests per page (kill -9 during page 3, then resume): {per_page:?}");
    assert_eq!(
        per_page.into_iter().collect::<Vec<_>>(),
        [(1, 1), (2, 1), (3, 2), (4, 1), (5, 1)]
    );
}

/// Test 5: page 2 is a complete response with malformed JSON: no retry,
/// exit 1, class `parse`, and the message names the page and position.
#[test]
fn malformed_json_fails_at_once_naming_page_and_position() {
    let day = "2024-02-03";
    let api = Api::start(|_| 45, None);
    api.faults(|r| (r.page == 2).then_some(Fault::Malformed));
    let case = Case::new();
    case.pipeline(&Source {
        settings: &paged(&api),
        batch_size: 10,
        retry: QUICK_RETRY,
    });
    let out = case.run(&["run", "orders", "--period", day]);
    out.expect_code(1, "run");
    assert_eq!(
        api.per_page(day).into_iter().collect::<Vec<_>>(),
        [(1, 1), (2, 1)]
    );
    let status = case.status_of(day);
    assert_eq!(status["status"], "failed", "{status}");
    assert_eq!(status["error_class"], "parse", "{status}");
    let message = status["error_message"].as_str().unwrap();
    assert!(
        message.contains("page 2") && message.contains("line 2 column"),
        "{message}"
    );
    assert!(
        message.contains(&format!("{}/page?day={day}&page=2", api.base)),
        "{message}"
    );
    assert!(!out.stderr.contains("retrying"), "{}", out.stderr);
    // The batch of page 1 was committed before the failure and stays.
    assert_eq!(case.ids(day), ids(day, 10));
}
