//! NDJSON files (and HTTP pages): one JSON object per line, streamed.
//! Blank lines are skipped (exporters often end with one, or separate
//! chunks with them).
//!
//! A line that is not JSON (`NaN`, a comment, a cut value followed by more
//! lines), is not valid UTF-8, or holds something other than an object is a
//! bad row, handed on as a [`RawData::Malformed`] record with its text: the
//! run rejects it under `max_rejects`. Only a last line that stops in the
//! middle of a value and has no line end breaks the document (the file was
//! cut), and fails the period.

use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::sync::Arc;

use serde_json::error::Category;
use serde_json::Value;
use tidemark_core::{Error, Origin, RawData, RawRecord};
use xxhash_rust::xxh3::Xxh3;

use super::{io_error, json_kind, parse_error, show_bytes, strip_bom};

/// A line buffer that grew past this is shrunk again, so one huge line does
/// not pin its memory for the rest of the file.
const KEEP_LINE_CAPACITY: usize = 1 << 20;

/// An open NDJSON file (or any other reader, such as an HTTP page's body).
pub(crate) struct NdjsonCursor<R = File> {
    reader: BufReader<R>,
    buf: Vec<u8>,
    resource: Arc<str>,
    /// Every byte read, continuing the content consumed before this input.
    hasher: Xxh3,
    /// Lines read so far, blank ones included.
    line: u64,
    /// Records read so far.
    record: u64,
}

impl<R: Read> NdjsonCursor<R> {
    /// `hasher` holds the content consumed before this input.
    pub(crate) fn new(input: R, resource: Arc<str>, hasher: Xxh3) -> NdjsonCursor<R> {
        NdjsonCursor {
            reader: BufReader::new(input),
            buf: Vec::new(),
            resource,
            hasher,
            line: 0,
            record: 0,
        }
    }

    /// The next non-blank line's record, or `None` at the end of the input.
    /// Lines are read as bytes and checked as UTF-8 here, so bad encoding is
    /// a bad row rather than an I/O error.
    pub(crate) fn next_record(&mut self) -> Result<Option<RawRecord>, Error> {
        loop {
            if self.buf.capacity() > KEEP_LINE_CAPACITY {
                self.buf = Vec::new();
            }
            self.buf.clear();
            let read = self
                .reader
                .read_until(b'\n', &mut self.buf)
                .map_err(|e| io_error("cannot read", &self.resource, &e))?;
            if read == 0 {
                return Ok(None);
            }
            self.hasher.update(&self.buf);
            self.line += 1;
            let bytes = if self.line == 1 {
                strip_bom(&self.buf)
            } else {
                &self.buf
            };
            if bytes.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            self.record += 1;
            let origin = Origin {
                resource: Arc::clone(&self.resource),
                page: None,
                record: self.record,
                line: Some(self.line),
            };
            return self.decode(bytes, origin).map(Some);
        }
    }

    /// The hash of everything consumed so far.
    pub(crate) fn digest(&self) -> u64 {
        self.hasher.digest()
    }

    /// The hasher over the whole input (call at its end).
    pub(crate) fn into_hasher(self) -> Xxh3 {
        self.hasher
    }

    fn decode(&self, bytes: &[u8], origin: Origin) -> Result<RawRecord, Error> {
        let malformed = |why: String| {
            let error = parse_error(&self.resource, Some(origin.record), origin.line, why);
            let raw = String::from_utf8_lossy(trim_line_end(bytes)).into_owned();
            Ok(RawRecord::malformed(raw, error, origin.clone()))
        };
        let text = match std::str::from_utf8(bytes) {
            Ok(text) => text,
            Err(e) => {
                return malformed(format!(
                    "invalid UTF-8 at byte {} of the line: {}",
                    e.valid_up_to() + 1,
                    show_bytes(trim_line_end(bytes))
                ))
            }
        };
        match serde_json::from_str::<Value>(text) {
            Ok(Value::Object(object)) => Ok(RawRecord {
                data: RawData::Json(Value::Object(object)),
                origin,
            }),
            Ok(other) => malformed(format!(
                "record is not a JSON object: the line holds {}",
                json_kind(&other)
            )),
            Err(e) if e.classify() == Category::Eof && !bytes.ends_with(b"\n") => Err(parse_error(
                &self.resource,
                Some(origin.record),
                origin.line,
                format!(
                    "the input is cut: its last line stops in the middle of a JSON value and has no line end ({})",
                    json_line_reason(&e)
                ),
            )),
            Err(e) => malformed(format!(
                "invalid JSON at column {}: {}",
                e.column(),
                json_line_reason(&e)
            )),
        }
    }
}

fn trim_line_end(bytes: &[u8]) -> &[u8] {
    let end = bytes
        .iter()
        .rposition(|b| !matches!(b, b'\n' | b'\r'))
        .map_or(0, |i| i + 1);
    &bytes[..end]
}

/// serde_json counts lines within the one line it was given, which would
/// contradict the file line in the location; keep only its reason.
fn json_line_reason(err: &serde_json::Error) -> String {
    let full = err.to_string();
    full.rsplit_once(" at line ")
        .map_or(full.as_str(), |(reason, _)| reason)
        .to_string()
}
