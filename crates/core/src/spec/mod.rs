//! The pipeline file (`pipelines/NAME.toml`), parsed with serde and checked.
//!
//! Every struct denies unknown keys: a misspelt `on_mising` must be an
//! error, not a silently ignored safety rail. [`Pipeline::load`] names the
//! file and the offending key in every error.
//!
//! This module holds the file as a whole: [`PipelineSpec`], `[period]`, and
//! the loaded [`Pipeline`] with what is derived from it (the due periods,
//! the command-line periods, the environment check). Each other section
//! lives in its own child module with its checks beside it, and everything
//! is re-exported here, so `tidemark_core::spec::X` names every type:
//!
//! - `source`: `[[sources]]` (file and HTTP transports, pagination);
//! - `sql`: `transport = "sql"` (the query's parameters, keyset chunks);
//! - `fields`: `[fields]` (types, `added` for schema evolution);
//! - `load`: `[load]` (table, key, reconciliation, memory budget);
//! - `retry`: `[retry]` and the backoff policy;
//! - `schedule`: `[schedule]` (interval or cron);
//! - `names`: the identifier rules both databases impose;
//! - `check`: the shared `Checker` and the bounds of durations and numbers.

mod check;
mod fields;
mod load;
mod names;
mod notify;
mod retry;
mod schedule;
mod schema;
mod source;
mod sql;

use std::path::{Path, PathBuf};
use std::time::Duration;

use chrono_tz::Tz;
use indexmap::IndexMap;
use schemars::JsonSchema;
use serde::Deserialize;

use crate::error::Error;
use crate::period::{Granularity, Period};
use crate::template::Template;
use check::{Checker, EVERY, LAG, LOOKBACK};
use schedule::parse_cron;

pub use bytesize::ByteSize;
pub use fields::{Added, FieldSpec};
pub use load::{DuplicateKeyPolicy, LoadSpec, OnMissing};
pub use names::{MAX_IDENTIFIER, RUN_KEY_INDEX_SUFFIX};
pub use notify::{redacted_url, render_url, LineageSpec, NoticeKind, NotifyFormat, NotifySpec};
pub use retry::{RetryPolicy, RetrySpec};
pub use schedule::{Schedule, ScheduleSpec, SCHEDULE_HORIZON_YEARS};
pub use schema::json_schema;
pub use source::{
    CustomSourceSpec, ExpectCount, FileSourceSpec, Format, HttpSourceSpec, MissingPolicy,
    PageLimits, Pagination, RateLimit, SourceSpec, DEFAULT_STREAMED_PAGE_BYTES, HELD_WHOLE_DIVISOR,
};
pub use sql::{split_query, SqlParam, SqlPiece, SqlSourceSpec, TimeKind};

/// A whole pipeline file.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PipelineSpec {
    /// Pipeline name; part of every run key.
    #[schemars(length(min = 1))]
    pub name: String,
    /// Export type; part of every run key and of every loaded row.
    #[schemars(length(min = 1))]
    pub export_type: String,
    /// Handler version, recorded on every run.
    #[serde(default = "default_version")]
    pub version: String,
    /// How periods are cut.
    pub period: PeriodSpec,
    /// One or more sources; each is its own run key.
    #[schemars(length(min = 1))]
    pub sources: Vec<SourceSpec>,
    /// Output columns, in table order.
    #[schemars(schema_with = "schema::fields")]
    pub fields: IndexMap<String, FieldSpec>,
    /// Destination and reconciliation.
    pub load: LoadSpec,
    /// Retry policy for transient errors.
    #[serde(default)]
    pub retry: RetrySpec,
    /// When `sync`/`serve` consider a period due.
    #[serde(default)]
    pub schedule: Option<ScheduleSpec>,
    /// Webhooks told about changes of the run keys' states.
    #[serde(default)]
    pub notify: Vec<NotifySpec>,
    /// An OpenLineage endpoint told about every attempt.
    #[serde(default)]
    pub lineage: Option<LineageSpec>,
}

fn default_version() -> String {
    "1".to_string()
}

/// `[period]`.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PeriodSpec {
    /// hour, day, week (ISO) or month.
    pub granularity: Granularity,
    /// IANA timezone name; periods follow its wall clock.
    #[serde(default = "default_timezone")]
    #[schemars(schema_with = "schema::timezone")]
    pub timezone: Tz,
    /// First period for `sync`.
    #[serde(default)]
    pub start: Option<String>,
    /// A period is due once its end plus `lag` has passed (`2h`).
    #[serde(default)]
    pub lag: Option<String>,
    /// `sync` re-runs the last N done periods to catch late data.
    #[serde(default)]
    #[schemars(range(min = LOOKBACK.min.0, max = LOOKBACK.max.0))]
    pub lookback: u32,
}

fn default_timezone() -> Tz {
    Tz::UTC
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

    /// Parses a period a caller names (`name`: "period"): an error naming
    /// it when the text names no period.
    pub fn period(&self, text: &str) -> Result<Period, Error> {
        self.period_arg("period", text)
    }

    /// Parses a period passed as `name` (the binary's `--from`, `--to`,
    /// ...): a usage error naming it when the text names no period, one the
    /// clocks skip, or one outside the years 0001-9999.
    pub fn period_arg(&self, name: &str, text: &str) -> Result<Period, Error> {
        Period::parse(
            text,
            self.spec.period.granularity,
            self.spec.period.timezone,
        )
        .map_err(|e| Error::config("command line", name, e.to_string()))
    }

    /// The periods `from` to `to`, both included: a usage error when `to`
    /// comes before `from`, for every command that takes a range (an empty
    /// range would otherwise do nothing and exit 0). Errors name them
    /// "from" and "to"; see [`Pipeline::period_range_named`].
    pub fn period_range(&self, from: &str, to: &str) -> Result<(Period, Period), Error> {
        self.period_range_named(("from", from), ("to", to))
    }

    /// [`Pipeline::period_range`] with the names the caller passed the
    /// bounds by (the binary's `--from`, `--to`), for its errors.
    pub fn period_range_named(
        &self,
        (from_name, from): (&str, &str),
        (to_name, to): (&str, &str),
    ) -> Result<(Period, Period), Error> {
        let from = self.period_arg(from_name, from)?;
        let to = self.period_arg(to_name, to)?;
        if to.start() < from.start() {
            return Err(Error::config(
                "command line",
                to_name,
                format!("{} is before {from_name} {}", to.label(), from.label()),
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
                SourceSpec::Custom(_) => {}
                SourceSpec::Sql(s) => templates.push((format!("sources[{i}].url"), &s.url)),
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

#[cfg(test)]
mod tests {
    use super::*;

    // A good pipeline and the helpers that parse variants of it; the tests
    // of the child modules share them (`crate::spec::tests::GOOD`).

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
}
