//! `serve --log-url TEMPLATE`: where one attempt's logs are, so the period
//! page links each attempt to exactly its try's logs (Loki, Kibana, a
//! file server...). The template names `{run_id}`, `{attempt}`,
//! `{pipeline}` and `{period}` (the period's start as the ledger stores
//! it); each value is percent-encoded, so a `+02:00` offset or a pipeline
//! name never breaks the URL. Checked when `serve` starts: a typo in a
//! placeholder would otherwise give dead links on every page.

use std::fmt;

use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};

/// Everything but RFC 3986's unreserved characters is encoded.
const VALUE: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// The placeholders a template may name.
pub const PLACEHOLDERS: [&str; 4] = ["run_id", "attempt", "pipeline", "period"];

/// A checked log URL template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogUrl {
    parts: Vec<Part>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    Text(String),
    Placeholder(&'static str),
}

/// Why a log URL template is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LogUrlError {
    /// A `{name}` that is none of the placeholders (`PLACEHOLDERS`).
    #[error(
        "unknown placeholder {{{0}}} (known: {{run_id}}, {{attempt}}, {{pipeline}}, {{period}})"
    )]
    Unknown(String),
    /// A `{` without its `}`.
    #[error("a `{{` is not closed")]
    Unclosed,
    /// Not an http:// or https:// URL.
    #[error("not an http:// or https:// URL")]
    NotHttp,
}

/// The values of one attempt.
#[derive(Debug, Clone, Copy)]
pub struct LogValues<'a> {
    /// The attempt's run id.
    pub run_id: &'a str,
    /// Its number.
    pub attempt: i64,
    /// The pipeline.
    pub pipeline: &'a str,
    /// The period start, as stored.
    pub period: &'a str,
}

impl LogUrl {
    /// Parses and checks `template`.
    pub fn parse(template: &str) -> Result<LogUrl, LogUrlError> {
        let lower = template.trim_start().to_ascii_lowercase();
        if !(lower.starts_with("http://") || lower.starts_with("https://")) {
            return Err(LogUrlError::NotHttp);
        }
        let mut parts = Vec::new();
        let mut rest = template;
        while let Some(open) = rest.find('{') {
            if open > 0 {
                parts.push(Part::Text(rest[..open].to_string()));
            }
            let after = &rest[open + 1..];
            let close = after.find('}').ok_or(LogUrlError::Unclosed)?;
            let name = &after[..close];
            let known = PLACEHOLDERS
                .into_iter()
                .find(|p| *p == name)
                .ok_or_else(|| LogUrlError::Unknown(name.to_string()))?;
            parts.push(Part::Placeholder(known));
            rest = &after[close + 1..];
        }
        if !rest.is_empty() {
            parts.push(Part::Text(rest.to_string()));
        }
        Ok(LogUrl { parts })
    }

    /// The URL of one attempt's logs.
    pub fn render(&self, values: LogValues<'_>) -> String {
        let attempt = values.attempt.to_string();
        let mut url = String::new();
        for part in &self.parts {
            match part {
                Part::Text(text) => url.push_str(text),
                Part::Placeholder(name) => {
                    let value = match *name {
                        "run_id" => values.run_id,
                        "attempt" => &attempt,
                        "pipeline" => values.pipeline,
                        _ => values.period,
                    };
                    url.extend(utf8_percent_encode(value, VALUE));
                }
            }
        }
        url
    }
}

impl std::str::FromStr for LogUrl {
    type Err = LogUrlError;

    fn from_str(text: &str) -> Result<LogUrl, LogUrlError> {
        LogUrl::parse(text)
    }
}

impl fmt::Display for LogUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for part in &self.parts {
            match part {
                Part::Text(text) => f.write_str(text)?,
                Part::Placeholder(name) => write!(f, "{{{name}}}")?,
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const VALUES: LogValues<'static> = LogValues {
        run_id: "ab12",
        attempt: 2,
        pipeline: "orders eu",
        period: "2024-10-27T02:00:00+01:00",
    };

    #[test]
    fn placeholders_are_filled_and_encoded() {
        let url =
            LogUrl::parse("https://logs/q?run={run_id}&try={attempt}&p={pipeline}&at={period}")
                .expect("a valid template");
        assert_eq!(
            url.render(VALUES),
            "https://logs/q?run=ab12&try=2&p=orders%20eu&at=2024-10-27T02%3A00%3A00%2B01%3A00"
        );
        assert_eq!(
            url.to_string(),
            "https://logs/q?run={run_id}&try={attempt}&p={pipeline}&at={period}"
        );
    }

    #[test]
    fn bad_templates_are_refused() {
        assert_eq!(
            LogUrl::parse("https://logs/{runid}"),
            Err(LogUrlError::Unknown("runid".into()))
        );
        assert_eq!(
            LogUrl::parse("https://logs/{run_id"),
            Err(LogUrlError::Unclosed)
        );
        assert_eq!(
            LogUrl::parse("javascript:alert(1)//{run_id}"),
            Err(LogUrlError::NotHttp)
        );
    }
}
