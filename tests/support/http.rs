//! A small HTTP/1.1 server on 127.0.0.1:0 for the extract hardening tests,
//! on plain threads (the tests block on the tidemark binary, so a server on
//! the test's own runtime would starve). A handler decides every answer
//! from the request; the server logs each request and counts the body
//! bytes it managed to send, which shows how much of an endless body the
//! client took before it stopped.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

/// One request, decoded.
#[derive(Debug, Clone)]
pub struct Request {
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
}

impl Request {
    /// A query parameter as a number.
    pub fn num(&self, name: &str) -> Option<u64> {
        self.query.get(name).and_then(|v| v.parse().ok())
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
}

type Handler = Arc<dyn Fn(&Request) -> Reply + Send + Sync>;

struct Shared {
    base: String,
    handler: Handler,
    hits: Mutex<Vec<Request>>,
    sent: AtomicU64,
    stop: AtomicBool,
}

/// The running server; stops accepting when dropped.
pub struct Server {
    pub base: String,
    shared: Arc<Shared>,
}

impl Server {
    pub fn start(handler: impl Fn(&Request) -> Reply + Send + Sync + 'static) -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
        let base = format!("http://{}", listener.local_addr().unwrap());
        let shared = Arc::new(Shared {
            base: base.clone(),
            handler: Arc::new(handler),
            hits: Mutex::new(Vec::new()),
            sent: AtomicU64::new(0),
            stop: AtomicBool::new(false),
        });
        let accept = Arc::clone(&shared);
        thread::spawn(move || {
            for stream in listener.incoming() {
                if accept.stop.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(stream) = stream else { continue };
                let shared = Arc::clone(&accept);
                thread::spawn(move || serve(stream, &shared));
            }
        });
        Server { base, shared }
    }

    /// Every request so far, in arrival order.
    pub fn hits(&self) -> Vec<Request> {
        self.shared.hits.lock().unwrap().clone()
    }

    /// Body bytes written to clients so far.
    pub fn sent(&self) -> u64 {
        self.shared.sent.load(Ordering::SeqCst)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        // Wake the accept loop so it sees the flag.
        let _ = TcpStream::connect(self.base.trim_start_matches("http://"));
    }
}

fn serve(stream: TcpStream, shared: &Shared) {
    let _ = stream.set_read_timeout(Some(Duration::from_secs(120)));
    let Ok(write_half) = stream.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(stream);
    let mut writer = write_half;
    loop {
        let Some(mut request) = read_request(&mut reader, &shared.base) else {
            return;
        };
        let handler = Arc::clone(&shared.handler);
        {
            let mut hits = shared.hits.lock().unwrap();
            request.nth = hits.iter().filter(|h| h.target == request.target).count() + 1;
            hits.push(request.clone());
        }
        if !respond(&mut writer, handler(&request), shared) {
            return;
        }
    }
}

fn read_request(reader: &mut BufReader<TcpStream>, base: &str) -> Option<Request> {
    let mut line = String::new();
    if reader.read_line(&mut line).ok()? == 0 {
        return None;
    }
    let target = line.split_whitespace().nth(1)?.to_string();
    let mut headers = HashMap::new();
    loop {
        let mut header = String::new();
        reader.read_line(&mut header).ok()?;
        let header = header.trim_end();
        if header.is_empty() {
            break;
        }
        if let Some((name, value)) = header.split_once(':') {
            headers.insert(name.trim().to_ascii_lowercase(), value.trim().to_string());
        }
    }
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
    Some(Request {
        target,
        path,
        query,
        headers,
        nth: 0,
        base: base.to_string(),
    })
}

/// Writes the reply; `false` when the connection is done.
fn respond(writer: &mut TcpStream, reply: Reply, shared: &Shared) -> bool {
    match reply {
        Reply::Hold(wait, reply) => {
            thread::sleep(wait);
            respond(writer, *reply, shared)
        }
        Reply::Full {
            status,
            headers,
            body,
        } => {
            let mut head = format!("HTTP/1.1 {status} X\r\ncontent-length: {}\r\n", body.len());
            for (name, value) in headers {
                head.push_str(&format!("{name}: {value}\r\n"));
            }
            head.push_str("\r\n");
            let ok = writer.write_all(head.as_bytes()).is_ok() && writer.write_all(&body).is_ok();
            if ok {
                shared.sent.fetch_add(body.len() as u64, Ordering::SeqCst);
            }
            ok
        }
        Reply::Endless {
            prefix,
            chunk,
            limit,
        } => {
            let head = "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n";
            if writer.write_all(head.as_bytes()).is_err() {
                return false;
            }
            let mut sent = 0u64;
            let mut piece = prefix;
            while sent < limit {
                let framed =
                    [format!("{:x}\r\n", piece.len()).as_bytes(), &piece, b"\r\n"].concat();
                if writer.write_all(&framed).is_err() {
                    return false;
                }
                sent += piece.len() as u64;
                shared.sent.fetch_add(piece.len() as u64, Ordering::SeqCst);
                piece = chunk.clone();
            }
            writer.write_all(b"0\r\n\r\n").is_ok()
        }
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
