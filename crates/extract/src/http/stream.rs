//! An NDJSON or CSV page read as a stream: the decoder takes the body's
//! bytes while the connection delivers them, so memory holds a few chunks
//! and one record, never the page (ADR 0020).
//!
//! A task on the runtime reads the response and hands its (gzip-decoded)
//! chunks through a bounded channel to the decoder, which runs on a
//! blocking thread; when the decoder is slower the channel is full and the
//! connection is not read, so the server is held back, not buffered. The
//! task also keeps the limits as the bytes pass: the page's total
//! (`max_page_bytes`) and the longest line (one record is held whole while
//! it is parsed, so a line may take at most the budget's share). Past
//! either, it ends the body with a permanent error and drops the
//! connection: an endless body or a gzip bomb stops there.
//!
//! The decoder reads through [`std::io::Read`], whose errors are untyped;
//! the typed error that ended the body is kept in [`StreamEnd`], where the
//! page's records look it up, so a cut body stays transient and a limit
//! stays a permanent source error.

use std::io::{self, Read};
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::{Buf, Bytes};
use reqwest::Response;
use tidemark_core::Error;
use tokio::sync::mpsc;
use xxhash_rust::xxh3::Xxh3;

/// Chunks in flight between the connection and the decoder: enough to
/// keep both busy, few enough that they are a rounding error of the
/// budget (a chunk is at most tens of KiB).
const CHUNKS_IN_FLIGHT: usize = 8;

/// Why a streamed body stopped before its end.
pub(crate) enum Overrun {
    /// The client failed to read it (cut, reset, timed out, bad gzip).
    Transport(reqwest::Error),
    /// Its total passed `max_page_bytes`.
    Page,
    /// A line passed the most one record may hold.
    Line,
}

/// How a streamed body ended, shared between the task reading it and the
/// page decoding it.
#[derive(Default)]
pub(crate) struct StreamEnd {
    /// The error that ended the body early.
    failure: Option<Error>,
    /// The hash of the whole body, once it was read to its end.
    digest: Option<u64>,
}

/// A handle on a body's [`StreamEnd`].
#[derive(Clone, Default)]
pub(crate) struct EndHandle(Arc<Mutex<StreamEnd>>);

impl EndHandle {
    fn lock(&self) -> MutexGuard<'_, StreamEnd> {
        // A panic elsewhere while holding it cannot leave it half-set: it
        // holds two independent values.
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The error that ended the body early, if one did.
    pub(crate) fn failure(&self) -> Option<Error> {
        self.lock().failure.clone()
    }

    /// The hash of the whole body, once it was read to its end.
    pub(crate) fn digest(&self) -> Option<u64> {
        self.lock().digest
    }
}

/// The limits a streamed body is read under.
#[derive(Debug, Clone, Copy)]
pub(crate) struct StreamLimits {
    /// The most bytes in all.
    pub(crate) page: u64,
    /// The most bytes between two line ends.
    pub(crate) line: u64,
}

/// The body of one page, read by the decoder on a blocking thread.
pub(crate) struct BodyStream {
    chunks: mpsc::Receiver<Bytes>,
    current: Bytes,
    end: EndHandle,
    /// Set once a read failed: every later read fails the same way,
    /// rather than looking like the end of the body.
    failed: Option<String>,
}

impl BodyStream {
    /// Starts reading `response` under `limits`; `fail` words why it
    /// stopped early. Needs a tokio runtime.
    pub(crate) fn start(
        response: Response,
        limits: StreamLimits,
        fail: impl Fn(Overrun) -> Error + Send + 'static,
    ) -> BodyStream {
        let (tx, chunks) = mpsc::channel(CHUNKS_IN_FLIGHT);
        let end = EndHandle::default();
        let pump_end = end.clone();
        tokio::spawn(async move {
            let ended = pump(response, limits, &tx).await;
            let mut state = pump_end.lock();
            match ended {
                Ok(Some(digest)) => state.digest = Some(digest),
                Ok(None) => {}
                Err(overrun) => state.failure = Some(fail(overrun)),
            }
            // `tx` drops after the end is recorded, so a reader that sees
            // the channel closed also sees how it ended.
        });
        BodyStream {
            chunks,
            current: Bytes::new(),
            end,
            failed: None,
        }
    }

    /// How the body ended (shared with the task reading it).
    pub(crate) fn end(&self) -> EndHandle {
        self.end.clone()
    }

    /// Reads up to `n` bytes from the start of the body (fewer when it is
    /// shorter), failing with the body's own error.
    pub(crate) fn head(&mut self, n: usize) -> Result<Vec<u8>, Error> {
        let mut head = Vec::with_capacity(n.min(1 << 16));
        let mut taken = self.by_ref().take(n as u64);
        match taken.read_to_end(&mut head) {
            Ok(_) => Ok(head),
            Err(e) => Err(self
                .end
                .failure()
                .unwrap_or_else(|| Error::source_permanent(format!("reading the body: {e}")))),
        }
    }
}

impl Read for BodyStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if let Some(why) = &self.failed {
            return Err(io::Error::other(why.clone()));
        }
        while self.current.is_empty() {
            match self.chunks.blocking_recv() {
                Some(chunk) => self.current = chunk,
                None => return self.closed(),
            }
        }
        let n = buf.len().min(self.current.len());
        buf[..n].copy_from_slice(&self.current[..n]);
        self.current.advance(n);
        Ok(n)
    }
}

impl BodyStream {
    /// The channel closed: the end of the body, or its failure.
    fn closed(&mut self) -> io::Result<usize> {
        match self.end.failure() {
            None => Ok(0),
            Some(err) => {
                let why = err.to_string();
                self.failed = Some(why.clone());
                Err(io::Error::other(why))
            }
        }
    }
}

/// Reads the body into `tx` under `limits`. `Ok(Some(hash))` at its end,
/// `Ok(None)` when the reader went away first (the page failed or was
/// dropped), `Err` when the body stopped or broke a limit.
async fn pump(
    mut response: Response,
    limits: StreamLimits,
    tx: &mpsc::Sender<Bytes>,
) -> Result<Option<u64>, Overrun> {
    let mut hasher = Xxh3::new();
    let (mut total, mut line) = (0u64, 0u64);
    while let Some(chunk) = response.chunk().await.map_err(Overrun::Transport)? {
        total += chunk.len() as u64;
        if total > limits.page {
            return Err(Overrun::Page);
        }
        // The line in progress, up to this chunk's first line end, and
        // then the one this chunk leaves open. (A whole line inside one
        // chunk is shorter than the chunk: tens of KiB.)
        let first = chunk.iter().position(|&b| b == b'\n');
        if first.is_some_and(|at| line + at as u64 > limits.line) {
            return Err(Overrun::Line);
        }
        line = match chunk.iter().rposition(|&b| b == b'\n') {
            Some(at) => (chunk.len() - at - 1) as u64,
            None => line + chunk.len() as u64,
        };
        if line > limits.line {
            return Err(Overrun::Line);
        }
        hasher.update(&chunk);
        if tx.send(chunk).await.is_err() {
            return Ok(None);
        }
    }
    Ok(Some(hasher.digest()))
}
