//! The checks a pipeline file must pass beyond what serde can express:
//! the `Checker` that names the file and the key in every error, the
//! bounds of every duration and number, and the order the checks run in.
//!
//! Separate from the types because one checker serves every section: the
//! checks of a section live with its types (`source.rs`, `fields.rs`,
//! `load.rs`, `retry.rs`) as further `impl Checker` blocks, and this module
//! holds only what they share.

use std::fmt;
use std::time::Duration;

use super::PipelineSpec;
use crate::error::Error;
use crate::template::Template;

/// The range of values a setting can work with: each end with the text
/// that names it in an error, and why values outside cannot work.
pub(super) struct Limit<T> {
    pub(super) min: (T, &'static str),
    pub(super) max: (T, &'static str),
    pub(super) why: &'static str,
}

const fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

const DAY: u64 = 86_400;

// The bounds of every duration and number in a pipeline file. Outside them a
// setting cannot work (a zero timeout fails every request; a zero offset page
// never advances), overflows (now minus a lag of 300000000y is no date), or
// holds a worker for so long that it is surely a typo.

pub(super) const TIMEOUT: Limit<Duration> = Limit {
    min: (Duration::from_millis(1), "1ms"),
    max: (secs(DAY), "24h"),
    why: "a request timeout of 0 fails every request (and each failure is retried as a timeout), and past 24h one hung request holds its period",
};
pub(super) const DELAY: Limit<Duration> = Limit {
    min: (Duration::from_millis(1), "1ms"),
    max: (secs(3_600), "1h"),
    why: "a backoff of 0 retries without any pause, and past 1h a worker sleeps on its period for longer than any outage is worth waiting out in one run",
};
pub(super) const LAG: Limit<Duration> = Limit {
    min: (Duration::ZERO, "0s"),
    max: (secs(366 * DAY), "366d"),
    why: "a period is due once its end plus the lag has passed; past 366d no period would come due for over a year",
};
pub(super) const EVERY: Limit<Duration> = Limit {
    min: (secs(1), "1s"),
    max: (secs(366 * DAY), "366d"),
    why: "an interval of 0 would run sync without pause, and past 366d it would not run in over a year (use cron for rare runs)",
};
pub(super) const MAX_ATTEMPTS: Limit<u32> = Limit {
    min: (1, "1"),
    max: (100, "100"),
    why: "the tries of one operation, the first included: 0 never tries, and past 100 a broken source is retried for hours",
};
pub(super) const PER_SECOND: Limit<u32> = Limit {
    min: (1, "1"),
    max: (1_000_000, "1000000"),
    why: "0 requests per second never sends one, and past 1000000 the limit is finer than the rate limiter's clock",
};
pub(super) const BURST: Limit<u32> = Limit {
    min: (0, "0"),
    max: (1_000_000, "1000000"),
    why: "the extra requests allowed at once; past 1000000 it is no limit",
};
pub(super) const BATCH_SIZE: Limit<usize> = Limit {
    min: (1, "1"),
    max: (1_000_000, "1000000"),
    why: "a batch is held in memory and committed as one transaction: 0 records load nothing, and past 1000000 a batch takes too much memory and too long a transaction",
};
pub(super) const MEMORY_BUDGET: Limit<u64> = Limit {
    min: (1 << 10, "1KiB"),
    max: (1 << 40, "1TiB"),
    why: "the memory one running period keeps for comparing rows: below 1KiB nothing fits, and past 1TiB no machine has it",
};
pub(super) const LOOKBACK: Limit<u32> = Limit {
    min: (0, "0"),
    max: (1_000, "1000"),
    why: "sync re-runs the last N done periods on every run; past 1000 it re-runs a whole history each time",
};
pub(super) const PAGE_SIZE: Limit<u64> = Limit {
    min: (1, "1"),
    max: (1_000_000, "1000000"),
    why: "a page of 0 records asks for nothing (an offset would never advance), and past 1000000 no API serves such a page",
};

pub(super) struct Checker<'a> {
    pub(super) file: &'a str,
}

impl Checker<'_> {
    pub(super) fn err(&self, key: impl Into<String>, message: impl Into<String>) -> Error {
        Error::config(self.file, key, message)
    }

    fn duration(&self, key: &str, text: &str) -> Result<Duration, Error> {
        humantime::parse_duration(text)
            .map_err(|e| self.err(key, format!("invalid duration {text:?}: {e}")))
    }

    /// A duration within `limit`; the error says what would work.
    pub(super) fn limited(
        &self,
        key: &str,
        text: &str,
        limit: &Limit<Duration>,
    ) -> Result<Duration, Error> {
        let value = self.duration(key, text)?;
        if (limit.min.0..=limit.max.0).contains(&value) {
            return Ok(value);
        }
        Err(self.err(
            key,
            format!(
                "{text:?} cannot work: {}; give a duration from {} to {}",
                limit.why, limit.min.1, limit.max.1
            ),
        ))
    }

    /// A number within `limit`; the error says what would work.
    pub(super) fn count<T: PartialOrd + fmt::Display>(
        &self,
        key: &str,
        value: T,
        limit: &Limit<T>,
    ) -> Result<(), Error> {
        if value >= limit.min.0 && value <= limit.max.0 {
            return Ok(());
        }
        Err(self.err(
            key,
            format!(
                "{value} cannot work: {}; give a number from {} to {}",
                limit.why, limit.min.1, limit.max.1
            ),
        ))
    }

    pub(super) fn template(&self, key: &str, text: &str) -> Result<Template, Error> {
        Template::parse(text).map_err(|e| self.err(key, e))
    }

    pub(super) fn spec(&self, spec: &PipelineSpec) -> Result<(), Error> {
        if spec.name.trim().is_empty() {
            return Err(self.err("name", "must not be empty"));
        }
        if spec.export_type.trim().is_empty() {
            return Err(self.err("export_type", "must not be empty"));
        }
        self.sources(spec)?;
        self.fields(spec)?;
        self.load(spec)?;
        self.count("period.lookback", spec.period.lookback, &LOOKBACK)?;
        self.notify(spec)?;
        if let Some(schedule) = &spec.schedule {
            match (&schedule.every, &schedule.cron) {
                (Some(every), None) => {
                    self.limited("schedule.every", every, &EVERY)?;
                }
                (None, Some(_)) => {}
                _ => return Err(self.err("schedule", "give exactly one of `every` or `cron`")),
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::spec::tests::{config_err, parse, GOOD};

    const HTTP_SOURCE: &str = r#"[[sources]]
id = "api"
transport = "http"
format = "json"
url = "http://127.0.0.1:1/orders"
"#;

    /// GOOD with its file source replaced by an HTTP one plus `extra` lines.
    fn http(extra: &str) -> String {
        let start = GOOD.find("[[sources]]").expect("sources");
        let end = GOOD.find("[fields]").expect("fields");
        format!("{}{HTTP_SOURCE}{extra}\n\n{}", &GOOD[..start], &GOOD[end..])
    }

    /// Every duration and number with a value that cannot work is a
    /// configuration error naming the key and saying what would work.
    #[test]
    fn durations_and_numbers_that_cannot_work_are_refused() {
        let retry = |body: &str| format!("{GOOD}\n[retry]\n{body}\n");
        let schedule = |every: &str| format!("{GOOD}\n[schedule]\nevery = \"{every}\"\n");
        let cases: Vec<(String, &str, &str)> = vec![
            (
                GOOD.replace("lag = \"2h\"", "lag = \"300000000y\""),
                "period.lag",
                "0s to 366d",
            ),
            (
                GOOD.replace("lag = \"2h\"", "lag = \"400d\""),
                "period.lag",
                "0s to 366d",
            ),
            (
                GOOD.replace("lag = \"2h\"", "lag = \"2h\"\nlookback = 100000"),
                "period.lookback",
                "0 to 1000",
            ),
            (
                retry("base_delay = \"0s\""),
                "retry.base_delay",
                "1ms to 1h",
            ),
            (
                retry("max_delay = \"100y\""),
                "retry.max_delay",
                "1ms to 1h",
            ),
            (
                retry("base_delay = \"10s\"\nmax_delay = \"5s\""),
                "retry.base_delay",
                "up to \"5s\"",
            ),
            (retry("max_attempts = 0"), "retry.max_attempts", "1 to 100"),
            (
                retry("max_attempts = 4000000000"),
                "retry.max_attempts",
                "1 to 100",
            ),
            (schedule("0s"), "schedule.every", "1s to 366d"),
            (schedule("1000y"), "schedule.every", "1s to 366d"),
            (
                GOOD.replace("on_missing = \"delete\"", "batch_size = 0"),
                "load.batch_size",
                "1 to 1000000",
            ),
            (
                GOOD.replace("on_missing = \"delete\"", "batch_size = 1000000000000"),
                "load.batch_size",
                "1 to 1000000",
            ),
            (
                GOOD.replace("on_missing = \"delete\"", "memory_budget = \"100B\""),
                "load.memory_budget",
                "1KiB to 1TiB",
            ),
            (
                GOOD.replace("on_missing = \"delete\"", "memory_budget = \"2PiB\""),
                "load.memory_budget",
                "1KiB to 1TiB",
            ),
            (
                GOOD.replace("on_missing = \"delete\"", "memory_budget = \"lots\""),
                "load.memory_budget",
                "such as \"64MiB\"",
            ),
            (http("timeout = \"0s\""), "sources[0].timeout", "1ms to 24h"),
            (
                http("timeout = \"1000d\""),
                "sources[0].timeout",
                "1ms to 24h",
            ),
            (
                http("rate_limit = { per_second = 0 }"),
                "sources[0].rate_limit.per_second",
                "1 to 1000000",
            ),
            (
                http("rate_limit = { per_second = 4294967295 }"),
                "sources[0].rate_limit.per_second",
                "1 to 1000000",
            ),
            (
                http("rate_limit = { per_second = 5, burst = 4294967295 }"),
                "sources[0].rate_limit.burst",
                "0 to 1000000",
            ),
            (
                http("pagination = { style = \"offset\", size = 0 }"),
                "sources[0].pagination.size",
                "1 to 1000000",
            ),
            (
                http("pagination = { style = \"page\", size = 0 }"),
                "sources[0].pagination.size",
                "1 to 1000000",
            ),
            (
                GOOD.replace("start = \"2024-01-01\"", "start = \"0000-01-01\""),
                "period.start",
                "0001-9999",
            ),
            (
                GOOD.replace("format = \"csv\"", "format = \"csv\"\ndelimiter = '\"'"),
                "sources[0].delimiter",
                "give another ASCII character",
            ),
        ];
        for (text, key, works) in cases {
            let (got_key, message) = config_err(&text);
            assert_eq!(got_key, key, "{message}");
            assert!(message.contains(works), "{key}: {message}");
            assert!(
                message.contains("give ") || message.contains("0001-9999"),
                "{key}: says what would work: {message}"
            );
        }
        // The edges themselves work.
        for text in [
            GOOD.replace("lag = \"2h\"", "lag = \"366d\""),
            GOOD.replace("lag = \"2h\"", "lag = \"0s\""),
            retry("base_delay = \"1ms\"\nmax_delay = \"1ms\"\nmax_attempts = 100"),
            http("timeout = \"24h\"\nrate_limit = { per_second = 1000000, burst = 0 }"),
            http("pagination = { style = \"offset\", size = 1000000 }"),
        ] {
            assert!(parse(&text).is_ok(), "{text}: {:?}", parse(&text).err());
        }
    }
}
