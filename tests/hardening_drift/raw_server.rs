//! A loopback HTTP/1.1 server that answers every request with the same
//! raw bytes (status line, head and body, exactly as given) and then closes
//! the connection, counting the requests: a test decides byte by byte what
//! arrives, including bodies cut short, corrupt gzip and bad chunk framing.

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;

/// The running server; stops accepting when dropped.
pub struct RawServer {
    pub base: String,
    requests: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
}

impl RawServer {
    pub fn start(response: Vec<u8>) -> RawServer {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
        let base = format!("http://{}", listener.local_addr().unwrap());
        let requests = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (count, halt) = (Arc::clone(&requests), Arc::clone(&stop));
        let response = Arc::new(response);
        thread::spawn(move || {
            for stream in listener.incoming() {
                if halt.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(stream) = stream else { continue };
                let (count, response) = (Arc::clone(&count), Arc::clone(&response));
                thread::spawn(move || answer(stream, &count, &response));
            }
        });
        RawServer {
            base,
            requests,
            stop,
        }
    }

    /// Requests received so far.
    pub fn requests(&self) -> usize {
        self.requests.load(Ordering::SeqCst)
    }
}

impl Drop for RawServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(self.base.trim_start_matches("http://"));
    }
}

/// Reads one request head, writes the bytes, closes.
fn answer(stream: TcpStream, count: &AtomicUsize, response: &[u8]) {
    let Ok(mut writer) = stream.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(stream);
    loop {
        let mut line = String::new();
        match reader.read_line(&mut line) {
            Ok(0) | Err(_) => return,
            Ok(_) if line.trim_end().is_empty() => break,
            Ok(_) => {}
        }
    }
    count.fetch_add(1, Ordering::SeqCst);
    let _ = writer.write_all(response);
    let _ = writer.flush();
}

/// `200` with a `Content-Length` of `body` and these extra header lines
/// (each ending in `\r\n`), then the first `sent` bytes of `body`.
pub fn response(body: &[u8], headers: &str, sent: usize) -> Vec<u8> {
    let head = format!(
        "HTTP/1.1 200 OK\r\ncontent-length: {}\r\ncontent-type: application/json\r\n{headers}\r\n",
        body.len()
    );
    [head.as_bytes(), &body[..sent.min(body.len())]].concat()
}

/// `200`, chunked, followed by `rest` as it is (chunks, framing and all).
pub fn chunked(rest: &str) -> Vec<u8> {
    format!("HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n{rest}")
        .into_bytes()
}
