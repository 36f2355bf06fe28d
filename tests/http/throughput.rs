//! Throughput of HTTP sources from the local test server: a measurement
//! that prints its figures, not a timed assertion (machines differ).
//!
//! ```text
//! cargo test --release --test integration http::throughput -- --ignored --nocapture
//! ```

use std::path::Path;
use std::time::Instant;

use tidemark_core::Pipeline;
use tidemark_extract::SourceReader;

use super::api::{ids, Api};
use super::case::{Case, Source, QUICK_RETRY};

const RECORDS: usize = 100_000;
const DAY: &str = "2024-06-01";

fn settings(base: &str, page_size: usize) -> String {
    format!(
        r#"url = "{base}/page"
format = "json"
query = {{ day = "{{period.start:%Y-%m-%d}}" }}
records = "/data"
pagination = {{ style = "page", size_param = "per_page", size = {page_size} }}"#
    )
}

/// Extract alone, in process: fetch, decode and batch every record.
async fn extract_only(api: &Api, page_size: usize) -> (usize, f64) {
    let text = format!(
        "name = \"orders\"\nexport_type = \"t\"\n[period]\ngranularity = \"day\"\n[[sources]]\nid = \"api\"\ntransport = \"http\"\n{}\n[fields]\nid = {{ type = \"text\" }}\n[load]\ntable = \"orders\"\nkey = [\"id\"]\nbatch_size = 10000\n",
        settings(&api.base, page_size)
    );
    let pipeline = Pipeline::parse(&text, Path::new("throughput.toml")).unwrap();
    let period = pipeline.period(DAY).unwrap();
    let started = Instant::now();
    let mut reader = SourceReader::open(&pipeline, &pipeline.spec.sources[0], &period, None, None)
        .await
        .unwrap();
    let mut read = 0;
    while let Some(batch) = reader.next_batch().await.unwrap() {
        read += batch.records.len();
    }
    (read, started.elapsed().as_secs_f64())
}

#[test]
#[ignore = "a measurement; run with --ignored --nocapture (best with --release)"]
fn records_per_second_through_http() {
    let api = Api::start(|_| RECORDS, None);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let mut figures = Vec::new();
    for page_size in [100, 1000, 10_000] {
        let before = api.hits().len();
        let (read, secs) = runtime.block_on(extract_only(&api, page_size));
        assert_eq!(read, RECORDS);
        let pages = api.hits().len() - before;
        figures.push((page_size, pages, secs));
        eprintln!(
            "extract only, pages of {page_size:>6}: {pages:>4} requests, {secs:.3} s, {:>9.0} records/s",
            read as f64 / secs
        );
    }
    // Per-page overhead: the extra time of the small pages over the large ones.
    let (small, large) = (figures[0], figures[2]);
    let per_page = (small.2 - large.2) / (small.1 - large.1) as f64;
    eprintln!(
        "per-page overhead (pages of 100 vs 10,000): {:.3} ms",
        per_page * 1000.0
    );

    let case = Case::new();
    case.pipeline(&Source {
        settings: &settings(&api.base, 1000),
        batch_size: 10_000,
        retry: QUICK_RETRY,
    });
    let started = Instant::now();
    case.run(&["run", "orders", "--period", DAY])
        .expect_code(0, "run");
    let secs = started.elapsed().as_secs_f64();
    eprintln!(
        "end to end (tidemark run, pages of 1000, SQLite): {RECORDS} records in {secs:.2} s, {:.0} records/s",
        RECORDS as f64 / secs
    );
    assert_eq!(
        case.query("SELECT CAST(count(*) AS TEXT) FROM orders"),
        [RECORDS.to_string()]
    );
    let mut expected = ids(DAY, RECORDS);
    expected.sort();
    assert!(
        case.ids(DAY) == expected,
        "the loaded ids differ from the source's"
    );
}
