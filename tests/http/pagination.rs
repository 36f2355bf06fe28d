//! Test 1: every pagination style loads exactly a period's records,
//! including the last short page, a period that ends on a full page, and
//! an empty period.

use super::api::{ids, Api, SERVER_PAGE_SIZE};
use super::case::{Case, Source, QUICK_RETRY};

/// Day 1: 25 records (two full pages and a short one); day 2: 20 (ends on a
/// full page); day 3: nothing.
fn records(day: &str) -> usize {
    match day {
        "2024-01-01" => 25,
        "2024-01-02" => 20,
        _ => 0,
    }
}

const DAYS: [&str; 3] = ["2024-01-01", "2024-01-02", "2024-01-03"];

/// Backfills the three days through `settings` and checks the loaded ids
/// and the ledger against the API; returns the requests per day.
fn backfill(api: &Api, settings: &str, batch_size: usize) -> Vec<usize> {
    let case = Case::new();
    let settings = settings.replace("BASE", &api.base);
    case.pipeline(&Source {
        settings: &settings,
        batch_size,
        retry: QUICK_RETRY,
    });
    case.run(&[
        "backfill",
        "orders",
        "--from",
        DAYS[0],
        "--to",
        DAYS[2],
        "--concurrency",
        "2",
    ])
    .expect_code(0, "run");
    for day in DAYS {
        assert_eq!(
            case.ids(day),
            ids(day, records(day)),
            "{settings}: loaded ids of {day}"
        );
        let status = case.status_of(day);
        assert_eq!(status["status"], "done", "{status}");
        assert_eq!(status["rows_read"], records(day) as u64, "{status}");
        assert_eq!(status["rows_inserted"], records(day) as u64, "{status}");
    }
    DAYS.iter()
        .map(|day| api.hits().iter().filter(|h| h.day == *day).count())
        .collect()
}

const DAY_QUERY: &str = r#"query = { day = "{period.start:%Y-%m-%d}" }"#;

#[test]
fn page_style_stops_on_a_short_or_empty_page() {
    let api = Api::start(records, None);
    let settings = format!(
        "url = \"BASE/page\"\nformat = \"json\"\n{DAY_QUERY}\nrecords = \"/data\"\npagination = {{ style = \"page\", param = \"page\", size_param = \"per_page\", size = 10 }}"
    );
    // Batches of 7 cut pages in the middle and span page boundaries.
    let requests = backfill(&api, &settings, 7);
    // Day 1: pages 1-3 (3 is short). Day 2: pages 1-2 full, page 3 empty. Day 3: one empty page.
    assert_eq!(requests, [3, 3, 1]);
}

#[test]
fn offset_style_advances_by_the_records_received() {
    let api = Api::start(records, None);
    let settings = format!(
        "url = \"BASE/offset\"\nformat = \"json\"\n{DAY_QUERY}\nrecords = \"/items\"\npagination = {{ style = \"offset\", param = \"offset\", size_param = \"limit\", size = 10 }}"
    );
    assert_eq!(backfill(&api, &settings, 10), [3, 3, 1]);
}

#[test]
fn cursor_style_follows_the_cursor_until_it_is_null() {
    let api = Api::start(records, None);
    let settings = format!(
        "url = \"BASE/cursor\"\nformat = \"json\"\n{DAY_QUERY}\nrecords = \"/data\"\npagination = {{ style = \"cursor\", cursor = \"/meta/next\", param = \"cursor\" }}"
    );
    // The server knows when it is done: no empty page at the end.
    assert_eq!(backfill(&api, &settings, 4), [3, 2, 1]);
    assert_eq!(SERVER_PAGE_SIZE, 10);
}

#[test]
fn link_header_style_follows_rel_next() {
    let api = Api::start(records, None);
    let settings = format!("url = \"BASE/link\"\nformat = \"ndjson\"\n{DAY_QUERY}\npagination = {{ style = \"link_header\" }}");
    assert_eq!(backfill(&api, &settings, 3), [3, 2, 1]);
}

#[test]
fn no_pagination_reads_one_csv_response() {
    let api = Api::start(records, None);
    let settings = format!("url = \"BASE/none\"\nformat = \"csv\"\n{DAY_QUERY}");
    assert_eq!(backfill(&api, &settings, 8), [1, 1, 1]);
}
