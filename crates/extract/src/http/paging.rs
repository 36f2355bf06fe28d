//! Pagination as a small state machine: a [`PageRequest`] names one page's
//! request, and the page just read (its record count, the cursor in its
//! body, its `Link` header) decides the next one or the end.
//!
//! A `PageRequest` is exactly what a checkpoint keeps, so a resumed attempt
//! fetches the page in progress again and nothing before it.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use tidemark_core::spec::Pagination;

/// The request for one page: everything that distinguishes it from the
/// other pages of the period.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "style", rename_all = "snake_case")]
pub(crate) enum PageRequest {
    /// `style = "none"`: the only request.
    None,
    /// `style = "page"`: this page number.
    Page {
        /// The page number sent in `param`.
        page: u64,
    },
    /// `style = "offset"`: records from this offset.
    Offset {
        /// The offset sent in `param`.
        offset: u64,
    },
    /// `style = "cursor"`: `None` is the first request, sent without the
    /// cursor parameter.
    Cursor {
        /// The cursor the previous page returned, *sealed* like a link URL
        /// (a server may build its cursors from the request, key included).
        cursor: Option<String>,
    },
    /// `style = "link_header"`: `None` is the configured URL; later pages
    /// follow `rel="next"`. The URL is kept *sealed* (secret values replaced
    /// by placeholders, see [`super::secrets::Secrets::seal`]) so that it can
    /// be stored in a checkpoint.
    LinkHeader {
        /// The sealed absolute URL of the page.
        url: Option<String>,
    },
}

/// Where the request after a page comes from. Cursor and link styles know
/// it as soon as the page is decoded; page and offset styles only once the
/// page's records are counted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Continuation {
    /// Known: the next request, or `None` for the last page.
    Known(Option<PageRequest>),
    /// Decided by the page's record count ([`after_count`]).
    ByCount,
}

/// The first request of a period.
pub(crate) fn first(pagination: &Pagination) -> PageRequest {
    match pagination {
        Pagination::None => PageRequest::None,
        Pagination::Page { start, .. } => PageRequest::Page { page: *start },
        Pagination::Offset { .. } => PageRequest::Offset { offset: 0 },
        Pagination::Cursor { .. } => PageRequest::Cursor { cursor: None },
        Pagination::LinkHeader => PageRequest::LinkHeader { url: None },
    }
}

/// Whether `request` belongs to `pagination`'s style: a checkpoint written
/// under another style cannot be resumed.
pub(crate) fn same_style(pagination: &Pagination, request: &PageRequest) -> bool {
    matches!(
        (pagination, request),
        (Pagination::None, PageRequest::None)
            | (Pagination::Page { .. }, PageRequest::Page { .. })
            | (Pagination::Offset { .. }, PageRequest::Offset { .. })
            | (Pagination::Cursor { .. }, PageRequest::Cursor { .. })
            | (Pagination::LinkHeader, PageRequest::LinkHeader { .. })
    )
}

/// The style's name, for messages.
pub(crate) fn style_name(pagination: &Pagination) -> &'static str {
    match pagination {
        Pagination::None => "none",
        Pagination::Page { .. } => "page",
        Pagination::Offset { .. } => "offset",
        Pagination::Cursor { .. } => "cursor",
        Pagination::LinkHeader => "link_header",
    }
}

/// The query parameters the style adds to a request, after the configured
/// `query` ones. Link-header pages carry their own parameters in the URL.
pub(crate) fn query_params(
    pagination: &Pagination,
    request: &PageRequest,
) -> Vec<(String, String)> {
    match (pagination, request) {
        (
            Pagination::Page {
                param,
                size_param,
                size,
                ..
            },
            PageRequest::Page { page },
        ) => with_size(param, *page, size_param.as_deref(), *size),
        (
            Pagination::Offset {
                param,
                size_param,
                size,
            },
            PageRequest::Offset { offset },
        ) => with_size(param, *offset, size_param.as_deref(), Some(*size)),
        (Pagination::Cursor { param, .. }, PageRequest::Cursor { cursor: Some(c) }) => {
            vec![(param.clone(), c.clone())]
        }
        _ => Vec::new(),
    }
}

fn with_size(
    param: &str,
    value: u64,
    size_param: Option<&str>,
    size: Option<u64>,
) -> Vec<(String, String)> {
    let mut params = vec![(param.to_string(), value.to_string())];
    if let (Some(name), Some(size)) = (size_param, size) {
        params.push((name.to_string(), size.to_string()));
    }
    params
}

/// The query parameter names the style sets itself; a configured `query`
/// entry of the same name would be sent twice with different values.
pub(crate) fn param_names(pagination: &Pagination) -> Vec<&str> {
    match pagination {
        Pagination::Page {
            param, size_param, ..
        }
        | Pagination::Offset {
            param, size_param, ..
        } => std::iter::once(param.as_str())
            .chain(size_param.as_deref())
            .collect(),
        Pagination::Cursor { param, .. } => vec![param.as_str()],
        Pagination::None | Pagination::LinkHeader => Vec::new(),
    }
}

/// For page and offset styles: the request after a page of `records`
/// records, or `None` when it was the last. A page shorter than `size` (or
/// an empty page) is the last one; without a configured `size` only an
/// empty page ends the period, which costs one extra request but never
/// stops early on an API whose default page size is unknown.
///
/// Offsets advance by the records actually received, so a server that
/// caps the page size below `size` still has every record read once.
pub(crate) fn after_count(
    pagination: &Pagination,
    request: &PageRequest,
    records: u64,
) -> Option<PageRequest> {
    if records == 0 {
        return None;
    }
    match (pagination, request) {
        (Pagination::Page { size, .. }, PageRequest::Page { page }) => {
            let short = size.is_some_and(|size| records < size);
            (!short).then(|| PageRequest::Page {
                page: page.saturating_add(1),
            })
        }
        (Pagination::Offset { size, .. }, PageRequest::Offset { offset }) => (records >= *size)
            .then(|| PageRequest::Offset {
                offset: offset.saturating_add(records),
            }),
        _ => None,
    }
}

/// For the cursor style: the request after a page whose body is `doc`.
/// A missing, `null` or empty cursor ends the period; a cursor that is not
/// a string or number is an error. (A cursor seen before in the period is
/// the reader's to refuse.)
pub(crate) fn after_cursor(pointer: &str, doc: &Value) -> Result<Option<PageRequest>, String> {
    let next = match doc.pointer(pointer) {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::String(s)) if s.is_empty() => return Ok(None),
        Some(Value::String(s)) => s.clone(),
        Some(Value::Number(n)) => n.to_string(),
        Some(other) => {
            return Err(format!(
                "the next cursor at {pointer:?} is {}, not a string or number",
                kind(other)
            ))
        }
    };
    Ok(Some(PageRequest::Cursor { cursor: Some(next) }))
}

fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// The target of the first `rel="next"` link in `Link` header values
/// (RFC 8288), as written (possibly relative). Relation types are
/// case-insensitive and may be a space-separated list (`rel="next last"`).
/// Malformed links are skipped rather than failing the page: the worst
/// outcome is stopping at a page whose next link could not be read, and
/// that is logged by the caller.
pub(crate) fn next_link<'a>(values: impl IntoIterator<Item = &'a str>) -> Option<String> {
    values
        .into_iter()
        .flat_map(parse_links)
        .find(|link| link.rels.iter().any(|r| r.eq_ignore_ascii_case("next")))
        .map(|link| link.target)
}

/// One link of a `Link` header.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Link {
    pub(crate) target: String,
    pub(crate) rels: Vec<String>,
}

/// Parses one `Link` header value: `<uri>; name=value; name="quoted, value", <uri2>; ...`.
pub(crate) fn parse_links(value: &str) -> Vec<Link> {
    let mut links = Vec::new();
    let mut scan = Scanner { rest: value };
    loop {
        scan.skip(|c| c == ',' || c.is_whitespace());
        if scan.rest.is_empty() {
            return links;
        }
        match scan.link() {
            Some(link) => links.push(link),
            // Skip to the next link after an unreadable one.
            None => scan.skip_past_comma(),
        }
    }
}

struct Scanner<'a> {
    rest: &'a str,
}

impl Scanner<'_> {
    fn skip(&mut self, pred: impl Fn(char) -> bool) {
        self.rest = self.rest.trim_start_matches(pred);
    }

    fn eat(&mut self, c: char) -> bool {
        match self.rest.strip_prefix(c) {
            Some(rest) => {
                self.rest = rest;
                true
            }
            None => false,
        }
    }

    fn skip_past_comma(&mut self) {
        self.rest = self.rest.split_once(',').map_or("", |(_, rest)| rest);
    }

    fn link(&mut self) -> Option<Link> {
        if !self.eat('<') {
            return None;
        }
        let (target, rest) = self.rest.split_once('>')?;
        self.rest = rest;
        let mut rels = Vec::new();
        loop {
            self.skip(char::is_whitespace);
            if !self.eat(';') {
                break;
            }
            let (name, value) = self.param()?;
            if name.eq_ignore_ascii_case("rel") && rels.is_empty() {
                rels = value.split_ascii_whitespace().map(str::to_string).collect();
            }
        }
        self.skip(char::is_whitespace);
        if !self.rest.is_empty() && !self.rest.starts_with(',') {
            return None;
        }
        Some(Link {
            target: target.trim().to_string(),
            rels,
        })
    }

    /// `name`, `name=token` or `name="quoted \"string\""`.
    fn param(&mut self) -> Option<(String, String)> {
        self.skip(char::is_whitespace);
        let end = self
            .rest
            .find(|c: char| c == '=' || c == ';' || c == ',' || c.is_whitespace())
            .unwrap_or(self.rest.len());
        let name = self.rest[..end].to_string();
        self.rest = &self.rest[end..];
        self.skip(char::is_whitespace);
        if !self.eat('=') {
            return Some((name, String::new()));
        }
        self.skip(char::is_whitespace);
        let value = if self.eat('"') {
            self.quoted()?
        } else {
            self.token()
        };
        Some((name, value))
    }

    fn quoted(&mut self) -> Option<String> {
        let mut value = String::new();
        let mut chars = self.rest.char_indices();
        while let Some((i, c)) = chars.next() {
            match c {
                '"' => {
                    self.rest = &self.rest[i + 1..];
                    return Some(value);
                }
                '\\' => value.push(chars.next()?.1),
                c => value.push(c),
            }
        }
        None
    }

    fn token(&mut self) -> String {
        let end = self
            .rest
            .find(|c: char| c == ';' || c == ',' || c.is_whitespace())
            .unwrap_or(self.rest.len());
        let token = self.rest[..end].to_string();
        self.rest = &self.rest[end..];
        token
    }
}
