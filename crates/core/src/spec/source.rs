//! `[[sources]]`: where a period's records come from (files on disk or an
//! HTTP API), in which format, and the limits that keep a misbehaving
//! server from running away with a period.
//!
//! Separate because sources are the largest section and the only one with
//! variants (`transport = "file"` or `"http"`, five pagination styles),
//! each variant with checks of its own.

use bytesize::ByteSize;
use indexmap::IndexMap;
use schemars::JsonSchema;
use serde::Deserialize;

use super::check::{Checker, BURST, PAGE_SIZE, PER_SECOND, TIMEOUT};
use super::schema;
use super::sql::SqlSourceSpec;
use super::PipelineSpec;
use crate::error::Error;

/// Record formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Format {
    /// A JSON document; records at the `records` pointer.
    Json,
    /// One JSON object per line.
    Ndjson,
    /// CSV with a header row.
    Csv,
}

/// What to do when a file source matches no file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum MissingPolicy {
    /// Fail the run (class `source`, no retry).
    #[default]
    Error,
    /// Treat the period as having no records.
    Empty,
}

/// One `[[sources]]` entry, tagged by `transport`.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(tag = "transport", rename_all = "lowercase")]
pub enum SourceSpec {
    /// Files on disk.
    File(FileSourceSpec),
    /// An HTTP API (boxed: its spec is several times larger than a file's).
    Http(Box<HttpSourceSpec>),
    /// Read by the program that embeds the engine, through the source it
    /// registers for this id (`tidemark_engine::EngineBuilder::source`).
    Custom(CustomSourceSpec),
    /// A database: PostgreSQL, MySQL/MariaDB or SQLite (boxed, as HTTP).
    Sql(Box<SqlSourceSpec>),
}

impl SourceSpec {
    /// The source's id.
    pub fn id(&self) -> &str {
        match self {
            SourceSpec::File(s) => &s.id,
            SourceSpec::Http(s) => &s.id,
            SourceSpec::Custom(s) => &s.id,
            SourceSpec::Sql(s) => &s.id,
        }
    }
}

/// `transport = "custom"`: a source tidemark does not ship. The pipeline
/// declares it (its id is part of the run key, its records are typed by
/// `[fields]` like any other), and the program that runs the pipeline
/// supplies the reader; the `tidemark` binary cannot read it.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CustomSourceSpec {
    /// Source id; part of the run key.
    #[schemars(length(min = 1))]
    pub id: String,
}

/// `transport = "file"`.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FileSourceSpec {
    /// Source id; part of the run key.
    #[schemars(length(min = 1))]
    pub id: String,
    /// Record format.
    pub format: Format,
    /// Path template; a glob after templating. Relative to the pipeline file.
    pub path: String,
    /// What to do when no file matches.
    #[serde(default)]
    pub missing: MissingPolicy,
    /// JSON pointer to the record array (`json` format).
    #[serde(default)]
    #[schemars(regex(pattern = "^(/|$)"))]
    pub records: Option<String>,
    /// CSV delimiter (one ASCII character, default `,`).
    #[serde(default)]
    pub delimiter: Option<char>,
}

/// `transport = "http"`.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct HttpSourceSpec {
    /// Source id; part of the run key.
    #[schemars(length(min = 1))]
    pub id: String,
    /// Record format.
    pub format: Format,
    /// URL template.
    pub url: String,
    /// Query parameters (templates).
    #[serde(default)]
    pub query: IndexMap<String, String>,
    /// Headers (templates); `${ENV}` values are secrets.
    #[serde(default)]
    pub headers: IndexMap<String, String>,
    /// JSON pointer to the record array.
    #[serde(default)]
    #[schemars(regex(pattern = "^(/|$)"))]
    pub records: Option<String>,
    /// Pagination style.
    #[serde(default)]
    pub pagination: Pagination,
    /// Requests per second shared by every period of this source.
    #[serde(default)]
    pub rate_limit: Option<RateLimit>,
    /// Per-request timeout (`30s`).
    #[serde(default)]
    pub timeout: Option<String>,
    /// CSV delimiter.
    #[serde(default)]
    pub delimiter: Option<char>,
    /// The largest page body accepted, counted as decoded (after gzip):
    /// a number of bytes or a size such as `"256MiB"` or `"10MB"`. NDJSON
    /// and CSV pages are read as a stream, so for them this caps the
    /// page's total size (default `256MiB`). A JSON page is held whole, so
    /// it counts against `load.memory_budget`: at most a sixteenth of it,
    /// which is also the default (`4MiB` at the default budget).
    #[serde(default)]
    #[schemars(schema_with = "schema::byte_size")]
    pub max_page_bytes: Option<ByteSize>,
    /// The most pages one period may have: a last guard against a server
    /// that pages forever in a way the repeat checks cannot see.
    #[serde(default = "default_max_pages")]
    #[schemars(range(min = 1))]
    pub max_pages: u64,
    /// Where the source declares how many records the period has
    /// (`{ header = "X-Total-Count" }` or `{ pointer = "/meta/total" }`):
    /// a period whose rows read differ from it fails as `incomplete`.
    #[serde(default)]
    pub expect_count: Option<ExpectCount>,
}

/// `expect_count`: exactly one of `header` or `pointer` (validated).
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(extend("oneOf" = [{ "required": ["header"] }, { "required": ["pointer"] }]))]
pub struct ExpectCount {
    /// A response header holding the total (`X-Total-Count`).
    #[serde(default)]
    pub header: Option<String>,
    /// An RFC 6901 JSON pointer into a JSON page to the total (`/meta/total`).
    #[serde(default)]
    #[schemars(regex(pattern = "^/"))]
    pub pointer: Option<String>,
}

impl ExpectCount {
    /// How it reads, for messages: `header X-Total-Count`, `pointer /meta/total`.
    pub fn describe(&self) -> String {
        match (&self.header, &self.pointer) {
            (Some(h), _) => format!("header {h}"),
            (None, Some(p)) => format!("pointer {p}"),
            (None, None) => "nothing".to_string(),
        }
    }
}

/// `max_page_bytes` of a streamed (NDJSON or CSV) page when unset:
/// generous, since such a page is never held whole; a page larger than
/// this is a runaway body.
pub const DEFAULT_STREAMED_PAGE_BYTES: u64 = 256 << 20;

/// The most text held whole at once (a JSON page, one NDJSON line, one
/// CSV line) is `load.memory_budget` divided by this: with a JSON page's
/// records kept as text, about an eighth of the budget, leaving the rest
/// to the batches and the comparison state (ADR 0020).
pub const HELD_WHOLE_DIVISOR: u64 = 16;

/// What one page of an HTTP source may hold, derived from the source's
/// `max_page_bytes` and the pipeline's `load.memory_budget` (ADR 0020).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PageLimits {
    /// The most bytes (decoded) one page may have in all.
    pub page: u64,
    /// The most bytes held whole at once: the page itself for JSON, one
    /// line for NDJSON and CSV.
    pub held_whole: u64,
    /// Whether the page is read as a stream of records (NDJSON, CSV)
    /// rather than held whole (JSON).
    pub streamed: bool,
    /// Whether `page` is the configured `max_page_bytes` (not a default).
    pub page_configured: bool,
}

impl HttpSourceSpec {
    /// The page limits under a `memory_budget` (bytes). For JSON, a
    /// configured `max_page_bytes` above the held-whole share is refused
    /// when the pipeline is loaded, so `page <= held_whole` always holds.
    pub fn page_limits(&self, memory_budget: u64) -> PageLimits {
        let share = (memory_budget / HELD_WHOLE_DIVISOR).max(1);
        let configured = self.max_page_bytes.map(|b| b.as_u64());
        let streamed = self.format != Format::Json;
        let page = match (configured, streamed) {
            (Some(bytes), _) => bytes,
            (None, true) => DEFAULT_STREAMED_PAGE_BYTES,
            (None, false) => share,
        };
        PageLimits {
            page,
            held_whole: share.min(page),
            streamed,
            page_configured: configured.is_some(),
        }
    }
}

/// Generous: 100,000 pages of 100 records is ten million records in one
/// period.
const fn default_max_pages() -> u64 {
    100_000
}

/// Pagination styles.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(tag = "style", rename_all = "snake_case", deny_unknown_fields)]
pub enum Pagination {
    /// One request.
    #[default]
    None,
    /// Page numbers.
    Page {
        /// Page-number parameter.
        #[serde(default = "default_page_param")]
        param: String,
        /// Page-size parameter.
        #[serde(default)]
        size_param: Option<String>,
        /// Page size.
        #[serde(default)]
        #[schemars(range(min = PAGE_SIZE.min.0, max = PAGE_SIZE.max.0))]
        size: Option<u64>,
        /// First page number (default 1).
        #[serde(default = "default_page_start")]
        start: u64,
    },
    /// Offsets.
    Offset {
        /// Offset parameter.
        #[serde(default = "default_offset_param")]
        param: String,
        /// Limit parameter.
        #[serde(default)]
        size_param: Option<String>,
        /// Page size.
        #[schemars(range(min = PAGE_SIZE.min.0, max = PAGE_SIZE.max.0))]
        size: u64,
    },
    /// A cursor read from each response.
    Cursor {
        /// JSON pointer to the next cursor.
        #[schemars(regex(pattern = "^/"))]
        cursor: String,
        /// Query parameter that carries it.
        param: String,
    },
    /// RFC 8288 `Link: <...>; rel="next"`.
    LinkHeader,
}

fn default_page_param() -> String {
    "page".to_string()
}
fn default_offset_param() -> String {
    "offset".to_string()
}
const fn default_page_start() -> u64 {
    1
}

/// `rate_limit = { per_second, burst }`.
#[derive(Debug, Clone, Copy, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RateLimit {
    /// Sustained requests per second.
    #[schemars(range(min = PER_SECOND.min.0, max = PER_SECOND.max.0))]
    pub per_second: u32,
    /// Extra requests allowed at once.
    #[serde(default)]
    #[schemars(range(min = BURST.min.0, max = BURST.max.0))]
    pub burst: Option<u32>,
}

impl Checker<'_> {
    pub(super) fn sources(&self, spec: &PipelineSpec) -> Result<(), Error> {
        if spec.sources.is_empty() {
            return Err(self.err("sources", "at least one [[sources]] entry is required"));
        }
        for (i, source) in spec.sources.iter().enumerate() {
            let at = |k: &str| format!("sources[{i}].{k}");
            if source.id().is_empty() {
                return Err(self.err(at("id"), "must not be empty"));
            }
            if spec.sources[..i].iter().any(|s| s.id() == source.id()) {
                return Err(self.err(at("id"), format!("duplicate source id {:?}", source.id())));
            }
            match source {
                SourceSpec::Custom(_) => {}
                SourceSpec::Sql(s) => {
                    self.sql_source(&at, s)?;
                    if let Some(rl) = s.rate_limit {
                        self.count(&at("rate_limit.per_second"), rl.per_second, &PER_SECOND)?;
                        self.count(&at("rate_limit.burst"), rl.burst.unwrap_or(0), &BURST)?;
                    }
                }
                SourceSpec::File(f) => {
                    self.template(&at("path"), &f.path)?;
                    self.records_pointer(&at("records"), f.format, f.records.as_deref())?;
                    self.delimiter(&at("delimiter"), f.delimiter)?;
                }
                SourceSpec::Http(h) => {
                    self.template(&at("url"), &h.url)?;
                    for (k, v) in &h.query {
                        self.template(&at(&format!("query.{k}")), v)?;
                    }
                    for (k, v) in &h.headers {
                        self.template(&at(&format!("headers.{k}")), v)?;
                    }
                    self.records_pointer(&at("records"), h.format, h.records.as_deref())?;
                    self.delimiter(&at("delimiter"), h.delimiter)?;
                    if let Some(t) = &h.timeout {
                        self.limited(&at("timeout"), t, &TIMEOUT)?;
                    }
                    if let Some(rl) = h.rate_limit {
                        self.count(&at("rate_limit.per_second"), rl.per_second, &PER_SECOND)?;
                        self.count(&at("rate_limit.burst"), rl.burst.unwrap_or(0), &BURST)?;
                    }
                    match h.pagination {
                        Pagination::Page {
                            size: Some(size), ..
                        }
                        | Pagination::Offset { size, .. } => {
                            self.count(&at("pagination.size"), size, &PAGE_SIZE)?;
                        }
                        _ => {}
                    }
                    if let Pagination::Cursor { cursor, .. } = &h.pagination {
                        if !cursor.starts_with('/') {
                            return Err(self.err(
                                at("pagination.cursor"),
                                "must be a JSON pointer such as \"/next\"",
                            ));
                        }
                    }
                    self.http_limits(&at, h, spec.load.memory_budget_bytes())?;
                    if let Some(expect) = &h.expect_count {
                        self.expect_count(&at("expect_count"), h.format, expect)?;
                    }
                }
            }
        }
        Ok(())
    }

    /// `max_page_bytes` and `max_pages`: a zero limit would fail every
    /// period at its first page, and a JSON page (held whole) larger than
    /// its share of `load.memory_budget` would break the budget.
    fn http_limits(
        &self,
        at: &dyn Fn(&str) -> String,
        h: &HttpSourceSpec,
        memory_budget: u64,
    ) -> Result<(), Error> {
        let limits = h.page_limits(memory_budget);
        if limits.page == 0 {
            return Err(self.err(at("max_page_bytes"), "must be at least 1 byte"));
        }
        if !limits.streamed && limits.page > memory_budget / HELD_WHOLE_DIVISOR {
            let show = |b: u64| ByteSize::b(b).to_string_as(true);
            return Err(self.err(
                at("max_page_bytes"),
                format!(
                    "{} is more than a JSON page may be: a JSON page is held whole, so it may take \
                     at most load.memory_budget / {HELD_WHOLE_DIVISOR} = {}; lower it, or raise \
                     load.memory_budget to at least {} (NDJSON and CSV pages are streamed and \
                     have no such bound)",
                    show(limits.page),
                    show(memory_budget / HELD_WHOLE_DIVISOR),
                    show(limits.page.saturating_mul(HELD_WHOLE_DIVISOR)),
                ),
            ));
        }
        if h.max_pages == 0 {
            return Err(self.err(at("max_pages"), "must be at least 1"));
        }
        Ok(())
    }

    /// `expect_count`: exactly one of `header` (a header name) or
    /// `pointer` (a JSON pointer, for JSON pages only).
    fn expect_count(&self, key: &str, format: Format, expect: &ExpectCount) -> Result<(), Error> {
        match (&expect.header, &expect.pointer) {
            (Some(header), None) => {
                let token = |c: char| c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c);
                if header.is_empty() || !header.chars().all(token) {
                    return Err(self.err(
                        format!("{key}.header"),
                        format!("{header:?} is not an HTTP header name"),
                    ));
                }
                Ok(())
            }
            (None, Some(pointer)) => {
                if !pointer.starts_with('/') {
                    return Err(self.err(
                        format!("{key}.pointer"),
                        format!("{pointer:?} is not a JSON pointer (RFC 6901): it must start with /, such as \"/meta/total\""),
                    ));
                }
                if format != Format::Json {
                    return Err(self.err(
                        format!("{key}.pointer"),
                        "a pointer reads a JSON page: it needs format = \"json\" (use `header` for other formats)",
                    ));
                }
                Ok(())
            }
            _ => Err(self.err(
                key,
                "give exactly one of `header` (\"X-Total-Count\") or `pointer` (\"/meta/total\")",
            )),
        }
    }

    fn records_pointer(
        &self,
        key: &str,
        format: Format,
        pointer: Option<&str>,
    ) -> Result<(), Error> {
        match pointer {
            Some(p) if format != Format::Json => Err(self.err(
                key,
                format!("`records` only applies to format \"json\" (got {p:?})"),
            )),
            Some(p) if !p.is_empty() && !p.starts_with('/') => Err(self.err(
                key,
                format!("{p:?} is not a JSON pointer (RFC 6901): it must be empty or start with /"),
            )),
            _ => Ok(()),
        }
    }

    fn delimiter(&self, key: &str, delimiter: Option<char>) -> Result<(), Error> {
        match delimiter {
            Some(c) if !c.is_ascii() => Err(self.err(key, "must be one ASCII character")),
            // The quote and line ends already mean something in CSV.
            Some(c @ ('"' | '\n' | '\r')) => Err(self.err(
                key,
                format!("{c:?} cannot work: it already quotes or ends CSV records; give another ASCII character such as ';' or '\\t'"),
            )),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::tests::{config_err, parse, GOOD};

    #[test]
    fn http_page_limits_take_bytes_or_sizes_and_refuse_zero() {
        let http = |format: &str, extra: &str| {
            GOOD.replace(
                "transport = \"file\"\nformat = \"csv\"\npath = \"exports/{period.start:%Y/%m/%d}/orders*.csv\"",
                &format!("transport = \"http\"\nformat = \"{format}\"\nurl = \"http://127.0.0.1:9/o\"\n{extra}"),
            )
        };
        let limits = |text: &str| {
            let p = parse(text).unwrap();
            match &p.spec.sources[0] {
                SourceSpec::Http(h) => (
                    h.page_limits(p.spec.load.memory_budget_bytes()),
                    h.max_pages,
                ),
                _ => panic!("expected an HTTP source"),
            }
        };
        let (json, pages) = limits(&http("json", ""));
        assert_eq!(
            (json.page, json.held_whole, pages),
            (4 << 20, 4 << 20, 100_000),
            "defaults"
        );
        assert!(!json.streamed && !json.page_configured);
        let (ndjson, _) = limits(&http("ndjson", ""));
        assert_eq!((ndjson.page, ndjson.held_whole), (256 << 20, 4 << 20));
        assert!(ndjson.streamed);
        assert_eq!(
            limits(&http("csv", "max_page_bytes = \"10MB\"")).0.page,
            10_000_000
        );
        assert_eq!(
            limits(&http("ndjson", "max_page_bytes = \"1GiB\"")).0.page,
            1 << 30
        );
        assert_eq!(
            limits(&http("ndjson", "max_page_bytes = 4096"))
                .0
                .held_whole,
            4096
        );
        assert_eq!(
            limits(&http("json", "max_page_bytes = 4096\nmax_pages = 7")),
            (
                PageLimits {
                    page: 4096,
                    held_whole: 4096,
                    streamed: false,
                    page_configured: true
                },
                7
            )
        );
        let (key, _) = config_err(&http("json", "max_page_bytes = 0"));
        assert_eq!(key, "sources[0].max_page_bytes");
        let (key, _) = config_err(&http("json", "max_pages = 0"));
        assert_eq!(key, "sources[0].max_pages");
        let (_, message) = config_err(&http("json", "max_page_bytes = \"lots\""));
        assert!(message.contains("lots"), "{message}");
    }

    /// Issue 24 item 3: a JSON page is held whole, so a configured limit
    /// above its share of the budget is refused, naming the way out.
    #[test]
    fn a_json_page_larger_than_its_share_of_the_budget_is_refused() {
        let http = |extra: &str| {
            GOOD.replace(
                "transport = \"file\"\nformat = \"csv\"\npath = \"exports/{period.start:%Y/%m/%d}/orders*.csv\"",
                &format!("transport = \"http\"\nformat = \"json\"\nurl = \"http://127.0.0.1:9/o\"\n{extra}"),
            )
        };
        let (key, message) = config_err(&http("max_page_bytes = \"256MiB\""));
        assert_eq!(key, "sources[0].max_page_bytes");
        assert!(
            message.contains("load.memory_budget / 16 = 4.0 MiB")
                && message.contains("at least 4.0 GiB"),
            "{message}"
        );
        let raised = http("max_page_bytes = \"256MiB\"").replace(
            "on_missing = \"delete\"",
            "on_missing = \"delete\"\nmemory_budget = \"4GiB\"",
        );
        assert!(parse(&raised).is_ok());
    }

    #[test]
    fn expect_count_is_one_header_or_one_json_pointer() {
        let http = |format: &str, extra: &str| {
            GOOD.replace(
                "transport = \"file\"\nformat = \"csv\"\npath = \"exports/{period.start:%Y/%m/%d}/orders*.csv\"",
                &format!("transport = \"http\"\nformat = \"{format}\"\nurl = \"http://127.0.0.1:9/o\"\n{extra}"),
            )
        };
        let expect = |text: &str| match &parse(text).unwrap().spec.sources[0] {
            SourceSpec::Http(h) => h.expect_count.as_ref().map(ExpectCount::describe),
            _ => panic!("expected an HTTP source"),
        };
        assert_eq!(expect(&http("json", "")), None);
        assert_eq!(
            expect(&http(
                "csv",
                "expect_count = { header = \"X-Total-Count\" }"
            ))
            .as_deref(),
            Some("header X-Total-Count")
        );
        assert_eq!(
            expect(&http(
                "json",
                "expect_count = { pointer = \"/meta/total\" }"
            ))
            .as_deref(),
            Some("pointer /meta/total")
        );
        for (extra, format, key, says) in [
            (
                "expect_count = {}",
                "json",
                "sources[0].expect_count",
                "exactly one",
            ),
            (
                "expect_count = { header = \"X-Total\", pointer = \"/total\" }",
                "json",
                "sources[0].expect_count",
                "exactly one",
            ),
            (
                "expect_count = { header = \"X Total\" }",
                "json",
                "sources[0].expect_count.header",
                "not an HTTP header name",
            ),
            (
                "expect_count = { pointer = \"meta.total\" }",
                "json",
                "sources[0].expect_count.pointer",
                "not a JSON pointer",
            ),
            (
                "expect_count = { pointer = \"/total\" }",
                "ndjson",
                "sources[0].expect_count.pointer",
                "format = \"json\"",
            ),
        ] {
            let (got, message) = config_err(&http(format, extra));
            assert_eq!(got, key, "{extra}: {message}");
            assert!(message.contains(says), "{extra}: {message}");
        }
        let (_, message) = config_err(&http("json", "expect_count = { total = 5 }"));
        assert!(message.contains("total"), "{message}");
    }
}
