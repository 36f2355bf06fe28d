//! The pipeline file (`pipelines/NAME.toml`), parsed with serde and checked.
//!
//! Every struct denies unknown keys: a misspelt `on_mising` must be an
//! error, not a silently ignored safety rail. [`Pipeline::load`] names the
//! file and the offending key in every error.

use std::path::{Path, PathBuf};
use std::time::Duration;

pub use bytesize::ByteSize;
use chrono_tz::Tz;
pub use fields::{Added, FieldSpec};
use indexmap::IndexMap;
pub use load::{DuplicateKeyPolicy, LoadSpec, OnMissing};
use serde::Deserialize;

use crate::error::Error;
use crate::period::{Granularity, Period};
use crate::template::Template;

mod check;
mod fields;
mod load;
mod names;
mod retry;
mod schedule;

use check::{Checker, BURST, EVERY, LAG, PAGE_SIZE, PER_SECOND, TIMEOUT};
pub use names::{MAX_IDENTIFIER, RUN_KEY_INDEX_SUFFIX};
pub use retry::{RetryPolicy, RetrySpec};
use schedule::parse_cron;
pub use schedule::{Schedule, ScheduleSpec, SCHEDULE_HORIZON_YEARS};

/// A whole pipeline file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PipelineSpec {
    /// Pipeline name; part of every run key.
    pub name: String,
    /// Export type; part of every run key and of every loaded row.
    pub export_type: String,
    /// Handler version, recorded on every run.
    #[serde(default = "default_version")]
    pub version: String,
    /// How periods are cut.
    pub period: PeriodSpec,
    /// One or more sources; each is its own run key.
    pub sources: Vec<SourceSpec>,
    /// Output columns, in table order.
    pub fields: IndexMap<String, FieldSpec>,
    /// Destination and reconciliation.
    pub load: LoadSpec,
    /// Retry policy for transient errors.
    #[serde(default)]
    pub retry: RetrySpec,
    /// When `sync`/`serve` consider a period due.
    #[serde(default)]
    pub schedule: Option<ScheduleSpec>,
}

fn default_version() -> String {
    "1".to_string()
}

/// `[period]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PeriodSpec {
    /// hour, day, week (ISO) or month.
    pub granularity: Granularity,
    /// IANA timezone name; periods follow its wall clock.
    #[serde(default = "default_timezone")]
    pub timezone: Tz,
    /// First period for `sync`.
    #[serde(default)]
    pub start: Option<String>,
    /// A period is due once its end plus `lag` has passed (`2h`).
    #[serde(default)]
    pub lag: Option<String>,
    /// `sync` re-runs the last N done periods to catch late data.
    #[serde(default)]
    pub lookback: u32,
}

fn default_timezone() -> Tz {
    Tz::UTC
}

/// Record formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
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
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MissingPolicy {
    /// Fail the run (class `source`, no retry).
    #[default]
    Error,
    /// Treat the period as having no records.
    Empty,
}

/// One `[[sources]]` entry, tagged by `transport`.
#[derive(Debug, Clone, Deserialize)]
#[serde(tag = "transport", rename_all = "lowercase")]
pub enum SourceSpec {
    /// Files on disk.
    File(FileSourceSpec),
    /// An HTTP API (boxed: its spec is several times larger than a file's).
    Http(Box<HttpSourceSpec>),
}

impl SourceSpec {
    /// The source's id.
    pub fn id(&self) -> &str {
        match self {
            SourceSpec::File(s) => &s.id,
            SourceSpec::Http(s) => &s.id,
        }
    }
}

/// `transport = "file"`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileSourceSpec {
    /// Source id; part of the run key.
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
    pub records: Option<String>,
    /// CSV delimiter (one ASCII character, default `,`).
    #[serde(default)]
    pub delimiter: Option<char>,
}

/// `transport = "http"`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpSourceSpec {
    /// Source id; part of the run key.
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
    /// a number of bytes or a size such as `"256MiB"` or `"10MB"`. A
    /// larger page fails the period instead of exhausting memory.
    #[serde(default = "default_max_page_bytes")]
    pub max_page_bytes: ByteSize,
    /// The most pages one period may have: a last guard against a server
    /// that pages forever in a way the repeat checks cannot see.
    #[serde(default = "default_max_pages")]
    pub max_pages: u64,
    /// Where the source declares how many records the period has
    /// (`{ header = "X-Total-Count" }` or `{ pointer = "/meta/total" }`):
    /// a period whose rows read differ from it fails as `incomplete`.
    #[serde(default)]
    pub expect_count: Option<ExpectCount>,
}

/// `expect_count`: exactly one of `header` or `pointer` (validated).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExpectCount {
    /// A response header holding the total (`X-Total-Count`).
    #[serde(default)]
    pub header: Option<String>,
    /// An RFC 6901 JSON pointer into a JSON page to the total (`/meta/total`).
    #[serde(default)]
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

/// Generous: a page this large is still one allocation a machine survives,
/// and no sane API sends one; a page larger than this is a runaway body.
const fn default_max_page_bytes() -> ByteSize {
    ByteSize::mib(256)
}

/// Generous: 100,000 pages of 100 records is ten million records in one
/// period.
const fn default_max_pages() -> u64 {
    100_000
}

/// Pagination styles.
#[derive(Debug, Clone, Default, Deserialize)]
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
        size: u64,
    },
    /// A cursor read from each response.
    Cursor {
        /// JSON pointer to the next cursor.
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
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RateLimit {
    /// Sustained requests per second.
    pub per_second: u32,
    /// Extra requests allowed at once.
    #[serde(default)]
    pub burst: Option<u32>,
}

/// A loaded, checked pipeline: the spec plus what was derived from it.
#[derive(Debug, Clone)]
pub struct Pipeline {
    /// The spec as written.
    pub spec: PipelineSpec,
    /// The file it came from.
    pub file: PathBuf,
    /// The folder relative paths resolve against.
    pub base_dir: PathBuf,
    /// `[retry]` as durations.
    pub retry: RetryPolicy,
    /// `period.lag` as a duration.
    pub lag: Duration,
    /// `period.start` parsed.
    pub first_period: Option<Period>,
    /// `[schedule]` parsed.
    pub schedule: Option<Schedule>,
}

impl Pipeline {
    /// Reads, parses and checks a pipeline file.
    pub fn load(path: &Path) -> Result<Pipeline, Error> {
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| {
            Error::config(&file, "(file)", format!("cannot read pipeline file: {e}"))
        })?;
        Pipeline::parse(&text, path)
    }

    /// Parses and checks pipeline text that came from `path`.
    pub fn parse(text: &str, path: &Path) -> Result<Pipeline, Error> {
        let file = path.display().to_string();
        let spec: PipelineSpec = toml::from_str(text).map_err(|e| {
            let key = e
                .message()
                .split('`')
                .nth(1)
                .unwrap_or("(toml)")
                .to_string();
            Error::config(&file, key, e.to_string().trim_end().replace('\n', "\n  "))
        })?;
        let base_dir = path.parent().map(Path::to_path_buf).unwrap_or_default();
        let check = Checker { file: &file };
        check.spec(&spec)?;
        let retry = check.retry(&spec.retry)?;
        let lag = match &spec.period.lag {
            Some(lag) => check.limited("period.lag", lag, &LAG)?,
            None => Duration::ZERO,
        };
        let first_period = match &spec.period.start {
            Some(start) => Some(
                Period::parse(start, spec.period.granularity, spec.period.timezone)
                    .map_err(|e| Error::config(&file, "period.start", e.to_string()))?,
            ),
            None => None,
        };
        let schedule = match &spec.schedule {
            Some(ScheduleSpec {
                every: Some(every), ..
            }) => Some(Schedule::Every(check.limited(
                "schedule.every",
                every,
                &EVERY,
            )?)),
            Some(ScheduleSpec {
                cron: Some(cron), ..
            }) => Some(Schedule::Cron(Box::new(
                parse_cron(cron).map_err(|e| check.err("schedule.cron", e))?,
            ))),
            _ => None,
        };
        if schedule.is_some() && first_period.is_none() {
            return Err(check.err(
                "schedule",
                "a schedule queues the due periods from the first one on, so it needs period.start; set it, or remove [schedule]",
            ));
        }
        Ok(Pipeline {
            spec,
            file: path.to_path_buf(),
            base_dir,
            retry,
            lag,
            first_period,
            schedule,
        })
    }

    /// The file name for error messages.
    pub fn file_name(&self) -> String {
        self.file.display().to_string()
    }

    /// Parses a period named on the command line by `--period`.
    pub fn period(&self, text: &str) -> Result<Period, Error> {
        self.period_arg("--period", text)
    }

    /// Parses a period named on the command line by `flag` (`--from`,
    /// `--to`, ...): a usage error naming the flag when the text names no
    /// period, one the clocks skip, or one outside the years 0001-9999.
    pub fn period_arg(&self, flag: &str, text: &str) -> Result<Period, Error> {
        Period::parse(
            text,
            self.spec.period.granularity,
            self.spec.period.timezone,
        )
        .map_err(|e| Error::config("command line", flag, e.to_string()))
    }

    /// The periods `--from` and `--to` name, both included: a usage error
    /// when `--to` comes before `--from`, for every command that takes a
    /// range (an empty range would otherwise do nothing and exit 0).
    pub fn period_range(&self, from: &str, to: &str) -> Result<(Period, Period), Error> {
        let from = self.period_arg("--from", from)?;
        let to = self.period_arg("--to", to)?;
        if to.start() < from.start() {
            return Err(Error::config(
                "command line",
                "--to",
                format!("{} is before --from {}", to.label(), from.label()),
            ));
        }
        Ok((from, to))
    }

    /// Every template of the pipeline that reads the environment must find
    /// its variable set; checked before anything runs. The error names the
    /// variable and the key, never a value.
    pub fn check_env(&self) -> Result<(), Error> {
        let mut templates: Vec<(String, &str)> = Vec::new();
        for (i, source) in self.spec.sources.iter().enumerate() {
            match source {
                SourceSpec::File(f) => templates.push((format!("sources[{i}].path"), &f.path)),
                SourceSpec::Http(h) => {
                    templates.push((format!("sources[{i}].url"), &h.url));
                    templates.extend(
                        h.query
                            .iter()
                            .map(|(k, v)| (format!("sources[{i}].query.{k}"), v.as_str())),
                    );
                    templates.extend(
                        h.headers
                            .iter()
                            .map(|(k, v)| (format!("sources[{i}].headers.{k}"), v.as_str())),
                    );
                }
            }
        }
        for (name, field) in &self.spec.fields {
            if let Some(value) = &field.value {
                templates.push((format!("fields.{name}.value"), value));
            }
        }
        for (key, text) in templates {
            let Ok(template) = Template::parse(text) else {
                continue;
            };
            for var in template.env_names() {
                if std::env::var_os(var).is_none() {
                    return Err(Error::config(
                        self.file_name(),
                        key,
                        format!("environment variable `{var}` is not set"),
                    ));
                }
            }
        }
        Ok(())
    }

    /// The periods `sync` considers at `now`: from `period.start` through
    /// the last period whose end plus `lag` has passed, one at a time (an
    /// hourly pipeline from 1900 has over a million: they are walked, never
    /// held at once).
    pub fn due_periods(
        &self,
        now: chrono::DateTime<chrono::Utc>,
    ) -> Result<impl Iterator<Item = Period> + '_, Error> {
        let first = self.first_period.ok_or_else(|| {
            Error::config(
                self.file_name(),
                "period.start",
                "sync needs the first period: set period.start",
            )
        })?;
        Ok(std::iter::successors(Some(first), |p| Some(p.next()))
            .take_while(move |p| self.is_due(p, now)))
    }

    /// The instant a period becomes due: its end plus `lag`. `None` only
    /// for a period so close to the year 9999 that the sum is no time.
    pub fn due_at(&self, period: &Period) -> Option<chrono::DateTime<chrono::Utc>> {
        let lag = chrono::Duration::from_std(self.lag).ok()?;
        period
            .end()
            .with_timezone(&chrono::Utc)
            .checked_add_signed(lag)
    }

    /// Whether `period` is due at `now` (its end plus `lag` has passed);
    /// what `sync` runs and what `run`/`backfill` need `--allow-open` for.
    /// A period whose due time cannot be computed is never due.
    pub fn is_due(&self, period: &Period, now: chrono::DateTime<chrono::Utc>) -> bool {
        self.due_at(period).is_some_and(|due| due <= now)
    }

    /// The source with this id.
    pub fn source(&self, id: &str) -> Option<&SourceSpec> {
        self.spec.sources.iter().find(|s| s.id() == id)
    }
}

impl Checker<'_> {
    fn sources(&self, spec: &PipelineSpec) -> Result<(), Error> {
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
                    self.http_limits(&at, h)?;
                    if let Some(expect) = &h.expect_count {
                        self.expect_count(&at("expect_count"), h.format, expect)?;
                    }
                }
            }
        }
        Ok(())
    }

    /// `max_page_bytes` and `max_pages`: a zero limit would fail every
    /// period at its first page.
    fn http_limits(&self, at: &dyn Fn(&str) -> String, h: &HttpSourceSpec) -> Result<(), Error> {
        if h.max_page_bytes.as_u64() == 0 {
            return Err(self.err(at("max_page_bytes"), "must be at least 1 byte"));
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

    pub(super) const GOOD: &str = r#"
name = "orders"
export_type = "orders_daily"
version = "3"

[period]
granularity = "day"
timezone = "Europe/Berlin"
start = "2024-01-01"
lag = "2h"

[[sources]]
id = "archive"
transport = "file"
format = "csv"
path = "exports/{period.start:%Y/%m/%d}/orders*.csv"

[fields]
order_id = { type = "text", required = true }
amount = { type = "decimal", from = "total" }
region = { type = "text", value = "{source.id}" }

[load]
table = "orders"
key = ["order_id"]
on_missing = "delete"
"#;

    pub(super) fn parse(text: &str) -> Result<Pipeline, Error> {
        Pipeline::parse(text, Path::new("pipelines/orders.toml"))
    }

    pub(super) fn config_err(text: &str) -> (String, String) {
        match parse(text).unwrap_err() {
            Error::Config { key, message, file } => {
                assert_eq!(file, "pipelines/orders.toml");
                (key, message)
            }
            other => panic!("expected a config error, got {other:?}"),
        }
    }

    #[test]
    fn parses_a_good_pipeline_in_field_order() {
        let p = parse(GOOD).unwrap();
        assert_eq!(
            p.spec.fields.keys().collect::<Vec<_>>(),
            ["order_id", "amount", "region"]
        );
        assert_eq!(p.lag, Duration::from_secs(7200));
        assert_eq!(p.spec.load.on_missing, OnMissing::Delete);
        assert_eq!(p.spec.load.batch_size, 10_000);
        assert_eq!(p.spec.load.memory_budget_bytes(), 64 << 20);
        assert_eq!(
            p.first_period.unwrap().start_rfc3339(),
            "2024-01-01T00:00:00+01:00"
        );
        assert_eq!(p.base_dir, Path::new("pipelines"));
    }

    #[test]
    fn unknown_keys_are_errors() {
        let (key, message) = config_err(&GOOD.replace("on_missing", "on_mising"));
        assert_eq!(key, "on_mising");
        assert!(message.contains("unknown field"), "{message}");
        let (key, _) = config_err(&GOOD.replace("format = \"csv\"", "format = \"csv\"\nfoo = 1"));
        assert_eq!(key, "foo");
    }

    #[test]
    fn bad_type_names_are_errors() {
        let (key, message) = config_err(&GOOD.replace("type = \"decimal\"", "type = \"money\""));
        assert_eq!(key, "money");
        assert!(message.contains("unknown variant"), "{message}");
    }

    #[test]
    fn float_keys_and_bad_templates_are_refused() {
        let text = GOOD
            .replace("type = \"decimal\"", "type = \"float\"")
            .replace("key = [\"order_id\"]", "key = [\"amount\"]");
        assert!(config_err(&text).1.contains("cannot identify"));
        let (key, _) = config_err(&GOOD.replace("{period.start:%Y/%m/%d}", "{period.begin}"));
        assert_eq!(key, "sources[0].path");
        let (_, message) = config_err(&GOOD.replace(
            "timezone = \"Europe/Berlin\"",
            "timezone = \"Mars/Olympus\"",
        ));
        assert!(message.contains("timezone"), "{message}");
    }

    #[test]
    fn due_periods_respect_start_and_lag() {
        let p = parse(GOOD).unwrap(); // day, Europe/Berlin, start 2024-01-01, lag 2h
        let at = |s: &str| {
            chrono::DateTime::parse_from_rfc3339(s)
                .unwrap()
                .with_timezone(&chrono::Utc)
        };
        // 2024-01-03 ends at 2024-01-04T00:00+01:00 = 2024-01-03T23:00Z; due from 01:00Z on.
        let due = p.due_periods(at("2024-01-04T00:59:00Z")).unwrap();
        assert_eq!(
            due.map(|d| d.label()).collect::<Vec<_>>(),
            ["2024-01-01", "2024-01-02"]
        );
        assert_eq!(
            p.due_periods(at("2024-01-04T01:00:00Z")).unwrap().count(),
            3
        );
        assert_eq!(
            p.due_periods(at("2023-12-01T00:00:00Z")).unwrap().count(),
            0
        );
        let no_start = parse(&GOOD.replace("start = \"2024-01-01\"\n", "")).unwrap();
        assert!(no_start.due_periods(at("2024-01-04T00:00:00Z")).is_err());
    }

    #[test]
    fn http_page_limits_take_bytes_or_sizes_and_refuse_zero() {
        let http = |extra: &str| {
            GOOD.replace(
                "transport = \"file\"\nformat = \"csv\"\npath = \"exports/{period.start:%Y/%m/%d}/orders*.csv\"",
                &format!("transport = \"http\"\nformat = \"json\"\nurl = \"http://127.0.0.1:9/o\"\n{extra}"),
            )
        };
        let limits = |text: &str| match &parse(text).unwrap().spec.sources[0] {
            SourceSpec::Http(h) => (h.max_page_bytes.as_u64(), h.max_pages),
            SourceSpec::File(_) => panic!("expected an HTTP source"),
        };
        assert_eq!(limits(&http("")), (256 << 20, 100_000), "defaults");
        assert_eq!(limits(&http("max_page_bytes = \"10MB\"")).0, 10_000_000);
        assert_eq!(limits(&http("max_page_bytes = \"256MiB\"")).0, 256 << 20);
        assert_eq!(
            limits(&http("max_page_bytes = 4096\nmax_pages = 7")),
            (4096, 7)
        );
        let (key, _) = config_err(&http("max_page_bytes = 0"));
        assert_eq!(key, "sources[0].max_page_bytes");
        let (key, _) = config_err(&http("max_pages = 0"));
        assert_eq!(key, "sources[0].max_pages");
        let (_, message) = config_err(&http("max_page_bytes = \"lots\""));
        assert!(message.contains("lots"), "{message}");
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
            SourceSpec::File(_) => panic!("expected an HTTP source"),
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
