//! Test 7: a token given by environment variable reaches the API (header
//! and query) and nothing else: not stdout/stderr at debug level, not
//! `status --json`, not a byte of the database, even when the API echoes
//! it in `Link` URLs (stored in checkpoints) and in an error body.

use std::time::{Duration, Instant};

use super::api::{ids, Api, Fault};
use super::case::{Case, Source, QUICK_RETRY};
use crate::support::Out;

const TOKEN: &str = "tm-s3cret-token-8e1f0c";

#[test]
fn a_token_from_the_environment_never_leaves_the_requests() {
    let (ok_day, bad_day, killed_day) = ("2024-05-01", "2024-05-02", "2024-05-03");
    let api = Api::start(|_| 25, Some(TOKEN));
    api.faults(move |r| match (r.day.as_str(), r.page, r.nth) {
        (day, _, _) if day == bad_day => Some(Fault::Status(
            400,
            None,
            format!("bad request: api_key={TOKEN} is not valid for {day}"),
        )),
        (day, 3, 1) if day == killed_day => Some(Fault::Hold(Duration::from_secs(60))),
        _ => None,
    });
    let case = Case::new()
        .env("TM_HTTP_SECRET", TOKEN)
        .env("TIDEMARK_LOG", "debug");
    let settings = format!(
        r#"url = "{}/link"
format = "ndjson"
query = {{ day = "{{period.start:%Y-%m-%d}}", api_key = "${{TM_HTTP_SECRET}}" }}
headers = {{ Authorization = "Bearer ${{TM_HTTP_SECRET}}" }}
pagination = {{ style = "link_header" }}"#,
        api.base
    );
    // Batches of 4 leave checkpoints inside and between link-followed pages.
    case.pipeline(&Source {
        settings: &settings,
        batch_size: 4,
        retry: QUICK_RETRY,
    });
    let mut outputs: Vec<Out> = Vec::new();

    outputs.push(case.run(&["run", "orders", "--period", ok_day]));
    outputs.last().unwrap().expect_code(0, "run");
    assert_eq!(case.ids(ok_day), ids(ok_day, 25));

    outputs.push(case.run(&["--log-format", "json", "run", "orders", "--period", bad_day]));
    outputs.last().unwrap().expect_code(1, "run");
    let failed = case.status_of(bad_day);
    let message = failed["error_message"].as_str().unwrap();
    assert!(
        message.contains("api_key=***") && message.contains("HTTP 400"),
        "{message}"
    );

    // Killed while page 3 is in flight: the checkpoint names page 3 by its
    // `Link` URL, which the API built with the key in it.
    let child = case.spawn(&["run", "orders", "--period", killed_day]);
    let started = Instant::now();
    while !api
        .hits()
        .iter()
        .any(|h| h.day == killed_day && h.page == 3)
    {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "page 3 was never requested"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // Reading runs one batch ahead of loading: wait until the batches of
    // pages 1-2 are committed before killing.
    while case.status_of(killed_day)["rows_read"] != 20 {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "pages 1-2 were never committed"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    outputs.push(child.kill9());
    api.faults(|_| None);
    outputs.push(case.run(&["run", "orders", "--period", killed_day]));
    outputs.last().unwrap().expect_code(0, "run");
    assert_eq!(case.ids(killed_day), ids(killed_day, 25));
    assert_eq!(
        api.per_page(killed_day).into_iter().collect::<Vec<_>>(),
        [(1, 1), (2, 1), (3, 2)],
        "the resumed run followed the stored link with the key restored"
    );

    let status = case.run(&["status", "orders", "--json"]);
    status.expect_code(0, "status --json");
    outputs.push(status);
    outputs.push(case.run(&["status", "orders"]));

    // The token was really used...
    let hits = api.hits();
    assert!(hits
        .iter()
        .all(|h| h.authorization.as_deref() == Some(&format!("Bearer {TOKEN}"))));
    assert!(
        hits.iter().all(|h| h.status != 401),
        "every request carried the key"
    );
    // ...and went nowhere else.
    for out in &outputs {
        assert!(
            !out.stdout.contains(TOKEN) && !out.stderr.contains(TOKEN),
            "token leaked:\n{out}"
        );
    }
    let bytes = case.database_bytes();
    assert!(!bytes.is_empty());
    assert!(
        !bytes.windows(TOKEN.len()).any(|w| w == TOKEN.as_bytes()),
        "token found in the database file"
    );
}
