//! Unit tests: Link and Retry-After parsing, the pagination state machine,
//! secret handling, and the reader against a small loopback server.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::TimeZone;
use serde_json::{json, Value};
use tidemark_core::spec::{Pagination, SourceSpec};
use tidemark_core::{ErrorClass, RawData};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::paging::{self, PageRequest};
use super::secrets::Secrets;
use super::*;

// ---------------------------------------------------------------- parsing

#[test]
fn link_header_next_is_found_among_other_relations() {
    let header = r#"<https://api.example/orders?page=1>; rel="first", <https://api.example/orders?page=3>; rel="next""#;
    assert_eq!(
        paging::next_link([header]).as_deref(),
        Some("https://api.example/orders?page=3")
    );
    // Relation lists, odd case, token values, extra parameters, several header lines.
    assert_eq!(
        paging::next_link(["</p/2>; title=\"a, b; c\"; rel=\"last NEXT\""]).as_deref(),
        Some("/p/2")
    );
    assert_eq!(
        paging::next_link(["<a>; rel=prev", "<b>;rel=next"]).as_deref(),
        Some("b")
    );
    assert_eq!(paging::next_link(["<a>; rel=\"prev\""]), None);
    assert_eq!(paging::next_link(std::iter::empty()), None);
}

#[test]
fn malformed_links_are_skipped_not_fatal() {
    assert_eq!(
        paging::next_link(["garbage, <ok>; rel=next"]).as_deref(),
        Some("ok")
    );
    assert_eq!(paging::next_link(["<unclosed; rel=next"]), None);
    assert_eq!(paging::next_link(["<x>; rel=\"next"]), None);
    let links = paging::parse_links("<a>; rel=next; rel=prev");
    assert_eq!(
        links[0].rels,
        ["next"],
        "only the first rel parameter counts"
    );
}

#[test]
fn retry_after_accepts_seconds_and_all_http_date_forms() {
    let now = chrono::Utc.with_ymd_and_hms(1994, 11, 6, 8, 49, 0).unwrap();
    let secs = Duration::from_secs;
    assert_eq!(retry_after::parse("1", now), Some(secs(1)));
    assert_eq!(retry_after::parse(" 120 ", now), Some(secs(120)));
    assert_eq!(
        retry_after::parse("99999999999999999999999", now),
        Some(secs(u64::MAX))
    );
    assert_eq!(
        retry_after::parse("Sun, 06 Nov 1994 08:49:37 GMT", now),
        Some(secs(37))
    );
    assert_eq!(
        retry_after::parse("Sunday, 06-Nov-94 08:49:37 GMT", now),
        Some(secs(37))
    );
    assert_eq!(
        retry_after::parse("Sun Nov  6 08:49:37 1994", now),
        Some(secs(37))
    );
    assert_eq!(
        retry_after::parse("Sun, 06 Nov 1994 08:00:00 GMT", now),
        Some(Duration::ZERO),
        "past dates mean now"
    );
    assert_eq!(retry_after::parse("-1", now), None);
    assert_eq!(retry_after::parse("soon", now), None);
    assert_eq!(retry_after::parse("", now), None);
}

// ------------------------------------------------------- pagination logic

fn page_style(size: Option<u64>) -> Pagination {
    Pagination::Page {
        param: "page".into(),
        size_param: Some("per_page".into()),
        size,
        start: 1,
    }
}

#[test]
fn page_style_stops_on_a_short_or_empty_page() {
    let p = page_style(Some(3));
    let first = paging::first(&p);
    assert_eq!(first, PageRequest::Page { page: 1 });
    assert_eq!(
        paging::query_params(&p, &first),
        [
            ("page".to_string(), "1".to_string()),
            ("per_page".to_string(), "3".to_string())
        ]
    );
    assert_eq!(
        paging::after_count(&p, &first, 3),
        Some(PageRequest::Page { page: 2 })
    );
    assert_eq!(paging::after_count(&p, &first, 2), None);
    assert_eq!(paging::after_count(&p, &first, 0), None);
    // Without a size, only an empty page ends the period.
    let unsized_pages = page_style(None);
    assert_eq!(
        paging::after_count(&unsized_pages, &first, 1),
        Some(PageRequest::Page { page: 2 })
    );
    assert_eq!(paging::after_count(&unsized_pages, &first, 0), None);
    let zero_based = Pagination::Page {
        param: "p".into(),
        size_param: None,
        size: None,
        start: 0,
    };
    assert_eq!(paging::first(&zero_based), PageRequest::Page { page: 0 });
}

#[test]
fn offset_style_advances_by_records_received() {
    let p = Pagination::Offset {
        param: "offset".into(),
        size_param: Some("limit".into()),
        size: 100,
    };
    let first = paging::first(&p);
    assert_eq!(first, PageRequest::Offset { offset: 0 });
    assert_eq!(
        paging::after_count(&p, &first, 100),
        Some(PageRequest::Offset { offset: 100 })
    );
    assert_eq!(
        paging::after_count(&p, &PageRequest::Offset { offset: 100 }, 99),
        None
    );
    assert_eq!(paging::param_names(&p), ["offset", "limit"]);
}

#[test]
fn cursor_style_follows_the_pointer_until_it_is_gone() {
    let first = PageRequest::Cursor { cursor: None };
    let next = |doc: Value| paging::after_cursor("/meta/next", &doc);
    assert_eq!(
        next(json!({"meta": {"next": "abc"}})),
        Ok(Some(PageRequest::Cursor {
            cursor: Some("abc".into())
        }))
    );
    assert_eq!(
        next(json!({"meta": {"next": 42}})),
        Ok(Some(PageRequest::Cursor {
            cursor: Some("42".into())
        }))
    );
    assert_eq!(next(json!({"meta": {"next": null}})), Ok(None));
    assert_eq!(next(json!({"meta": {"next": ""}})), Ok(None));
    assert_eq!(next(json!({"meta": {}})), Ok(None));
    assert!(next(json!({"meta": {"next": {"id": 1}}}))
        .unwrap_err()
        .contains("an object"));
    let same = PageRequest::Cursor {
        cursor: Some("abc".into()),
    };
    let cursor = Pagination::Cursor {
        cursor: "/next".into(),
        param: "after".into(),
    };
    assert!(
        paging::query_params(&cursor, &first).is_empty(),
        "the first request has no cursor"
    );
    assert_eq!(
        paging::query_params(&cursor, &same),
        [("after".to_string(), "abc".to_string())]
    );
}

#[test]
fn checkpoint_styles_must_match_the_configuration() {
    assert!(paging::same_style(
        &Pagination::LinkHeader,
        &PageRequest::LinkHeader { url: None }
    ));
    assert!(!paging::same_style(
        &page_style(None),
        &PageRequest::Offset { offset: 0 }
    ));
    assert!(!paging::same_style(
        &Pagination::None,
        &PageRequest::Page { page: 1 }
    ));
}

// ---------------------------------------------------------------- secrets

#[test]
fn secrets_are_redacted_in_every_form_and_sealed_reversibly() {
    let mut secrets = Secrets::default();
    secrets.add("TOKEN", "s3cr et+/");
    secrets.add("EMPTY", "");
    let encoded = "s3cr+et%2B%2F";
    let text = format!("Bearer s3cr et+/ and https://x/?k={encoded}");
    assert_eq!(secrets.redact(&text), "Bearer *** and https://x/?k=***");
    let sealed = secrets.seal(&format!("https://x/?k={encoded}&raw=s3cr et+/"));
    assert!(!sealed.contains("s3cr"), "{sealed}");
    assert_eq!(
        secrets.unseal(&sealed),
        format!("https://x/?k={encoded}&raw=s3cr et+/")
    );
    assert!(!format!("{secrets:?}").contains("s3cr"));
}

#[test]
fn secrets_are_found_in_any_spelling_and_mix_of_spellings() {
    let secret = "my secret\"+%/t\u{f6}k";
    let mut secrets = Secrets::default();
    secrets.add("KEY", secret);
    let spellings = [
        secret.to_string(),
        "my+secret%22%2B%25%2Ft%C3%B6k".to_string(), // form-encoded
        "my%20secret%22%2B%25%2Ft%C3%B6k".to_string(), // percent, upper case
        "my%20secret%22%2b%25%2ft%c3%b6k".to_string(), // percent, lower case
        "my%20secret%22+%/t%C3%b6k".to_string(),     // a server's own mix
        "my%2520secret%2522%252B%2525%252Ft%25C3%25B6k".to_string(), // encoded twice
        "my secret\\\"+%\\/t\\u00f6k".to_string(),   // JSON
        "my secret\\\"+%/t\\u{f6}k".to_string(),     // Rust debug
        format!("{secret:?}").trim_matches('"').to_string(),
    ];
    for spelled in &spellings {
        let text = format!("GET http://h/404/{spelled}/x?k={spelled}: HTTP 404");
        assert_eq!(
            secrets.redact(&text),
            "GET http://h/404/***/x?k=***: HTTP 404",
            "{spelled}"
        );
        let sealed = secrets.seal(&text);
        assert!(
            !sealed.contains("secret") && !sealed.contains("t%"),
            "{sealed}"
        );
        assert_eq!(
            secrets.show_sealed(&sealed),
            "GET http://h/404/***/x?k=***: HTTP 404"
        );
    }
    // The forms a URL builder writes come back exactly; any other spelling
    // comes back percent-encoded, which a URL decoder reads the same.
    for exact in &spellings[..4] {
        assert_eq!(secrets.unseal(&secrets.seal(exact)), *exact);
    }
    assert_eq!(secrets.unseal(&secrets.seal(&spellings[4])), spellings[2]);
    // Text around a secret, and text that only starts like one, stays.
    assert_eq!(
        secrets.redact("my secret\"+% is not it"),
        "my secret\"+% is not it"
    );
    assert_eq!(secrets.redact("tök"), "tök");
}

// ------------------------------------------------- reader against a server

/// What the test server answers to one request.
#[derive(Clone)]
enum Reply {
    Ok {
        headers: Vec<(String, String)>,
        body: String,
    },
    Status(u16, Vec<(String, String)>, String),
    /// Headers announce the whole body, then the connection closes half-way.
    Truncated(String),
    /// No `Content-Length`, the connection closes after part of the body.
    CloseDelimited(String),
    /// These bytes as the whole response (status line, head and body),
    /// then the connection closes.
    Raw(Vec<u8>),
}

fn ok(body: impl Into<String>) -> Reply {
    Reply::Ok {
        headers: Vec::new(),
        body: body.into(),
    }
}

type Handler = Arc<dyn Fn(&str, usize) -> Reply + Send + Sync>;

/// A loopback HTTP/1.1 server; `handler(target, nth request for target)`.
struct Server {
    base: String,
    hits: Arc<Mutex<Vec<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Server {
    async fn start(handler: impl Fn(&str, usize) -> Reply + Send + Sync + 'static) -> Server {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let hits = Arc::new(Mutex::new(Vec::new()));
        let handler: Handler = Arc::new(handler);
        let seen = Arc::clone(&hits);
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(serve(stream, Arc::clone(&handler), Arc::clone(&seen)));
            }
        });
        Server { base, hits, task }
    }

    fn hits(&self) -> Vec<String> {
        self.hits.lock().unwrap().clone()
    }
}

async fn serve(mut stream: tokio::net::TcpStream, handler: Handler, hits: Arc<Mutex<Vec<String>>>) {
    let mut buf = Vec::new();
    loop {
        let Some(end) = read_head(&mut stream, &mut buf).await else {
            return;
        };
        let head = String::from_utf8_lossy(&buf[..end]).to_string();
        buf.drain(..end + 4);
        let target = head.split_whitespace().nth(1).unwrap_or("/").to_string();
        let nth = {
            let mut hits = hits.lock().unwrap();
            hits.push(head);
            hits.iter()
                .filter(|h| h.split_whitespace().nth(1) == Some(target.as_str()))
                .count()
        };
        let keep_open = match handler(&target, nth) {
            Reply::Ok { headers, body } => respond(&mut stream, 200, &headers, &body).await,
            Reply::Status(code, headers, body) => respond(&mut stream, code, &headers, &body).await,
            Reply::Truncated(body) => {
                let head = format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n", body.len());
                let _ = stream.write_all(head.as_bytes()).await;
                let _ = stream.write_all(&body.as_bytes()[..body.len() / 2]).await;
                false
            }
            Reply::Raw(bytes) => {
                let _ = stream.write_all(&bytes).await;
                false
            }
            Reply::CloseDelimited(body) => {
                let _ = stream
                    .write_all(b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\n")
                    .await;
                let _ = stream.write_all(&body.as_bytes()[..body.len() / 2]).await;
                false
            }
        };
        if !keep_open {
            return;
        }
    }
}

async fn read_head(stream: &mut tokio::net::TcpStream, buf: &mut Vec<u8>) -> Option<usize> {
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            return Some(end);
        }
        let mut chunk = [0u8; 4096];
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

async fn respond(
    stream: &mut tokio::net::TcpStream,
    code: u16,
    headers: &[(String, String)],
    body: &str,
) -> bool {
    let mut head = format!("HTTP/1.1 {code} X\r\ncontent-length: {}\r\n", body.len());
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes()).await.is_ok()
        && stream.write_all(body.as_bytes()).await.is_ok()
}

fn pipeline(source: &str, batch_size: usize) -> Pipeline {
    let text = format!(
        r#"
name = "orders"
export_type = "orders_daily"

[period]
granularity = "day"

[[sources]]
id = "api"
transport = "http"
{source}

[fields]
id = {{ type = "int" }}

[load]
table = "orders"
key = ["id"]
batch_size = {batch_size}

[retry]
max_attempts = 3
base_delay = "1ms"
max_delay = "5ms"
"#
    );
    Pipeline::parse(&text, std::path::Path::new("p.toml")).unwrap()
}

fn spec(pipeline: &Pipeline) -> &HttpSourceSpec {
    match &pipeline.spec.sources[0] {
        SourceSpec::Http(spec) => spec,
        other => panic!("expected an http source, got {other:?}"),
    }
}

fn day() -> Period {
    Period::parse(
        "2024-03-07",
        tidemark_core::Granularity::Day,
        chrono_tz::UTC,
    )
    .unwrap()
}

async fn open(p: &Pipeline, resume: Option<&Checkpoint>) -> Result<HttpReader, Error> {
    HttpReader::open(p, spec(p), &day(), resume, None).await
}

/// Every batch: its record ids and its checkpoint.
async fn drain(reader: &mut HttpReader) -> Result<Vec<(Vec<i64>, Checkpoint)>, Error> {
    let mut out = Vec::new();
    while let Some(batch) = reader.next_batch().await? {
        let ids = batch.records.iter().map(id).collect();
        out.push((ids, batch.checkpoint));
    }
    Ok(out)
}

fn id(record: &RawRecord) -> i64 {
    match &record.data {
        RawData::Json(v) => v["id"].as_i64().unwrap(),
        RawData::Csv { row, .. } => row[0].parse().unwrap(),
        RawData::Malformed { raw, error } => panic!("malformed record {raw:?}: {error}"),
    }
}

/// Seven records, pages of three: `?page=N` → `{"data": [...]}`.
fn seven_in_pages_of_three(target: &str, _: usize) -> Reply {
    let page: i64 = target
        .split("page=")
        .nth(1)
        .and_then(|s| s[..1].parse().ok())
        .unwrap_or(1);
    let ids: Vec<i64> = ((page - 1) * 3 + 1..=(page * 3).min(7)).collect();
    let data: Vec<Value> = ids.iter().map(|i| json!({"id": i})).collect();
    ok(json!({ "data": data }).to_string())
}

const PAGED: &str = r#"format = "json"
records = "/data"
pagination = { style = "page", param = "page", size_param = "per_page", size = 3 }"#;

fn paged_source(server: &Server) -> String {
    format!("url = \"{}/orders\"\n{PAGED}", server.base)
}

#[tokio::test]
async fn batches_span_pages_and_checkpoints_name_the_page_in_progress() {
    let server = Server::start(seven_in_pages_of_three).await;
    let p = pipeline(&paged_source(&server), 2);
    let batches = drain(&mut open(&p, None).await.unwrap()).await.unwrap();
    let ids: Vec<_> = batches.iter().map(|(ids, _)| ids.clone()).collect();
    assert_eq!(ids, [vec![1, 2], vec![3, 4], vec![5, 6], vec![7]]);
    let cp = |i: usize| batches[i].1.clone();
    assert_eq!(
        cp(0),
        json!({"v": 2, "kind": "http", "page": {"number": 1, "style": "page", "page": 1}, "records": 2, "digest": digest(&[1, 2])})
    );
    assert_eq!(
        cp(1),
        json!({"v": 2, "kind": "http", "page": {"number": 2, "style": "page", "page": 2}, "records": 1, "digest": digest(&[4])})
    );
    // Page 2 ended with the batch: the checkpoint already names page 3.
    assert_eq!(
        cp(2),
        json!({"v": 2, "kind": "http", "page": {"number": 3, "style": "page", "page": 3}, "records": 0})
    );
    assert_eq!(
        cp(3),
        json!({"v": 2, "kind": "http", "done": true, "records": 0})
    );
    assert_eq!(server.hits().len(), 3, "page 3 is short: no fourth request");
}

/// The hash a checkpoint names the records `{"id": N}` of a page by.
fn digest(ids: &[i64]) -> String {
    let mut hasher = xxhash_rust::xxh3::Xxh3::new();
    for id in ids {
        let record = RawRecord {
            data: RawData::Json(json!({ "id": id })),
            origin: tidemark_core::Origin {
                resource: Arc::from("x"),
                page: None,
                record: 1,
                line: None,
            },
        };
        absorb_record(&mut hasher, &record);
    }
    format!("{:016x}", hasher.digest())
}

#[tokio::test]
async fn resuming_fetches_only_the_page_in_progress() {
    let server = Server::start(seven_in_pages_of_three).await;
    let p = pipeline(&paged_source(&server), 2);
    let resume = json!({"v": 2, "kind": "http", "page": {"number": 2, "style": "page", "page": 2}, "records": 1, "digest": digest(&[4])});
    let batches = drain(&mut open(&p, Some(&resume)).await.unwrap())
        .await
        .unwrap();
    let ids: Vec<i64> = batches.into_iter().flat_map(|(ids, _)| ids).collect();
    assert_eq!(ids, [5, 6, 7]);
    let targets: Vec<String> = server
        .hits()
        .iter()
        .map(|h| h.split_whitespace().nth(1).unwrap().to_string())
        .collect();
    assert_eq!(
        targets,
        ["/orders?page=2&per_page=3", "/orders?page=3&per_page=3"]
    );
}

#[tokio::test]
async fn resuming_after_the_last_page_fetches_nothing() {
    let server = Server::start(seven_in_pages_of_three).await;
    let p = pipeline(&paged_source(&server), 2);
    let done = json!({"v": 2, "kind": "http", "done": true, "records": 0});
    assert!(open(&p, Some(&done))
        .await
        .unwrap()
        .next_batch()
        .await
        .unwrap()
        .is_none());
    assert!(server.hits().is_empty());
}

#[tokio::test]
async fn checkpoints_that_do_not_fit_are_invariant_errors() {
    let server = Server::start(seven_in_pages_of_three).await;
    let p = pipeline(&paged_source(&server), 2);
    let file_cp = json!({"v": 2, "kind": "file", "file_index": 0, "file": "a", "records": 1});
    let other_style = json!({"v": 2, "kind": "http", "page": {"number": 1, "style": "offset", "offset": 0}, "records": 0});
    let past_the_end = json!({"v": 2, "kind": "http", "page": {"number": 3, "style": "page", "page": 3}, "records": 5, "digest": digest(&[7])});
    let older = json!({"v": 1, "kind": "http", "page": {"number": 2, "style": "page", "page": 2}, "records": 1});
    let no_digest = json!({"v": 2, "kind": "http", "page": {"number": 2, "style": "page", "page": 2}, "records": 1});
    let changed = json!({"v": 2, "kind": "http", "page": {"number": 2, "style": "page", "page": 2}, "records": 1, "digest": digest(&[5])});
    for cp in [
        file_cp,
        other_style,
        past_the_end,
        older,
        no_digest,
        changed,
    ] {
        let err = open(&p, Some(&cp)).await.unwrap_err();
        assert!(matches!(err, Error::StaleCheckpoint(_)), "{cp}: {err:?}");
    }
}

#[tokio::test]
async fn cursor_and_link_header_styles_follow_the_server() {
    let server = Server::start(|target, _| match target {
        "/c" => ok(r#"{"items": [{"id": 1}, {"id": 2}], "next": "x1"}"#),
        "/c?after=x1" => ok(r#"{"items": [{"id": 3}], "next": null}"#),
        "/l" => Reply::Ok {
            headers: vec![("link".into(), "</l2?k=v>; rel=\"next\"".into())],
            body: "{\"id\":1}\n{\"id\":2}\n".into(),
        },
        "/l2?k=v" => ok("{\"id\":3}"),
        other => Reply::Status(404, Vec::new(), format!("no {other}")),
    })
    .await;
    let cursor = format!(
        "url = \"{}/c\"\nformat = \"json\"\nrecords = \"/items\"\npagination = {{ style = \"cursor\", cursor = \"/next\", param = \"after\" }}",
        server.base
    );
    let batches = drain(&mut open(&pipeline(&cursor, 10), None).await.unwrap())
        .await
        .unwrap();
    assert_eq!(batches[0].0, [1, 2, 3]);
    let link = format!(
        "url = \"{}/l\"\nformat = \"ndjson\"\npagination = {{ style = \"link_header\" }}",
        server.base
    );
    let batches = drain(&mut open(&pipeline(&link, 2), None).await.unwrap())
        .await
        .unwrap();
    let ids: Vec<_> = batches.iter().map(|(ids, _)| ids.clone()).collect();
    assert_eq!(ids, [vec![1, 2], vec![3]]);
    let next = format!("{}/l2?k=v", server.base);
    assert_eq!(
        batches[0].1["page"],
        json!({"number": 2, "style": "link_header", "url": next})
    );
}

#[tokio::test]
async fn transient_failures_are_retried_and_truncation_counts_as_one() {
    let body = json!({"data": [{"id": 1}, {"id": 2}]}).to_string();
    let server = Server::start(move |_, nth| match nth {
        1 => Reply::Status(503, vec![("retry-after".into(), "0".into())], "busy".into()),
        2 => Reply::Truncated(body.clone()),
        _ => ok(body.clone()),
    })
    .await;
    let source = format!(
        "url = \"{}/o\"\nformat = \"json\"\nrecords = \"/data\"",
        server.base
    );
    let mut p = pipeline(&source, 10);
    p.retry.max_attempts = 4;
    let batches = drain(&mut open(&p, None).await.unwrap()).await.unwrap();
    assert_eq!(batches[0].0, [1, 2]);
    assert_eq!(server.hits().len(), 3);
}

/// A body the transport delivered whole is decoded as it is: a JSON
/// document cut inside (complete per `Content-Length`, or ended by the
/// server closing a connection that declared no length) is bad data, not
/// a failed transfer, and is never retried.
#[tokio::test]
async fn a_complete_body_with_cut_json_is_a_parse_error_after_one_request() {
    for reply in [
        ok("[{\"id\":1},{\"id\":"),
        Reply::CloseDelimited("[{\"id\":1},{\"id\":2}]xx".into()),
    ] {
        let server = Server::start(move |_, _| reply.clone()).await;
        let source = format!("url = \"{}/o\"\nformat = \"json\"", server.base);
        let err = drain(&mut open(&pipeline(&source, 10), None).await.unwrap())
            .await
            .unwrap_err();
        assert_eq!(err.class(), ErrorClass::Parse, "{err}");
        assert_eq!(server.hits().len(), 1, "{err}");
    }
}

#[tokio::test]
async fn exhausted_retries_end_as_a_permanent_source_error() {
    let server =
        Server::start(|_, _| Reply::Status(503, Vec::new(), "down for maintenance".into())).await;
    let source = format!("url = \"{}/o\"\nformat = \"json\"", server.base);
    let err = drain(&mut open(&pipeline(&source, 10), None).await.unwrap())
        .await
        .unwrap_err();
    assert_eq!(err.class(), ErrorClass::Source);
    assert!(
        !err.is_transient(),
        "the runner must not retry on top: {err}"
    );
    let message = err.to_string();
    assert!(
        message.contains("503") && message.contains("gave up after 3 attempts"),
        "{message}"
    );
    assert!(message.contains("down for maintenance"), "{message}");
    assert_eq!(server.hits().len(), 3);
}

#[tokio::test]
async fn client_errors_fail_at_once_with_url_and_status_but_no_secret() {
    std::env::set_var("TM_UNIT_TOKEN", "tok-123456");
    let server =
        Server::start(|_, _| Reply::Status(401, Vec::new(), "bad token tok-123456".into())).await;
    let source = format!(
        "url = \"{}/o\"\nformat = \"json\"\nquery = {{ key = \"${{TM_UNIT_TOKEN}}\", day = \"{{period.start:%Y-%m-%d}}\" }}\nheaders = {{ Authorization = \"Bearer ${{TM_UNIT_TOKEN}}\" }}",
        server.base
    );
    let p = pipeline(&source, 10);
    let mut reader = open(&p, None).await.unwrap();
    assert!(!format!("{reader:?}").contains("tok-123456"));
    let err = reader.next_batch().await.unwrap_err();
    let message = err.to_string();
    assert!(!err.is_transient());
    assert_eq!(
        message,
        format!(
            "GET {}/o?key=***&day=2024-03-07: HTTP 401 Unauthorized: bad token ***",
            server.base
        )
    );
    assert_eq!(server.hits().len(), 1);
    assert!(
        server.hits()[0].contains("authorization: Bearer tok-123456"),
        "the token is sent"
    );
    // The reader is fused: the same error again, no new request.
    assert_eq!(reader.next_batch().await.unwrap_err().to_string(), message);
    assert_eq!(server.hits().len(), 1);
}

#[tokio::test]
async fn malformed_json_is_a_parse_error_at_page_and_position() {
    let server = Server::start(|target, _| match target {
        "/o?page=1&per_page=3" => ok(r#"{"data": [{"id": 1}, {"id": 2}, {"id": 3}]}"#),
        _ => ok("{\"data\": [{\"id\": 4},\n {\"id\": 5,, }]}"),
    })
    .await;
    let source = format!("url = \"{}/o\"\n{PAGED}", server.base);
    let mut reader = open(&pipeline(&source, 3), None).await.unwrap();
    assert_eq!(reader.next_batch().await.unwrap().unwrap().records.len(), 3);
    let err = reader.next_batch().await.unwrap_err();
    assert_eq!(err.class(), ErrorClass::Parse);
    let message = err.to_string();
    assert!(
        message.contains("page 2") && message.contains("line 2 column 11"),
        "{message}"
    );
    assert_eq!(
        server.hits().len(),
        2,
        "no retry for a complete but malformed page"
    );
}

#[tokio::test]
async fn csv_pages_and_an_empty_period() {
    let server = Server::start(|target, _| match target {
        "/csv" => ok("id,name\n1,a\n2,b\n"),
        _ => Reply::Status(204, Vec::new(), String::new()),
    })
    .await;
    let csv = format!("url = \"{}/csv\"\nformat = \"csv\"", server.base);
    let batches = drain(&mut open(&pipeline(&csv, 10), None).await.unwrap())
        .await
        .unwrap();
    assert_eq!(batches[0].0, [1, 2]);
    assert_eq!(batches[0].1["done"], json!(true));
    let empty = format!("url = \"{}/none\"\nformat = \"json\"", server.base);
    assert!(drain(&mut open(&pipeline(&empty, 10), None).await.unwrap())
        .await
        .unwrap()
        .is_empty());
}

/// A CSV page that ends inside a quoted field breaks the page like a file;
/// a row with the wrong number of fields is a malformed record, and an
/// NDJSON line that is not JSON too, each located by its page.
#[tokio::test]
async fn csv_and_ndjson_pages_keep_the_file_rules() {
    let server = Server::start(|target, _| match target {
        "/open" => ok("id,note\n1,ok\n2,\"he said\n3,x\n"),
        "/rows" => ok("id,note\n1,ok\n2\n3,x\n"),
        _ => ok("{\"id\":1}\nNaN\n{\"id\":3}\n"),
    })
    .await;
    let csv = |path: &str| format!("url = \"{}{path}\"\nformat = \"csv\"", server.base);
    let err = drain(&mut open(&pipeline(&csv("/open"), 10), None).await.unwrap())
        .await
        .unwrap_err();
    assert_eq!(err.class(), ErrorClass::Parse);
    let message = err.to_string();
    assert!(
        message.contains("page 1") && message.contains("line 3"),
        "{message}"
    );
    for (path, format, line) in [("/rows", "csv", 3), ("/nd", "ndjson", 2)] {
        let source = format!("url = \"{}{path}\"\nformat = \"{format}\"", server.base);
        let mut reader = open(&pipeline(&source, 10), None).await.unwrap();
        let batch = reader.next_batch().await.unwrap().unwrap();
        assert_eq!(batch.records.len(), 3, "{path}");
        match &batch.records[1].data {
            RawData::Malformed { error, .. } => {
                let message = error.to_string();
                let at = format!("page 1 row 2 (line {line})");
                assert!(message.contains(&at), "{message}");
            }
            other => panic!("{path}: expected a malformed record, got {other:?}"),
        }
    }
    assert_eq!(server.hits().len(), 3, "nothing was retried");
}

#[tokio::test]
async fn first_page_counts_records_without_reading_on() {
    let server = Server::start(seven_in_pages_of_three).await;
    let p = pipeline(&paged_source(&server), 2);
    let first = HttpReader::first_page(&p, spec(&p), &day()).await.unwrap();
    assert_eq!(first.records, 3);
    assert_eq!(first.first.as_ref().map(id), Some(1));
    assert_eq!(
        first.resource,
        format!("{}/orders?page=1&per_page=3", server.base)
    );
    assert_eq!(server.hits().len(), 1);
}

#[tokio::test]
async fn bad_configuration_is_a_config_error() {
    let cursor_csv = "url = \"http://127.0.0.1:9/x\"\nformat = \"csv\"\npagination = { style = \"cursor\", cursor = \"/n\", param = \"c\" }";
    let clash = "url = \"http://127.0.0.1:9/x\"\nformat = \"json\"\nquery = { page = \"1\" }\npagination = { style = \"page\" }";
    let scheme = "url = \"ftp://127.0.0.1:9/x\"\nformat = \"json\"";
    for source in [cursor_csv, clash, scheme] {
        let err = open(&pipeline(source, 10), None).await.unwrap_err();
        assert_eq!(err.class(), ErrorClass::Config, "{source}: {err}");
    }
}

#[tokio::test]
async fn redirects_leave_the_origin_only_without_secret_headers() {
    std::env::set_var("TM_UNIT_REDIRECT_KEY", "rk-998877");
    // `localhost` is another origin than `127.0.0.1`, on the same server.
    let other_origin = Arc::new(std::sync::OnceLock::<String>::new());
    let location = Arc::clone(&other_origin);
    let server = Server::start(move |target, _| match target {
        "/same" => Reply::Status(302, vec![("location".into(), "/o".into())], String::new()),
        "/away" => {
            let to = format!("{}/o", location.get().unwrap());
            Reply::Status(302, vec![("location".into(), to)], String::new())
        }
        _ => ok(r#"[{"id": 1}]"#),
    })
    .await;
    other_origin
        .set(server.base.replace("127.0.0.1", "localhost"))
        .unwrap();
    let source = |path: &str, key: bool| {
        let header = if key {
            "\nheaders = { X-Api-Key = \"${TM_UNIT_REDIRECT_KEY}\" }"
        } else {
            ""
        };
        pipeline(
            &format!("url = \"{}{path}\"\nformat = \"json\"{header}", server.base),
            10,
        )
    };
    let ids = |batches: Vec<(Vec<i64>, Checkpoint)>| {
        batches.into_iter().flat_map(|b| b.0).collect::<Vec<_>>()
    };
    assert_eq!(
        ids(
            drain(&mut open(&source("/same", true), None).await.unwrap())
                .await
                .unwrap()
        ),
        [1]
    );
    assert_eq!(
        ids(
            drain(&mut open(&source("/away", false), None).await.unwrap())
                .await
                .unwrap()
        ),
        [1]
    );
    let err = drain(&mut open(&source("/away", true), None).await.unwrap())
        .await
        .unwrap_err();
    assert!(!err.is_transient());
    assert!(
        err.to_string()
            .contains("HTTP 302 Found (redirect to http://localhost:"),
        "{err}"
    );
    assert!(err.to_string().contains("not followed"), "{err}");
}

/// Item 12 of issue 19: a body that arrived whole but that some layer
/// cannot decode is a parse error after one request, whatever the layer
/// (gzip, chunked framing, an encoding tidemark does not decode, the JSON
/// itself); a body the transport cut is retried.
#[tokio::test]
async fn an_undecodable_body_is_a_parse_error_and_only_a_cut_body_is_retried() {
    use std::io::Write as _;
    let json = br#"{"data":[{"id":1}]}"#.to_vec();
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    encoder.write_all(&json).unwrap();
    let gzip = encoder.finish().unwrap();
    let mut corrupt = gzip.clone();
    let n = corrupt.len();
    corrupt[12..n - 8].iter_mut().for_each(|b| *b ^= 0x5a);
    let short_stream = gzip[..gzip.len() - 10].to_vec();
    let latin1 = b"{\"data\":[{\"id\":\"\xe9\"}]}".to_vec();
    let full = |body: &[u8], extra: &str| {
        let head = format!(
            "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n{extra}\r\n",
            body.len()
        );
        [head.as_bytes(), body].concat()
    };
    let cut = |body: &[u8], extra: &str| {
        let head = format!(
            "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n{extra}\r\n",
            body.len()
        );
        [head.as_bytes(), &body[..body.len() / 2]].concat()
    };
    let gz = "content-encoding: gzip\r\n";
    let chunked = |rest: &str| {
        format!("HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n{rest}").into_bytes()
    };
    let cases: Vec<(&str, Vec<u8>, ErrorClass, usize)> = vec![
        ("corrupt gzip", full(&corrupt, gz), ErrorClass::Parse, 1),
        (
            "gzip stream ending inside a complete body",
            full(&short_stream, gz),
            ErrorClass::Parse,
            1,
        ),
        (
            "garbage chunked framing",
            chunked("zz\r\nabc\r\n0\r\n\r\n"),
            ErrorClass::Parse,
            1,
        ),
        (
            "br",
            full(&json, "content-encoding: br\r\n"),
            ErrorClass::Parse,
            1,
        ),
        (
            "deflate",
            full(&json, "content-encoding: deflate\r\n"),
            ErrorClass::Parse,
            1,
        ),
        (
            "latin-1 JSON",
            full(
                &latin1,
                "content-type: application/json; charset=iso-8859-1\r\n",
            ),
            ErrorClass::Parse,
            1,
        ),
        (
            "gzip cut by the transport",
            cut(&gzip, gz),
            ErrorClass::Source,
            3,
        ),
        (
            "plain body cut by the transport",
            cut(&json, ""),
            ErrorClass::Source,
            3,
        ),
        (
            "chunked body cut by the transport",
            chunked("5\r\n{\"dat"),
            ErrorClass::Source,
            3,
        ),
    ];
    for (name, bytes, class, requests) in cases {
        let server = Server::start(move |_, _| Reply::Raw(bytes.clone())).await;
        let source = format!(
            "url = \"{}/o\"\nformat = \"json\"\nrecords = \"/data\"",
            server.base
        );
        let err = drain(&mut open(&pipeline(&source, 10), None).await.unwrap())
            .await
            .expect_err(name);
        assert_eq!(
            (err.class(), server.hits().len()),
            (class, requests),
            "{name}: {err}"
        );
        assert!(
            !err.is_transient(),
            "{name}: the runner must not retry on top: {err}"
        );
        if class == ErrorClass::Parse {
            assert!(err.to_string().contains("/o page 1"), "{name}: {err}");
        }
    }
}

/// Issue 24 item 3: an NDJSON page is streamed: its first batch is handed
/// out before the body passes `max_page_bytes`, and passing it is then a
/// permanent source error naming the pipeline, period, source and limit.
#[tokio::test]
async fn a_streamed_page_hands_out_records_before_it_passes_its_limit() {
    let body: String = (1..=100).map(|i| format!("{{\"id\":{i}}}\n")).collect();
    let server = Server::start(move |_, _| ok(body.clone())).await;
    let source = format!(
        "url = \"{}/nd\"\nformat = \"ndjson\"\nmax_page_bytes = 200",
        server.base
    );
    let p = pipeline(&source, 10);
    // The announced length is over the limit: refused before reading.
    let err = drain(&mut open(&p, None).await.unwrap()).await.unwrap_err();
    assert!(
        err.to_string().contains("Content-Length announces"),
        "{err}"
    );
    // Chunked, one record to a chunk: no length announced.
    let mut raw = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n".to_vec();
    for i in 1..=100 {
        let line = format!("{{\"id\":{i}}}\n");
        raw.extend_from_slice(format!("{:x}\r\n{line}\r\n", line.len()).as_bytes());
    }
    raw.extend_from_slice(b"0\r\n\r\n");
    let chunked = Server::start(move |_, _| Reply::Raw(raw.clone())).await;
    let source = format!(
        "url = \"{}/nd\"\nformat = \"ndjson\"\nmax_page_bytes = 200",
        chunked.base
    );
    let p = pipeline(&source, 10);
    let mut reader = open(&p, None).await.unwrap();
    let first = reader.next_batch().await.unwrap().unwrap();
    assert_eq!(
        first.records.iter().map(id).collect::<Vec<_>>(),
        (1..=10).collect::<Vec<_>>()
    );
    let err = drain(&mut reader).await.unwrap_err();
    assert_eq!(err.class(), ErrorClass::Source);
    assert!(!err.is_transient());
    let message = err.to_string();
    for part in [
        "pipeline orders, period 2024-03-07, source api",
        "sources.api.max_page_bytes = 200 bytes",
    ] {
        assert!(message.contains(part), "{part:?} in {message}");
    }
}
