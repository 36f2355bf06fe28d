//! A fake paginated HTTP API: a handler of the suite's one fake server
//! ([`crate::support::http::Server`], bare TCP on 127.0.0.1:0 on a runtime
//! of its own, so faults below HTTP are exact and tests drive the real
//! `tidemark` binary synchronously).
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

use crate::support::http::{Reply, Request, Server};

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

/// What the API knows beyond the server's own log of a request.
#[derive(Debug, Clone)]
struct Note {
    page: u64,
    retry_after: Option<String>,
    fault: Option<&'static str>,
}

struct Shared {
    records: Box<dyn Fn(&str) -> usize + Send + Sync>,
    token: Option<String>,
    plan: Mutex<FaultPlan>,
    /// By [`Request::seq`].
    notes: Mutex<HashMap<usize, Note>>,
}

/// The running API; stops when dropped.
pub struct Api {
    pub base: String,
    shared: Arc<Shared>,
    server: Server,
}

impl Api {
    /// Serves `records(day)` records per day. With `token`, requests must
    /// carry `Authorization: Bearer TOKEN` and `api_key=TOKEN` (else 401).
    pub fn start(
        records: impl Fn(&str) -> usize + Send + Sync + 'static,
        token: Option<&str>,
    ) -> Api {
        let shared = Arc::new(Shared {
            records: Box::new(records),
            token: token.map(str::to_string),
            plan: Mutex::new(Arc::new(|_: &Req| None)),
            notes: Mutex::new(HashMap::new()),
        });
        let handler = Arc::clone(&shared);
        let server = Server::start(move |request| handle(&handler, request));
        Api {
            base: server.base.clone(),
            shared,
            server,
        }
    }

    /// Replaces the fault plan.
    pub fn faults(&self, plan: impl Fn(&Req) -> Option<Fault> + Send + Sync + 'static) {
        *self.shared.plan.lock().unwrap() = Arc::new(plan);
    }

    /// Every request so far, in arrival order.
    pub fn hits(&self) -> Vec<Hit> {
        let notes = self.shared.notes.lock().unwrap().clone();
        let mut hits: Vec<Hit> = self
            .server
            .hits()
            .into_iter()
            .map(|hit| {
                let note = notes.get(&hit.seq).cloned().unwrap_or(Note {
                    page: 0,
                    retry_after: None,
                    fault: None,
                });
                Hit {
                    at: hit.at,
                    done: hit.done,
                    target: hit.target.clone(),
                    day: hit.query.get("day").cloned().unwrap_or_default(),
                    page: note.page,
                    status: hit.status,
                    retry_after: note.retry_after,
                    fault: note.fault,
                    authorization: hit.headers.get("authorization").cloned(),
                }
            })
            .collect();
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
                    format!("<{}/link?{}>; rel=\"next\"", req.base, q.join("&")),
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

impl Response {
    fn reply(self) -> Reply {
        let mut headers = vec![("content-type".to_string(), self.content_type.to_string())];
        headers.extend(self.headers);
        Reply::Full {
            status: self.status,
            headers,
            body: self.body.into_bytes(),
        }
    }
}

/// Answers one request: its page, unless the fault plan (or a missing
/// credential) says otherwise.
fn handle(shared: &Shared, req: &Request) -> Reply {
    let (page, mut response) = route(shared, req);
    let info = Req {
        day: req.query.get("day").cloned().unwrap_or_default(),
        page,
        nth: req.nth,
    };
    let plan = Arc::clone(&shared.plan.lock().unwrap());
    let mut fault = plan(&info);
    if let Some(token) = &shared.token {
        let bearer = req.headers.get("authorization") == Some(&format!("Bearer {token}"));
        let key = req.query.get("api_key") == Some(token);
        if !(bearer && key) {
            fault = Some(Fault::Status(
                401,
                None,
                "missing or wrong credentials".into(),
            ));
        }
    }
    let mut note = Note {
        page,
        retry_after: None,
        fault: fault.as_ref().map(Fault::name),
    };
    let reply = match fault {
        None => response.reply(),
        Some(Fault::Hold(wait)) => Reply::Hold(wait, Box::new(response.reply())),
        Some(Fault::Status(status, retry_after, body)) => {
            note.retry_after = retry_after.clone();
            response = Response {
                status,
                content_type: "text/plain",
                headers: Vec::new(),
                body,
            };
            if let Some(after) = retry_after {
                response.headers.push(("retry-after".into(), after));
            }
            response.reply()
        }
        Some(Fault::Malformed) => {
            response.body = "{\"data\": [\n  {\"id\": \"x\",, }\n]}".into();
            response.reply()
        }
        Some(Fault::Reset) => Reply::Reset(Box::new(response.reply())),
        Some(Fault::Truncate) => Reply::Truncate(Box::new(response.reply())),
    };
    shared.notes.lock().unwrap().insert(req.seq, note);
    reply
}
