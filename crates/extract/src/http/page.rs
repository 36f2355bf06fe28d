//! Decoding one page's body into records, with the file reader's parsers
//! (the same `RawData`, the same rules for CSV headers, NDJSON lines and
//! JSON record pointers, the same bad rows).
//!
//! The body reaching this module arrived whole: the transport already
//! failed (transiently) any body shorter than declared, a broken chunked
//! stream and a reset. So a body that cannot be decoded, a JSON document or
//! an NDJSON last line that stops mid-value included, is a permanent parse
//! error naming the page and the position. When the server answered with a
//! web page (`Content-Type: text/html`, as proxies and login walls do), the
//! message says so and quotes the start of the body.

use std::io;
use std::sync::Arc;

use serde_json::error::Category;
use serde_json::Value;
use tidemark_core::spec::{ExpectCount, Pagination};
use tidemark_core::{Error, Location, RawRecord};
use xxhash_rust::xxh3::Xxh3;

use super::paging::{self, Continuation, PageRequest};
use crate::file::csv_file::{CsvCursor, CsvRules};
use crate::file::json_file::JsonCursor;
use crate::file::ndjson_file::NdjsonCursor;
use crate::file::strip_bom;

/// Bytes of a body quoted in a message about it.
const QUOTED_BYTES: usize = 80;

/// How the source's pages are decoded.
#[derive(Debug, Clone)]
pub(crate) enum Decoder {
    Json { pointer: String },
    Ndjson,
    Csv(Arc<CsvRules>),
}

/// The records of one page, decoded lazily where the format allows.
pub(crate) enum Records {
    Json(JsonCursor),
    Ndjson(Box<NdjsonCursor<io::Cursor<Vec<u8>>>>),
    Csv(Box<CsvCursor<io::Cursor<Vec<u8>>>>),
    /// `204 No Content`.
    Empty,
}

/// A decoded page: its records, what comes after it, and the total it
/// declares (`expect_count`; `None` when not configured, or for `204`).
pub(crate) struct Decoded {
    pub(crate) records: Records,
    pub(crate) continuation: Continuation,
    pub(crate) total: Option<u64>,
}

/// What a page is decoded with.
pub(crate) struct PageInput {
    /// The shown (redacted) URL, used as every record's resource.
    pub(crate) resource: Arc<str>,
    /// The page's 1-based number within the period.
    pub(crate) number: u64,
    pub(crate) pagination: Pagination,
    /// The sealed `rel="next"` URL, if the response had one.
    pub(crate) next_link: Option<String>,
    /// `204 No Content`: no body to decode.
    pub(crate) no_content: bool,
    /// The response's `Content-Type`.
    pub(crate) content_type: Option<String>,
    /// Where the page declares the period's total, if the source says.
    pub(crate) expect_count: Option<ExpectCount>,
    /// The value of `expect_count.header` in the response, if sent.
    pub(crate) total_header: Option<String>,
}

impl Decoder {
    /// Decodes `body`. CSV and NDJSON rows are parsed as they are taken;
    /// a JSON document is parsed whole.
    pub(crate) fn decode(&self, body: Vec<u8>, input: &PageInput) -> Result<Decoded, Error> {
        if input.no_content {
            return Ok(Decoded {
                records: Records::Empty,
                continuation: continuation(input, None)?,
                total: None,
            });
        }
        let resource = Arc::clone(&input.resource);
        let records = match self {
            Decoder::Json { pointer } => {
                let doc = parse_json(&body, input)?;
                drop(body);
                let continuation = continuation(input, Some(&doc))?;
                let total = declared_total(input, Some(&doc))?;
                let cursor = JsonCursor::from_document(doc, resource, pointer)
                    .map_err(|e| at_page(e, input.number))?;
                return Ok(Decoded {
                    records: Records::Json(cursor),
                    continuation,
                    total,
                });
            }
            Decoder::Ndjson => {
                refuse_html(&body, input, "ndjson")?;
                check_last_line(&body, input)?;
                let cursor = io::Cursor::new(body);
                Records::Ndjson(Box::new(NdjsonCursor::new(cursor, resource, Xxh3::new())))
            }
            Decoder::Csv(rules) => {
                refuse_html(&body, input, "csv")?;
                let cursor = io::Cursor::new(body);
                let rules = Arc::clone(rules);
                Records::Csv(Box::new(
                    CsvCursor::open(cursor, resource, rules, Xxh3::new())
                        .map_err(|e| at_page(e, input.number))?,
                ))
            }
        };
        Ok(Decoded {
            records,
            continuation: continuation(input, None)?,
            total: declared_total(input, None)?,
        })
    }
}

/// The total of records the page declares for the period (`expect_count`):
/// a header, or a JSON pointer into the page's document. A page that does
/// not declare it, or declares something that is no count, is a permanent
/// source error naming the header or pointer: without it the period's
/// completeness cannot be told.
fn declared_total(input: &PageInput, doc: Option<&Value>) -> Result<Option<u64>, Error> {
    let Some(expect) = &input.expect_count else {
        return Ok(None);
    };
    let fail = |why: String| {
        Error::source_permanent(format!(
            "{} page {}: {why} (expect_count)",
            input.resource, input.number
        ))
    };
    let (what, value) = match (&expect.header, &expect.pointer, doc) {
        (Some(header), _, _) => match &input.total_header {
            Some(text) => (format!("header {header}"), Value::String(text.clone())),
            None => return Err(fail(format!("the response has no {header} header"))),
        },
        (None, Some(pointer), Some(doc)) => match doc.pointer(pointer) {
            Some(value) => (format!("pointer {pointer}"), value.clone()),
            None => {
                return Err(fail(format!(
                    "the document has nothing at pointer {pointer}"
                )))
            }
        },
        _ => {
            return Err(fail(format!(
                "{} cannot be read from this page",
                expect.describe()
            )))
        }
    };
    count_of(&value)
        .map(Some)
        .ok_or_else(|| fail(format!("the {what} is {value}, not a count of records")))
}

/// A count: a non-negative JSON integer, or text holding one.
pub(crate) fn count_of(value: &Value) -> Option<u64> {
    match value {
        Value::Number(n) => n.as_u64(),
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
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
            if let tidemark_core::RawData::Malformed { error, .. } = &mut record.data {
                **error = at_page((**error).clone(), page);
            }
        }
        Ok(record)
    }
}

/// Parses a JSON page. The body is complete (see the module
/// documentation), so every failure is a parse error.
fn parse_json(body: &[u8], input: &PageInput) -> Result<Value, Error> {
    serde_json::from_slice(strip_bom(body)).map_err(|e| Error::Parse {
        location: Location {
            resource: input.resource.to_string(),
            page: Some(input.number),
            record: None,
            line: Some(u64::try_from(e.line()).unwrap_or(u64::MAX)),
        },
        message: format!("invalid JSON{}: {e}", not_json_hint(body, input)),
    })
}

/// ` (the response's Content-Type is text/html; it starts with "…")` when
/// the server did not even claim to send JSON, else nothing.
fn not_json_hint(body: &[u8], input: &PageInput) -> String {
    match &input.content_type {
        Some(ty) if !ty.to_ascii_lowercase().contains("json") => format!(
            " (the response's Content-Type is {ty}; it starts with {})",
            quote_start(body)
        ),
        _ => String::new(),
    }
}

/// A web page where records were expected: a proxy's error page or a login
/// wall answering `200`. Decoded as CSV it would yield nonsense rows, as
/// NDJSON one bad line each, so the page is refused whole.
fn refuse_html(body: &[u8], input: &PageInput, format: &str) -> Result<(), Error> {
    let html = input
        .content_type
        .as_deref()
        .is_some_and(|ty| ty.to_ascii_lowercase().contains("html"));
    let markup = strip_bom(body).trim_ascii_start().starts_with(b"<");
    if !(html && markup) {
        return Ok(());
    }
    Err(Error::Parse {
        location: page_location(input),
        message: format!(
            "the response is a web page, not {format}: its Content-Type is {} and it starts with {}",
            input.content_type.as_deref().unwrap_or_default(),
            quote_start(body)
        ),
    })
}

/// The first bytes of a body, on one line, quoted.
fn quote_start(body: &[u8]) -> String {
    let start = &strip_bom(body)[..body.len().min(QUOTED_BYTES)];
    let text = String::from_utf8_lossy(start);
    let text = text.split_whitespace().collect::<Vec<_>>().join(" ");
    let more = if body.len() > QUOTED_BYTES { "…" } else { "" };
    format!("{text:?}{more}")
}

/// An NDJSON body whose last line has no newline and stops mid-value is a
/// cut document, not a bad row: the page is refused before any of its
/// records is handed out. (A complete last line without a newline is fine.)
fn check_last_line(body: &[u8], input: &PageInput) -> Result<(), Error> {
    if body.ends_with(b"\n") {
        return Ok(());
    }
    let last = body.rsplit(|&b| b == b'\n').next().unwrap_or_default();
    if last.iter().all(u8::is_ascii_whitespace) {
        return Ok(());
    }
    match serde_json::from_slice::<serde::de::IgnoredAny>(strip_bom(last)) {
        Err(e) if e.classify() == Category::Eof => Err(Error::Parse {
            location: Location {
                line: Some(body.iter().filter(|&&b| b == b'\n').count() as u64 + 1),
                ..page_location(input)
            },
            message: format!(
                "the response is cut: its last line stops in the middle of a JSON value{}",
                not_json_hint(body, input)
            ),
        }),
        _ => Ok(()),
    }
}

fn page_location(input: &PageInput) -> Location {
    Location {
        resource: input.resource.to_string(),
        page: Some(input.number),
        record: None,
        line: None,
    }
}

/// The continuation known from the page itself (cursor and link styles).
/// A repeated cursor or link is caught by the reader, which knows every
/// request of the period.
fn continuation(input: &PageInput, doc: Option<&Value>) -> Result<Continuation, Error> {
    let fail = |why: String| {
        Error::source_permanent(format!("{} page {}: {why}", input.resource, input.number))
    };
    match &input.pagination {
        Pagination::None => Ok(Continuation::Known(None)),
        Pagination::Page { .. } | Pagination::Offset { .. } => Ok(Continuation::ByCount),
        Pagination::Cursor { cursor, .. } => match doc {
            Some(doc) => paging::after_cursor(cursor, doc)
                .map(Continuation::Known)
                .map_err(fail),
            // 204 No Content: no body, no cursor, no more pages.
            None => Ok(Continuation::Known(None)),
        },
        Pagination::LinkHeader => Ok(Continuation::Known(
            input
                .next_link
                .clone()
                .map(|url| PageRequest::LinkHeader { url: Some(url) }),
        )),
    }
}

/// Puts the page number into a parse, validation or drift error's location.
fn at_page(err: Error, page: u64) -> Error {
    match err {
        Error::SourceDrift {
            mut location,
            message,
        } => {
            location.page = Some(page);
            Error::SourceDrift { location, message }
        }
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
