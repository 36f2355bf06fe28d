//! Decoding one page's body into records, with the file reader's parsers
//! (the same `RawData`, the same rules for CSV headers, NDJSON lines and
//! JSON record pointers, the same bad rows).
//!
//! A JSON body reaching this module arrived whole: the transport already
//! failed (transiently) any body shorter than declared, a broken chunked
//! stream and a reset. So a body that cannot be decoded, a JSON document
//! that stops mid-value included, is a permanent parse error naming the
//! page and the position. An NDJSON or CSV body is decoded while it
//! arrives ([`BodyStream`]): its records are handed out before its end is
//! seen, and a transport failure met later surfaces from the record being
//! read, still transient, while an NDJSON last line that stops mid-value
//! in a complete body is the same parse error as before. When the server
//! answered with a web page (`Content-Type: text/html`, as proxies and
//! login walls do), the message says so and quotes the start of the body
//! (of a stream, its first bytes).

use std::io::{self, Read};
use std::sync::Arc;

use serde_json::error::Category;
use serde_json::Value;
use tidemark_core::spec::{ExpectCount, Pagination};
use tidemark_core::{Error, Location, RawRecord};
use xxhash_rust::xxh3::Xxh3;

use super::json_page;
use super::paging::{self, Continuation, PageRequest};
use super::request::Body;
use super::stream::{BodyStream, EndHandle};
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

/// The bytes an NDJSON or CSV page is decoded from: the body in memory,
/// or the stream of it.
type Input = Box<dyn Read + Send>;

/// The records of one page, decoded lazily where the format allows.
pub(crate) struct Records {
    rows: Rows,
    /// How the streamed body ended, when the page is streamed.
    stream: Option<EndHandle>,
}

enum Rows {
    Json(JsonCursor),
    Ndjson(Box<NdjsonCursor<Input>>),
    Csv(Box<CsvCursor<Input>>),
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
    /// Decodes `body`. CSV and NDJSON rows are parsed as they are taken
    /// (and, from a stream, as they arrive); a JSON document is parsed
    /// whole. Reads from a stream, so it runs on a blocking thread.
    pub(crate) fn decode(&self, body: Body, input: &PageInput) -> Result<Decoded, Error> {
        if input.no_content {
            return Ok(Decoded {
                records: Records {
                    rows: Rows::Empty,
                    stream: None,
                },
                continuation: continuation(input, None)?,
                total: None,
            });
        }
        let (body, stream) = match body {
            Body::Whole(bytes) => (Whole::Bytes(bytes), None),
            Body::Streamed(stream) => {
                let end = stream.end();
                (Whole::Stream(stream), Some(end))
            }
        };
        let resource = Arc::clone(&input.resource);
        let rows = match self {
            Decoder::Json { pointer } => {
                let body = body.into_bytes()?;
                let (doc, texts) = parse_page(&body, pointer, input)?;
                drop(body);
                let continuation = continuation(input, Some(&doc))?;
                let total = declared_total(input, Some(&doc))?;
                let cursor = match texts {
                    Some(texts) => Ok(JsonCursor::from_texts(texts, resource)),
                    None => JsonCursor::from_document(doc, resource, pointer),
                };
                let cursor = cursor.map_err(|e| at_page(e, input.number))?;
                return Ok(Decoded {
                    records: Records {
                        rows: Rows::Json(cursor),
                        stream,
                    },
                    continuation,
                    total,
                });
            }
            Decoder::Ndjson => {
                let reader = body.checked(input, "ndjson")?;
                Rows::Ndjson(Box::new(NdjsonCursor::new(reader, resource, Xxh3::new())))
            }
            Decoder::Csv(rules) => {
                let reader = body.checked(input, "csv")?;
                let rules = Arc::clone(rules);
                let cursor = CsvCursor::open(reader, resource, rules, Xxh3::new());
                let cursor =
                    cursor.map_err(|e| streamed_error(e, stream.as_ref(), input.number))?;
                Rows::Csv(Box::new(cursor))
            }
        };
        Ok(Decoded {
            records: Records { rows, stream },
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

/// A page's body before decoding.
enum Whole {
    Bytes(Vec<u8>),
    Stream(BodyStream),
}

impl Whole {
    /// The whole body, read to its end if it is a stream (a JSON page is
    /// read whole; its stream, if any, keeps the same limits).
    fn into_bytes(self) -> Result<Vec<u8>, Error> {
        match self {
            Whole::Bytes(bytes) => Ok(bytes),
            Whole::Stream(mut stream) => stream.head(usize::MAX),
        }
    }

    /// The body as an NDJSON or CSV input, once its start shows it is not
    /// a web page (and, when whole, that its last line is not cut).
    fn checked(self, input: &PageInput, format: &str) -> Result<Input, Error> {
        match self {
            Whole::Bytes(bytes) => {
                refuse_html(&bytes, input, format)?;
                if format == "ndjson" {
                    check_last_line(&bytes, input)?;
                }
                Ok(Box::new(io::Cursor::new(bytes)))
            }
            Whole::Stream(mut stream) => {
                let head = stream.head(QUOTED_BYTES)?;
                refuse_html(&head, input, format)?;
                Ok(Box::new(io::Cursor::new(head).chain(stream)))
            }
        }
    }
}

/// An error met while reading a streamed body: the body's own (typed)
/// error when the stream ended with one, else `err` at the page.
fn streamed_error(err: Error, stream: Option<&EndHandle>, page: u64) -> Error {
    match stream.and_then(EndHandle::failure) {
        Some(failure) => failure,
        None => at_page(err, page),
    }
}

impl Records {
    /// The hash of the whole body, for a streamed page read to its end
    /// (a whole body is hashed when it is fetched).
    pub(crate) fn streamed_digest(&self) -> Option<u64> {
        self.stream.as_ref().and_then(EndHandle::digest)
    }

    /// The page's next record, its origin naming the page.
    pub(crate) fn next_record(&mut self, page: u64) -> Result<Option<RawRecord>, Error> {
        let next = match &mut self.rows {
            Rows::Json(c) => c.next_record(),
            Rows::Ndjson(c) => c.next_record(),
            Rows::Csv(c) => c.next_record(),
            Rows::Empty => Ok(None),
        };
        let mut record = next.map_err(|e| streamed_error(e, self.stream.as_ref(), page))?;
        if let Some(record) = &mut record {
            record.origin.page = Some(page);
            if let tidemark_core::RawData::Malformed { error, .. } = &mut record.data {
                **error = at_page((**error).clone(), page);
            }
        }
        Ok(record)
    }
}

/// Parses a JSON page: the document, and the records at `pointer` as
/// texts ([`json_page`]) unless the cursor or the declared total is read
/// from inside them (then the document holds them, parsed).
fn parse_page(
    body: &[u8],
    pointer: &str,
    input: &PageInput,
) -> Result<(Value, Option<Vec<String>>), Error> {
    let cursor = match &input.pagination {
        Pagination::Cursor { cursor, .. } => Some(cursor.as_str()),
        _ => None,
    };
    let total = input
        .expect_count
        .as_ref()
        .and_then(|e| e.pointer.as_deref());
    if [cursor, total]
        .into_iter()
        .flatten()
        .any(|p| json_page::reads_records(pointer, p))
    {
        return parse_json(body, input).map(|doc| (doc, None));
    }
    let split =
        json_page::split(strip_bom(body), pointer).map_err(|e| json_error(&e, body, input))?;
    Ok((split.doc, split.records))
}

/// Parses a JSON page. The body is complete (see the module
/// documentation), so every failure is a parse error.
fn parse_json(body: &[u8], input: &PageInput) -> Result<Value, Error> {
    serde_json::from_slice(strip_bom(body)).map_err(|e| json_error(&e, body, input))
}

/// A JSON page that does not parse: a parse error at its line.
fn json_error(e: &serde_json::Error, body: &[u8], input: &PageInput) -> Error {
    Error::Parse {
        location: Location {
            resource: input.resource.to_string(),
            page: Some(input.number),
            record: None,
            line: Some(u64::try_from(e.line()).unwrap_or(u64::MAX)),
        },
        message: format!("invalid JSON{}: {e}", not_json_hint(body, input)),
    }
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
