//! The one fake HTTP server of the end-to-end tests: HTTP/1.1 on
//! 127.0.0.1:0, written on bare TCP so that faults below HTTP (a reset
//! mid-body, a body shorter than announced, bad chunk framing, an endless
//! body) are exact.
//!
//! A handler decides every answer from the request ([`Reply`]); the server
//! logs each request with the status it got and when the answer was
//! written ([`Hit`]), and counts the body bytes it managed to send, which
//! shows how much of an endless body the client took before it stopped.
//! The paginated API of `tests/http` ([`crate::http::api::Api`]) is one
//! such handler.
//!
//! It runs on a runtime of its own (the tests block on the tidemark binary,
//! so a server on the test's own runtime would starve), and handlers run on
//! its blocking pool, so a handler may take its time without holding up
//! other connections. Dropping the server stops it and closes every
//! connection.

use std::collections::HashMap;
use std::ops::Deref;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// One request, decoded.
#[derive(Debug, Clone)]
pub struct Request {
    /// 0-based arrival number among all requests to this server.
    pub seq: usize,
    /// When the request head had arrived.
    pub at: Instant,
    /// The request target as sent (`/a/b?x=1`).
    pub target: String,
    /// The path, percent-decoded segment by segment.
    pub path: String,
    /// The query, form-decoded (`+` is a space).
    pub query: HashMap<String, String>,
    /// Header names in lower case.
    pub headers: HashMap<String, String>,
    /// 1-based: how many requests for this exact target so far, this one included.
    pub nth: usize,
    /// The server's own base URL (`http://127.0.0.1:PORT`).
    pub base: String,
    /// The request body (`Content-Length` bodies only; empty otherwise).
    pub body: Vec<u8>,
}

impl Request {
    /// A query parameter as a number.
    pub fn num(&self, name: &str) -> Option<u64> {
        self.query.get(name).and_then(|v| v.parse().ok())
    }
}

/// A request as logged: what was asked, the status it got, and when the
/// answer was written (or given up).
#[derive(Debug, Clone)]
pub struct Hit {
    pub request: Request,
    pub status: u16,
    pub done: Instant,
}

impl Deref for Hit {
    type Target = Request;

    fn deref(&self) -> &Request {
        &self.request
    }
}

/// An answer.
#[derive(Debug, Clone)]
pub enum Reply {
    /// A complete response with a `Content-Length`.
    Full {
        status: u16,
        headers: Vec<(String, String)>,
        body: Vec<u8>,
    },
    /// `200`, chunked, a body of `chunk` repeated until the client stops
    /// reading or `limit` bytes were sent.
    Endless {
        prefix: Vec<u8>,
        chunk: Vec<u8>,
        limit: u64,
    },
    /// Waits, then answers.
    Hold(Duration, Box<Reply>),
    /// These bytes exactly (status line, head and body), then the
    /// connection closes: a test decides byte by byte what arrives.
    Raw(Vec<u8>),
    /// The reply's head (announcing its whole body) and half its body,
    /// then a TCP reset.
    Reset(Box<Reply>),
    /// The reply's head (announcing its whole body) and half its body,
    /// then a clean close.
    Truncate(Box<Reply>),
}

impl Reply {
    pub fn status(status: u16, content_type: &str, body: impl Into<Vec<u8>>) -> Reply {
        Reply::Full {
            status,
            headers: vec![("content-type".into(), content_type.into())],
            body: body.into(),
        }
    }

    pub fn json(body: impl Into<Vec<u8>>) -> Reply {
        Reply::status(200, "application/json", body)
    }

    pub fn ndjson(body: impl Into<Vec<u8>>) -> Reply {
        Reply::status(200, "application/x-ndjson", body)
    }

    pub fn with_header(mut self, name: &str, value: &str) -> Reply {
        if let Reply::Full { headers, .. } = &mut self {
            headers.push((name.into(), value.into()));
        }
        self
    }

    /// The status the client is sent (0 for raw bytes without a status line).
    pub fn code(&self) -> u16 {
        match self {
            Reply::Full { status, .. } => *status,
            Reply::Endless { .. } => 200,
            Reply::Hold(_, reply) | Reply::Reset(reply) | Reply::Truncate(reply) => reply.code(),
            Reply::Raw(bytes) => String::from_utf8_lossy(bytes)
                .split_whitespace()
                .nth(1)
                .and_then(|code| code.parse().ok())
                .unwrap_or(0),
        }
    }
}

/// `200` with a `Content-Length` of `body` and these extra header lines
/// (each ending in `\r\n`), then the first `sent` bytes of `body`: raw
/// bytes for [`Reply::Raw`].
pub fn raw_response(body: &[u8], headers: &str, sent: usize) -> Vec<u8> {
    let head = format!(
        "HTTP/1.1 200 OK\r\ncontent-length: {}\r\ncontent-type: application/json\r\n{headers}\r\n",
        body.len()
    );
    [head.as_bytes(), &body[..sent.min(body.len())]].concat()
}

/// `200`, chunked, followed by `rest` as it is (chunks, framing and all):
/// raw bytes for [`Reply::Raw`].
pub fn raw_chunked(rest: &str) -> Vec<u8> {
    format!("HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n{rest}")
        .into_bytes()
}

type Handler = Arc<dyn Fn(&Request) -> Reply + Send + Sync>;

struct Shared {
    base: String,
    handler: Handler,
    /// Requests so far per target, for [`Request::nth`].
    targets: Mutex<(usize, HashMap<String, usize>)>,
    hits: Mutex<Vec<Hit>>,
    sent: AtomicU64,
}

/// A port on 127.0.0.1 where nothing answers: bound, never listening, so
/// every connection is refused at once, and held, so no other process of a
/// busy test run can take it before [`Server::start_on`] listens on it.
/// (A port found free and released is a race: a parallel test's listener
/// or outgoing connection may take it in between.)
pub struct DownPort {
    socket: socket2::Socket,
    pub port: u16,
}

impl DownPort {
    pub fn reserve() -> DownPort {
        use socket2::{Domain, Protocol, Socket, Type};
        let socket =
            Socket::new(Domain::IPV4, Type::STREAM, Some(Protocol::TCP)).expect("a TCP socket");
        let any: std::net::SocketAddr = "127.0.0.1:0".parse().unwrap();
        socket.bind(&any.into()).expect("bind 127.0.0.1:0");
        let port = socket
            .local_addr()
            .ok()
            .and_then(|a| a.as_socket())
            .map(|a| a.port())
            .expect("the bound port");
        DownPort { socket, port }
    }
}

/// The running server; stops when dropped.
pub struct Server {
    pub base: String,
    shared: Arc<Shared>,
    runtime: Option<tokio::runtime::Runtime>,
}

impl Server {
    pub fn start(handler: impl Fn(&Request) -> Reply + Send + Sync + 'static) -> Server {
        let listener = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap_or_else(|e| panic!("bind 127.0.0.1:0: {e}"));
        Server::serve(listener, handler)
    }

    /// [`Server::start`] on the port `down` kept refusing: a receiver that
    /// comes back where a client was refused, with no moment in which
    /// another process could take the port.
    pub fn start_on(
        down: DownPort,
        handler: impl Fn(&Request) -> Reply + Send + Sync + 'static,
    ) -> Server {
        down.socket
            .listen(128)
            .expect("listen on the reserved port");
        Server::serve(down.socket.into(), handler)
    }

    fn serve(
        listener: std::net::TcpListener,
        handler: impl Fn(&Request) -> Reply + Send + Sync + 'static,
    ) -> Server {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("server runtime");
        // Made here, not on the runtime: a test may start a server from
        // inside its own runtime, where `block_on` is not allowed.
        listener
            .set_nonblocking(true)
            .expect("nonblocking listener");
        let base = format!("http://{}", listener.local_addr().unwrap());
        let shared = Arc::new(Shared {
            base: base.clone(),
            handler: Arc::new(handler),
            targets: Mutex::new((0, HashMap::new())),
            hits: Mutex::new(Vec::new()),
            sent: AtomicU64::new(0),
        });
        let accept = Arc::clone(&shared);
        runtime.spawn(async move {
            let listener = tokio::net::TcpListener::from_std(listener).expect("listener");
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(connection(stream, Arc::clone(&accept)));
            }
        });
        Server {
            base,
            shared,
            runtime: Some(runtime),
        }
    }

    /// Every request answered or being answered, in arrival order.
    pub fn hits(&self) -> Vec<Hit> {
        let mut hits = self.shared.hits.lock().unwrap().clone();
        hits.sort_by_key(|h| h.seq);
        hits
    }

    /// How many requests the handler has answered so far.
    pub fn requests(&self) -> usize {
        self.shared.hits.lock().unwrap().len()
    }

    /// Body bytes written to clients so far.
    pub fn sent(&self) -> u64 {
        self.shared.sent.load(Ordering::SeqCst)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

/// Serves one connection, request after request, until either side closes.
async fn connection(mut stream: TcpStream, shared: Arc<Shared>) {
    let mut buf = Vec::new();
    loop {
        let Some(end) = read_head(&mut stream, &mut buf).await else {
            return;
        };
        let head = String::from_utf8_lossy(&buf[..end]).into_owned();
        buf.drain(..end + 4);
        let at = Instant::now();
        let Some(mut request) = parse_request(&head, &shared, at) else {
            return;
        };
        let Some(body) = read_body(&mut stream, &mut buf, &request).await else {
            return;
        };
        request.body = body;
        let handler = Arc::clone(&shared.handler);
        let asked = request.clone();
        let Ok(reply) = tokio::task::spawn_blocking(move || handler(&asked)).await else {
            return; // the handler panicked: the client sees the connection close
        };
        // Logged before answering, so a test that waits for a request sees
        // it while a held response is still pending.
        let seq = request.seq;
        shared.hits.lock().unwrap().push(Hit {
            request,
            status: reply.code(),
            done: at,
        });
        let keep_open = respond(&mut stream, reply, &shared).await;
        if let Some(hit) = shared
            .hits
            .lock()
            .unwrap()
            .iter_mut()
            .find(|h| h.seq == seq)
        {
            hit.done = Instant::now();
        }
        if !keep_open {
            return;
        }
    }
}

/// Reads up to the end of a request head; its length in `buf`.
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

/// Reads a request body (`Content-Length` only: clients send small ones,
/// if any); `None` when the connection ended first.
async fn read_body(
    stream: &mut TcpStream,
    buf: &mut Vec<u8>,
    request: &Request,
) -> Option<Vec<u8>> {
    let length: usize = request
        .headers
        .get("content-length")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    while buf.len() < length {
        let mut chunk = [0u8; 8192];
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
    Some(buf.drain(..length).collect())
}

fn parse_request(head: &str, shared: &Shared, at: Instant) -> Option<Request> {
    let mut lines = head.lines();
    let target = lines.next()?.split_whitespace().nth(1)?.to_string();
    let headers = lines
        .filter_map(|line| line.split_once(':'))
        .map(|(name, value)| (name.trim().to_ascii_lowercase(), value.trim().to_string()))
        .collect();
    let (path, query) = target.split_once('?').unwrap_or((&target, ""));
    let path = path
        .split('/')
        .map(|segment| percent_decode(segment, false))
        .collect::<Vec<_>>()
        .join("/");
    let query = query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|pair| {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            (percent_decode(k, true), percent_decode(v, true))
        })
        .collect();
    let (seq, nth) = {
        let mut targets = shared.targets.lock().unwrap();
        let seq = targets.0;
        targets.0 += 1;
        let nth = targets.1.entry(target.clone()).or_insert(0);
        *nth += 1;
        (seq, *nth)
    };
    Some(Request {
        seq,
        at,
        target,
        path,
        query,
        headers,
        nth,
        base: shared.base.clone(),
        body: Vec::new(),
    })
}

/// Writes the reply; `false` when the connection is done.
async fn respond(stream: &mut TcpStream, reply: Reply, shared: &Shared) -> bool {
    match reply {
        Reply::Hold(wait, reply) => {
            tokio::time::sleep(wait).await;
            Box::pin(respond(stream, *reply, shared)).await
        }
        Reply::Full {
            status,
            headers,
            body,
        } => {
            let ok = stream
                .write_all(head_of(status, &headers, body.len()).as_bytes())
                .await
                .is_ok()
                && stream.write_all(&body).await.is_ok();
            if ok {
                shared.sent.fetch_add(body.len() as u64, Ordering::SeqCst);
            }
            ok
        }
        Reply::Endless {
            prefix,
            chunk,
            limit,
        } => endless(stream, prefix, chunk, limit, shared).await,
        Reply::Raw(bytes) => {
            let _ = stream.write_all(&bytes).await;
            let _ = stream.flush().await;
            false
        }
        Reply::Reset(reply) => {
            half_of(stream, *reply).await;
            let _ = stream.set_zero_linger();
            false
        }
        Reply::Truncate(reply) => {
            half_of(stream, *reply).await;
            let _ = stream.shutdown().await;
            false
        }
    }
}

/// Writes the head of a complete reply, announcing its whole body, and
/// half the body.
async fn half_of(stream: &mut TcpStream, reply: Reply) {
    let Reply::Full {
        status,
        headers,
        body,
    } = reply
    else {
        panic!("only a complete reply can be cut short");
    };
    let _ = stream
        .write_all(head_of(status, &headers, body.len()).as_bytes())
        .await;
    let _ = stream.write_all(&body[..body.len() / 2]).await;
    let _ = stream.flush().await;
}

/// A chunked body of `prefix`, then `chunk` again and again, until `limit`
/// bytes were sent or the client went away.
async fn endless(
    stream: &mut TcpStream,
    prefix: Vec<u8>,
    chunk: Vec<u8>,
    limit: u64,
    shared: &Shared,
) -> bool {
    let head =
        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n";
    if stream.write_all(head.as_bytes()).await.is_err() {
        return false;
    }
    let mut sent = 0u64;
    let mut piece = prefix;
    while sent < limit {
        let framed = [format!("{:x}\r\n", piece.len()).as_bytes(), &piece, b"\r\n"].concat();
        if stream.write_all(&framed).await.is_err() {
            return false;
        }
        sent += piece.len() as u64;
        shared.sent.fetch_add(piece.len() as u64, Ordering::SeqCst);
        piece = chunk.clone();
    }
    stream.write_all(b"0\r\n\r\n").await.is_ok()
}

fn head_of(status: u16, headers: &[(String, String)], length: usize) -> String {
    let mut head = format!(
        "HTTP/1.1 {status} {}\r\ncontent-length: {length}\r\n",
        reason(status)
    );
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    head
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

/// `%XX` decoding (and `+` as a space in a query).
pub fn percent_decode(text: &str, plus_is_space: bool) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = (bytes[i] == b'%')
            .then(|| bytes.get(i + 1..i + 3))
            .flatten()
            .and_then(|h| u8::from_str_radix(std::str::from_utf8(h).ok()?, 16).ok());
        match (bytes[i], hex) {
            (_, Some(b)) => {
                out.push(b);
                i += 3;
            }
            (b'+', None) if plus_is_space => {
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
