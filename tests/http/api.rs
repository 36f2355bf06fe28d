//! A fake paginated HTTP API on 127.0.0.1:0, written on bare TCP so that
//! faults below HTTP (a reset mid-body, a body shorter than announced) are
//! exact. It runs on its own runtime thread, so tests drive the real
//! `tidemark` binary synchronously.
//!
//! Each day (`?day=YYYY-MM-DD`) has a configured number of records
//! `{"id": "DAY-00001", "day": DAY, "amount": 1.5}`, served under one path
//! per pagination style:
//!
//! | path      | paging                                   | format |
//! |-----------|------------------------------------------|--------|
//! | `/page`   | `page` (1-based) and `per_page`          | json `{"data": [..]}` |
//! | `/offset` | `offset` and `limit`                     | json `{"items": [..]}` |
//! | `/cursor` | `cursor` from `/meta/next`               | json `{"data": [..], "meta": {"next": ..}}` |
//! | `/link`   | `page`, next page in a `Link` header     | ndjson |
//! | `/none`   | everything at once                       | csv |
//!
//! Every request is logged ([`Hit`]), with its page number, and a fault
//! plan ([`FaultPlan`]) decides per request whether to misbehave.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Page size of the cursor and link styles, chosen by the server.
pub const SERVER_PAGE_SIZE: usize = 10;

/// A misbehaviour for one request.
#[derive(Debug, Clone)]
pub enum Fault {
    /// This status, an optional `Retry-After` value, and a body.
    Status(u16, Option<String>, String),
    /// Headers and half the body, then a TCP reset.
    Reset,
    /// `Content-Length` of the whole body, half of it, then a clean close.
    Truncate,
    /// A complete 200 response whose JSON is malformed on its second line.
    Malformed,
    /// Waits this long before answering normally (a slow or hung server).
    Hold(Duration),
}

impl Fault {
    fn name(&self) -> &'static str {
        match self {
            Fault::Status(..) => "status",
            Fault::Reset => "reset",
            Fault::Truncate => "truncate",
            Fault::Malformed => "malformed",
            Fault::Hold(_) => "hold",
        }
    }
}

/// What a fault plan sees of a request.
#[derive(Debug, Clone)]
pub struct Req {
    pub day: String,
    /// 1-based page number within the day.
    pub page: u64,
    /// 1-based count of requests for this exact target so far.
    pub nth: usize,
}

/// Decides each request's fault.
pub type FaultPlan = Arc<dyn Fn(&Req) -> Option<Fault> + Send + Sync>;

/// One request as the server saw it.
#[derive(Debug, Clone)]
pub struct Hit {
    /// When the request head had arrived.
    pub at: Instant,
    /// When the response was written (or given up).
    pub done: Instant,
    pub target: String,
    pub day: String,
    pub page: u64,
    pub status: u16,
    pub retry_after: Option<String>,
    pub fault: Option<&'static str>,
    pub authorization: Option<String>,
}

struct Shared {
    records: Box<dyn Fn(&str) -> usize + Send + Sync>,
    token: Option<String>,
    plan: Mutex<FaultPlan>,
    hits: Mutex<Vec<Hit>>,
    base: String,
}

/// The running server; stops when dropped.
pub struct Api {
    pub base: String,
    shared: Arc<Shared>,
    runtime: Option<tokio::runtime::Runtime>,
}

impl Drop for Api {
    fn drop(&mut self) {
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}

impl Api {
    /// Serves `records(day)` records per day. With `token`, requests must
    /// carry `Authorization: Bearer TOKEN` and `api_key=TOKEN` (else 401).
    pub fn start(
        records: impl Fn(&str) -> usize + Send + Sync + 'static,
        token: Option<&str>,
    ) -> Api {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("server runtime");
        let listener = runtime
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .expect("bind 127.0.0.1:0");
        let base = format!("http://{}", listener.local_addr().unwrap());
        let shared = Arc::new(Shared {
            records: Box::new(records),
            token: token.map(str::to_string),
            plan: Mutex::new(Arc::new(|_: &Req| None)),
            hits: Mutex::new(Vec::new()),
            base: base.clone(),
        });
        let accept = Arc::clone(&shared);
        runtime.spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(connection(stream, Arc::clone(&accept)));
            }
        });
        Api {
            base,
            shared,
            runtime: Some(runtime),
        }
    }

    /// Replaces the fault plan.
    pub fn faults(&self, plan: impl Fn(&Req) -> Option<Fault> + Send + Sync + 'static) {
        *self.shared.plan.lock().unwrap() = Arc::new(plan);
    }

    /// Every request so far, in arrival order.
    pub fn hits(&self) -> Vec<Hit> {
        let mut hits = self.shared.hits.lock().unwrap().clone();
        hits.sort_by_key(|h| h.at);
        hits
    }

    /// Requests per page number of `day`.
    pub fn per_page(&self, day: &str) -> std::collections::BTreeMap<u64, usize> {
        let mut counts = std::collections::BTreeMap::new();
        for hit in self.hits().iter().filter(|h| h.day == day) {
            *counts.entry(hit.page).or_insert(0) += 1;
        }
        counts
    }
}

/// The ids of a day's records, as the API serves them.
pub fn ids(day: &str, n: usize) -> Vec<String> {
    (1..=n).map(|i| format!("{day}-{i:05}")).collect()
}

async fn connection(mut stream: TcpStream, shared: Arc<Shared>) {
    let mut buf = Vec::new();
    loop {
        let Some(end) = read_head(&mut stream, &mut buf).await else {
            return;
        };
        let head = String::from_utf8_lossy(&buf[..end]).into_owned();
        buf.drain(..end + 4);
        let at = Instant::now();
        if !handle(&mut stream, &shared, &head, at).await {
            return;
        }
    }
}

async fn read_head(stream: &mut TcpStream, buf: &mut Vec<u8>) -> Option<usize> {
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            return Some(end);
        }
        let mut chunk = [0u8; 8192];
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

/// A parsed request.
struct Request {
    target: String,
    path: String,
    query: HashMap<String, String>,
    authorization: Option<String>,
}

fn parse_request(head: &str) -> Request {
    let target = head.split_whitespace().nth(1).unwrap_or("/").to_string();
    let (path, query) = target.split_once('?').unwrap_or((&target, ""));
    let query = url_decode_pairs(query);
    let authorization = head
        .lines()
        .skip(1)
        .filter_map(|l| l.split_once(':'))
        .find(|(k, _)| k.trim().eq_ignore_ascii_case("authorization"))
        .map(|(_, v)| v.trim().to_string());
    Request {
        path: path.to_string(),
        target,
        query,
        authorization,
    }
}

fn url_decode_pairs(query: &str) -> HashMap<String, String> {
    query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (decode(k), decode(v))
        })
        .collect()
}

fn decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let escaped = (bytes[i] == b'%')
            .then(|| bytes.get(i + 1..i + 3))
            .flatten()
            .and_then(|hex| u8::from_str_radix(std::str::from_utf8(hex).ok()?, 16).ok());
        match (bytes[i], escaped) {
            (_, Some(b)) => {
                out.push(b);
                i += 3;
            }
            (b'+', None) => {
                out.push(b' ');
                i += 1;
            }
            (b, None) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            b => format!("%{b:02X}"),
        })
        .collect()
}

/// A response to send.
struct Response {
    status: u16,
    content_type: &'static str,
    headers: Vec<(String, String)>,
    body: String,
}

fn num(query: &HashMap<String, String>, key: &str, default: usize) -> usize {
    query
        .get(key)
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The page number a request asks for, and the response it should get.
fn route(shared: &Shared, req: &Request) -> (u64, Response) {
    let day = req.query.get("day").cloned().unwrap_or_default();
    let n = (shared.records)(&day);
    let not_found = |msg: String| Response {
        status: 404,
        content_type: "text/plain",
        headers: Vec::new(),
        body: msg,
    };
    match req.path.as_str() {
        "/page" => {
            let size = num(&req.query, "per_page", 10).max(1);
            let page = num(&req.query, "page", 1).max(1);
            let start = (page - 1) * size;
            (page as u64, json_page("data", &day, start, size, n, None))
        }
        "/offset" => {
            let size = num(&req.query, "limit", 10).max(1);
            let offset = num(&req.query, "offset", 0);
            (
                (offset / size + 1) as u64,
                json_page("items", &day, offset, size, n, None),
            )
        }
        "/cursor" => {
            let start = req
                .query
                .get("cursor")
                .and_then(|c| c.strip_prefix('c'))
                .and_then(|c| c.parse().ok())
                .unwrap_or(0);
            let end = start + SERVER_PAGE_SIZE;
            let next = (end < n).then(|| format!("c{end}"));
            (
                (start / SERVER_PAGE_SIZE + 1) as u64,
                json_page("data", &day, start, SERVER_PAGE_SIZE, n, Some(next)),
            )
        }
        "/link" => {
            let page = num(&req.query, "page", 1).max(1);
            let start = (page - 1) * SERVER_PAGE_SIZE;
            let mut headers = Vec::new();
            if start + SERVER_PAGE_SIZE < n {
                // Echo every parameter (an API key too), as many APIs do.
                let mut query: Vec<(String, String)> = req
                    .query
                    .clone()
                    .into_iter()
                    .filter(|(k, _)| k != "page")
                    .collect();
                query.sort();
                query.push(("page".into(), (page + 1).to_string()));
                let q: Vec<String> = query
                    .iter()
                    .map(|(k, v)| format!("{}={}", encode(k), encode(v)))
                    .collect();
                headers.push((
                    "link".into(),
                    format!("<{}/link?{}>; rel=\"next\"", shared.base, q.join("&")),
                ));
            }
            let body: String = (start..(start + SERVER_PAGE_SIZE).min(n))
                .map(|i| format!("{}\n", record(&day, i + 1)))
                .collect();
            (
                page as u64,
                Response {
                    status: 200,
                    content_type: "application/x-ndjson",
                    headers,
                    body,
                },
            )
        }
        "/none" => {
            let mut body = String::from("id,day,amount\n");
            for i in 1..=n {
                body.push_str(&format!("{day}-{i:05},{day},{i}.50\n"));
            }
            (
                1,
                Response {
                    status: 200,
                    content_type: "text/csv",
                    headers: Vec::new(),
                    body,
                },
            )
        }
        other => (1, not_found(format!("no route {other}"))),
    }
}

fn record(day: &str, i: usize) -> String {
    format!(r#"{{"id":"{day}-{i:05}","day":"{day}","amount":{i}.5}}"#)
}

fn json_page(
    key: &str,
    day: &str,
    start: usize,
    size: usize,
    n: usize,
    next: Option<Option<String>>,
) -> Response {
    let records: Vec<String> = (start..(start + size).min(n))
        .map(|i| record(day, i + 1))
        .collect();
    let mut body = format!("{{\"{key}\":[{}]", records.join(","));
    if let Some(next) = next {
        match next {
            Some(c) => body.push_str(&format!(",\"meta\":{{\"next\":\"{c}\"}}")),
            None => body.push_str(",\"meta\":{\"next\":null}"),
        }
    }
    body.push('}');
    Response {
        status: 200,
        content_type: "application/json",
        headers: Vec::new(),
        body,
    }
}

/// Answers one request; `false` when the connection is done.
async fn handle(stream: &mut TcpStream, shared: &Shared, head: &str, at: Instant) -> bool {
    let req = parse_request(head);
    let (page, mut response) = route(shared, &req);
    let day = req.query.get("day").cloned().unwrap_or_default();
    let nth = {
        let hits = shared.hits.lock().unwrap();
        hits.iter().filter(|h| h.target == req.target).count() + 1
    };
    let info = Req {
        day: day.clone(),
        page,
        nth,
    };
    let plan = Arc::clone(&shared.plan.lock().unwrap());
    let mut fault = plan(&info);
    if let Some(token) = &shared.token {
        let bearer = req.authorization.as_deref() == Some(&format!("Bearer {token}"));
        let key = req.query.get("api_key") == Some(token);
        if !(bearer && key) {
            fault = Some(Fault::Status(
                401,
                None,
                "missing or wrong credentials".into(),
            ));
        }
    }
    let mut hit = Hit {
        at,
        done: at,
        target: req.target.clone(),
        day,
        page,
        status: response.status,
        retry_after: None,
        fault: fault.as_ref().map(Fault::name),
        authorization: req.authorization.clone(),
    };
    // Logged before answering, so a test that waits for a request sees it
    // while a held response is still pending.
    let index = {
        let mut hits = shared.hits.lock().unwrap();
        hits.push(hit.clone());
        hits.len() - 1
    };
    let keep_open = match fault {
        None => write(stream, &response).await,
        Some(Fault::Hold(wait)) => {
            tokio::time::sleep(wait).await;
            write(stream, &response).await
        }
        Some(Fault::Status(status, retry_after, body)) => {
            hit.status = status;
            hit.retry_after = retry_after.clone();
            response = Response {
                status,
                content_type: "text/plain",
                headers: Vec::new(),
                body,
            };
            if let Some(after) = retry_after {
                response.headers.push(("retry-after".into(), after));
            }
            write(stream, &response).await
        }
        Some(Fault::Malformed) => {
            response.body = "{\"data\": [\n  {\"id\": \"x\",, }\n]}".into();
            write(stream, &response).await
        }
        Some(Fault::Reset) => {
            let head = head_of(&response, response.body.len());
            let _ = stream.write_all(head.as_bytes()).await;
            let _ = stream
                .write_all(&response.body.as_bytes()[..response.body.len() / 2])
                .await;
            let _ = stream.flush().await;
            let _ = stream.set_zero_linger();
            false
        }
        Some(Fault::Truncate) => {
            let head = head_of(&response, response.body.len());
            let _ = stream.write_all(head.as_bytes()).await;
            let _ = stream
                .write_all(&response.body.as_bytes()[..response.body.len() / 2])
                .await;
            let _ = stream.shutdown().await;
            false
        }
    };
    hit.done = Instant::now();
    shared.hits.lock().unwrap()[index] = hit;
    keep_open
}

fn head_of(response: &Response, len: usize) -> String {
    let mut head = format!(
        "HTTP/1.1 {} {}\r\ncontent-type: {}\r\ncontent-length: {len}\r\n",
        response.status,
        reason(response.status),
        response.content_type
    );
    for (name, value) in &response.headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    head
}

async fn write(stream: &mut TcpStream, response: &Response) -> bool {
    let mut bytes = head_of(response, response.body.len()).into_bytes();
    bytes.extend_from_slice(response.body.as_bytes());
    stream.write_all(&bytes).await.is_ok()
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        401 => "Unauthorized",
        404 => "Not Found",
        429 => "Too Many Requests",
        500 => "Internal Server Error",
        503 => "Service Unavailable",
        _ => "Whatever",
    }
}
