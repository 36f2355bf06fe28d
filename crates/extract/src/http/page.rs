//! Decoding one page's body into records, with the file reader's parsers
//! (the same `RawData`, the same rules for CSV headers, NDJSON lines and
//! JSON record pointers).
//!
//! A body that ends in the middle of a JSON document or NDJSON line is a
//! truncated response, not bad data: it is reported as a transient source
//! error so the request is tried again. A body that is complete but cannot
//! be decoded is a permanent parse error naming the page and the position.

use std::io;
use std::sync::Arc;

use serde_json::error::Category;
use serde_json::Value;
use tidemark_core::spec::Pagination;
use tidemark_core::{Error, Location, RawRecord};

use super::paging::{self, Continuation, PageRequest};
use crate::file::csv_file::CsvCursor;
use crate::file::json_file::JsonCursor;
use crate::file::ndjson_file::NdjsonCursor;
use crate::file::strip_bom;

/// How the source's pages are decoded.
#[derive(Debug, Clone)]
pub(crate) enum Decoder {
    Json { pointer: String },
    Ndjson,
    Csv { delimiter: u8 },
}

/// The records of one page, decoded lazily where the format allows.
pub(crate) enum Records {
    Json(JsonCursor),
    Ndjson(NdjsonCursor<io::Cursor<Vec<u8>>>),
    Csv(CsvCursor<io::Cursor<Vec<u8>>>),
    /// `204 No Content`.
    Empty,
}

/// A decoded page: its records and what comes after it.
pub(crate) struct Decoded {
    pub(crate) records: Records,
    pub(crate) continuation: Continuation,
}

/// What a page is decoded with.
pub(crate) struct PageInput {
    /// The shown (redacted) URL, used as every record's resource.
    pub(crate) resource: Arc<str>,
    /// The page's 1-based number within the period.
    pub(crate) number: u64,
    pub(crate) pagination: Pagination,
    pub(crate) request: PageRequest,
    /// The sealed `rel="next"` URL, if the response had one.
    pub(crate) next_link: Option<String>,
    /// `204 No Content`: no body to decode.
    pub(crate) no_content: bool,
}

impl Decoder {
    /// Decodes `body`. CSV and NDJSON rows are parsed as they are taken;
    /// a JSON document is parsed whole.
    pub(crate) fn decode(&self, body: Vec<u8>, input: &PageInput) -> Result<Decoded, Error> {
        if input.no_content {
            return Ok(Decoded {
                records: Records::Empty,
                continuation: continuation(input, None)?,
            });
        }
        let records = match self {
            Decoder::Json { pointer } => {
                let doc = parse_json(&body, input)?;
                drop(body);
                let continuation = continuation(input, Some(&doc))?;
                let cursor = JsonCursor::from_document(doc, Arc::clone(&input.resource), pointer)
                    .map_err(|e| at_page(e, input.number))?;
                return Ok(Decoded {
                    records: Records::Json(cursor),
                    continuation,
                });
            }
            Decoder::Ndjson => {
                check_last_line(&body, input)?;
                Records::Ndjson(NdjsonCursor::new(
                    io::Cursor::new(body),
                    Arc::clone(&input.resource),
                ))
            }
            Decoder::Csv { delimiter } => Records::Csv(
                CsvCursor::open(
                    io::Cursor::new(body),
                    Arc::clone(&input.resource),
                    *delimiter,
                )
                .map_err(|e| at_page(e, input.number))?,
            ),
        };
        Ok(Decoded {
            records,
            continuation: continuation(input, None)?,
        })
    }
}

impl Records {
    /// The page's next record, its origin naming the page.
    pub(crate) fn next_record(&mut self, page: u64) -> Result<Option<RawRecord>, Error> {
        let next = match self {
            Records::Json(c) => c.next_record(),
            Records::Ndjson(c) => c.next_record(),
            Records::Csv(c) => c.next_record(),
            Records::Empty => Ok(None),
        };
        let mut record = next.map_err(|e| at_page(e, page))?;
        if let Some(record) = &mut record {
            record.origin.page = Some(page);
        }
        Ok(record)
    }
}

/// Parses a JSON page, telling a body cut short from a malformed one.
fn parse_json(body: &[u8], input: &PageInput) -> Result<Value, Error> {
    let text = strip_bom(body);
    serde_json::from_slice(text).map_err(|e| {
        let blank = text.iter().all(u8::is_ascii_whitespace);
        if e.classify() == Category::Eof && !blank {
            truncated(input, &e)
        } else {
            Error::Parse {
                location: Location {
                    resource: input.resource.to_string(),
                    page: Some(input.number),
                    record: None,
                    line: Some(u64::try_from(e.line()).unwrap_or(u64::MAX)),
                },
                message: format!("invalid JSON: {e}"),
            }
        }
    })
}

/// An NDJSON body whose last line has no newline and stops mid-value was
/// cut short. (A complete last line without a newline is fine.)
fn check_last_line(body: &[u8], input: &PageInput) -> Result<(), Error> {
    if body.ends_with(b"\n") {
        return Ok(());
    }
    let last = body.rsplit(|&b| b == b'\n').next().unwrap_or_default();
    if last.iter().all(u8::is_ascii_whitespace) {
        return Ok(());
    }
    match serde_json::from_slice::<serde::de::IgnoredAny>(strip_bom(last)) {
        Err(e) if e.classify() == Category::Eof => Err(truncated(input, &e)),
        _ => Ok(()),
    }
}

fn truncated(input: &PageInput, err: &serde_json::Error) -> Error {
    Error::source_transient(format!(
        "{} page {}: the response body ends in the middle of a value (truncated response): {err}",
        input.resource, input.number
    ))
}

/// The continuation known from the page itself (cursor and link styles).
fn continuation(input: &PageInput, doc: Option<&Value>) -> Result<Continuation, Error> {
    let fail = |why: String| {
        Error::source_permanent(format!("{} page {}: {why}", input.resource, input.number))
    };
    match &input.pagination {
        Pagination::None => Ok(Continuation::Known(None)),
        Pagination::Page { .. } | Pagination::Offset { .. } => Ok(Continuation::ByCount),
        Pagination::Cursor { cursor, .. } => match doc {
            Some(doc) => paging::after_cursor(cursor, &input.request, doc)
                .map(Continuation::Known)
                .map_err(fail),
            // 204 No Content: no body, no cursor, no more pages.
            None => Ok(Continuation::Known(None)),
        },
        Pagination::LinkHeader => {
            let next = input.next_link.clone();
            if let (Some(next), PageRequest::LinkHeader { url: Some(current) }) =
                (&next, &input.request)
            {
                if next == current {
                    return Err(fail(
                        "the rel=\"next\" link points to this page again; stopping instead of looping".into(),
                    ));
                }
            }
            Ok(Continuation::Known(
                next.map(|url| PageRequest::LinkHeader { url: Some(url) }),
            ))
        }
    }
}

/// Puts the page number into a parse error's location.
fn at_page(err: Error, page: u64) -> Error {
    match err {
        Error::Parse {
            mut location,
            message,
        } => {
            location.page = Some(page);
            Error::Parse { location, message }
        }
        Error::Validation {
            mut location,
            field,
            value,
            message,
        } => {
            location.page = Some(page);
            Error::Validation {
                location,
                field,
                value,
                message,
            }
        }
        other => other,
    }
}
