//! NDJSON files (and HTTP pages): one JSON value per line, streamed. Blank lines are skipped
//! (exporters often end with one, or separate chunks with them).

use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::sync::Arc;

use tidemark_core::{Error, Origin, RawData, RawRecord};

use super::{io_error, parse_error, strip_bom};

/// A line buffer that grew past this is shrunk again, so one huge line does
/// not pin its memory for the rest of the file.
const KEEP_LINE_CAPACITY: usize = 1 << 20;

/// An open NDJSON file (or any other reader, such as an HTTP page's body).
pub(crate) struct NdjsonCursor<R = File> {
    reader: BufReader<R>,
    buf: Vec<u8>,
    resource: Arc<str>,
    /// Lines read so far, blank ones included.
    line: u64,
    /// Records read so far.
    record: u64,
}

impl<R: Read> NdjsonCursor<R> {
    pub(crate) fn new(file: R, resource: Arc<str>) -> NdjsonCursor<R> {
        NdjsonCursor {
            reader: BufReader::new(file),
            buf: Vec::new(),
            resource,
            line: 0,
            record: 0,
        }
    }

    /// The next non-blank line's value, or `None` at the end of the file.
    /// Lines are read as bytes and checked as UTF-8 here, so bad encoding is
    /// a parse error at its line rather than an I/O error.
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
            self.line += 1;
            let bytes = if self.line == 1 {
                strip_bom(&self.buf)
            } else {
                &self.buf
            };
            let text = std::str::from_utf8(bytes).map_err(|e| {
                parse_error(
                    &self.resource,
                    Some(self.record + 1),
                    Some(self.line),
                    format!("invalid UTF-8: {e}"),
                )
            })?;
            if text.trim().is_empty() {
                continue;
            }
            self.record += 1;
            let value = serde_json::from_str(text).map_err(|e| {
                parse_error(
                    &self.resource,
                    Some(self.record),
                    Some(self.line),
                    json_line_message(&e),
                )
            })?;
            return Ok(Some(RawRecord {
                data: RawData::Json(value),
                origin: Origin {
                    resource: Arc::clone(&self.resource),
                    page: None,
                    record: self.record,
                    line: Some(self.line),
                },
            }));
        }
    }
}

/// serde_json counts lines within the one line it was given, which would
/// contradict the file line in the location; keep only its column.
fn json_line_message(err: &serde_json::Error) -> String {
    let full = err.to_string();
    let reason = full
        .rsplit_once(" at line ")
        .map_or(full.as_str(), |(reason, _)| reason);
    format!("invalid JSON at column {}: {reason}", err.column())
}
