//! Test 6: one source's rate limit is shared by every period running at
//! once in one process (`backfill --concurrency 4`).

use std::time::Duration;

use super::api::{ids, Api};
use super::case::{Case, Source, QUICK_RETRY};

const PER_SECOND: usize = 5;
const BURST: usize = 1;

#[test]
fn concurrent_periods_share_one_rate_limit() {
    let days = ["2024-04-01", "2024-04-02", "2024-04-03", "2024-04-04"];
    // 40 records in pages of 10: 4 full pages and an empty one per day.
    let api = Api::start(|_| 40, None);
    let case = Case::new();
    let settings = format!(
        r#"url = "{}/page"
format = "json"
query = {{ day = "{{period.start:%Y-%m-%d}}" }}
records = "/data"
pagination = {{ style = "page", size_param = "per_page", size = 10 }}
rate_limit = {{ per_second = {PER_SECOND}, burst = {BURST} }}"#,
        api.base
    );
    case.pipeline(&Source {
        settings: &settings,
        batch_size: 10,
        retry: QUICK_RETRY,
    });
    case.run(&[
        "backfill",
        "orders",
        "--from",
        days[0],
        "--to",
        days[3],
        "--concurrency",
        "4",
    ])
    .expect_code(0, "run");
    for day in days {
        assert_eq!(case.ids(day), ids(day, 40));
    }

    let hits = api.hits();
    assert_eq!(hits.len(), 20);
    let first_days: std::collections::HashSet<&str> =
        hits[..4].iter().map(|h| h.day.as_str()).collect();
    assert!(
        first_days.len() >= 2,
        "the periods ran concurrently: {first_days:?}"
    );

    // Arrival times carry a little scheduling jitter on top of the limiter's
    // exact pacing, so windows are 1 s less a small tolerance.
    let window = Duration::from_secs(1) - Duration::from_millis(30);
    let busiest = hits
        .iter()
        .map(|h| {
            hits.iter()
                .filter(|o| o.at >= h.at && o.at.duration_since(h.at) < window)
                .count()
        })
        .max()
        .unwrap();
    let span = hits.last().unwrap().at.duration_since(hits[0].at);
    eprintln!(
        "test 6: {} requests over {span:?}; busiest second: {busiest}",
        hits.len()
    );
    assert!(
        busiest <= PER_SECOND + BURST,
        "{busiest} requests within one second"
    );
    // Over the whole run: the bucket's capacity plus the sustained rate.
    let allowed = (1 + BURST) as f64 + span.as_secs_f64() * PER_SECOND as f64;
    assert!(
        hits.len() as f64 <= allowed + 0.5,
        "{} requests in {span:?}",
        hits.len()
    );
    assert!(
        span >= Duration::from_millis(3400),
        "20 requests at 5/s take over 3.4 s: {span:?}"
    );
}
