//! `[[notify]]` and `[lineage]`: who is told about a pipeline's changes
//! (docs/ledger.md "Notices", ADR 0024).
//!
//! Separate because nothing here changes what a run does: the ledger
//! writes a notice per change into its outbox, and a deliverer sends it to
//! the URL read from here when it sends. A URL may hold `${…}` secrets; it
//! is rendered only to send, never stored or logged.

use std::time::Duration;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::check::{Checker, LAG};
use super::PipelineSpec;
use crate::error::Error;
use crate::template::Template;

/// What a notice tells: a change of a run key's state a person cares about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum NoticeKind {
    /// → failed: the first failure since done, or a failure of another class.
    Failed,
    /// failed → done.
    Recovered,
    /// Due + `late_after` passed without done (found by `serve`'s scheduler).
    Late,
    /// A reconciliation refused by the delete guard.
    GuardRefused,
    /// A done key became stale: another handler `version` or `[fields]`
    /// (found by `serve`'s scheduler).
    Stale,
    /// → failed with class `incomplete` (rows read ≠ the declared total).
    Incomplete,
    /// `tidemark notify test`: a sample (never listed in `on`).
    #[serde(skip_deserializing)]
    #[schemars(skip)]
    Test,
}

impl NoticeKind {
    /// Every kind.
    pub const ALL: [NoticeKind; 7] = [
        NoticeKind::Failed,
        NoticeKind::Recovered,
        NoticeKind::Late,
        NoticeKind::GuardRefused,
        NoticeKind::Stale,
        NoticeKind::Incomplete,
        NoticeKind::Test,
    ];

    /// The name stored and sent.
    pub fn as_str(self) -> &'static str {
        match self {
            NoticeKind::Failed => "failed",
            NoticeKind::Recovered => "recovered",
            NoticeKind::Late => "late",
            NoticeKind::GuardRefused => "guard_refused",
            NoticeKind::Stale => "stale",
            NoticeKind::Incomplete => "incomplete",
            NoticeKind::Test => "test",
        }
    }
}

impl std::fmt::Display for NoticeKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for NoticeKind {
    type Err = String;

    fn from_str(text: &str) -> Result<NoticeKind, String> {
        NoticeKind::ALL
            .into_iter()
            .find(|k| k.as_str() == text)
            .ok_or_else(|| format!("unknown notice kind `{text}`"))
    }
}

/// The body a `[[notify]]` receiver gets.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum NotifyFormat {
    /// The notice as a JSON object (a generic webhook).
    #[default]
    Json,
    /// `{"text": "..."}`, a Slack incoming webhook's message.
    Slack,
}

fn default_on() -> Vec<NoticeKind> {
    vec![
        NoticeKind::Failed,
        NoticeKind::Recovered,
        NoticeKind::Late,
        NoticeKind::GuardRefused,
        NoticeKind::Stale,
        NoticeKind::Incomplete,
    ]
}

/// One `[[notify]]` entry: a webhook told about some kinds of change.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NotifySpec {
    /// The receiver's URL; `${NAME}` reads the environment (a secret,
    /// never stored or logged).
    pub url: String,
    /// The kinds it is told (default: all of them).
    #[serde(default = "default_on")]
    pub on: Vec<NoticeKind>,
    /// `json` (default) or `slack`.
    #[serde(default)]
    pub format: NotifyFormat,
    /// `late`: this long past due (`3h`) without done. Without it, no
    /// `late` notice.
    #[serde(default)]
    pub late_after: Option<String>,
}

impl NotifySpec {
    /// `late_after` as a duration (checked when the file was loaded).
    pub fn late_after(&self) -> Option<Duration> {
        self.late_after
            .as_deref()
            .and_then(|text| humantime::parse_duration(text).ok())
    }
}

/// `[lineage]`: an OpenLineage HTTP endpoint told about every attempt.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LineageSpec {
    /// The endpoint (`…/api/v1/lineage`); `${NAME}` reads the environment.
    pub url: String,
    /// The OpenLineage namespace of the job and the datasets
    /// (`tidemark://prod`).
    pub namespace: String,
}

/// Renders a notify or lineage URL: its `${NAME}`s from the environment.
/// The error names the variable, never a value.
pub fn render_url(url: &str) -> Result<String, String> {
    let template = Template::parse(url)?;
    template
        .render_env_only(|name| std::env::var(name).ok())
        .map_err(|e| e.to_string())
}

/// The URL with every `${NAME}` shown as `${NAME}`: safe to log.
pub fn redacted_url(url: &str) -> String {
    Template::parse(url)
        .ok()
        .and_then(|t| t.render_env_only(|name| Some(format!("${{{name}}}"))).ok())
        .unwrap_or_else(|| "(invalid url)".to_string())
}

impl Checker<'_> {
    /// `[[notify]]` and `[lineage]`: URLs that read only the environment,
    /// `late_after` a duration like `lag`.
    pub(super) fn notify(&self, spec: &PipelineSpec) -> Result<(), Error> {
        for (i, notify) in spec.notify.iter().enumerate() {
            self.env_only_url(&format!("notify[{i}].url"), &notify.url)?;
            if let Some(late) = &notify.late_after {
                self.limited(&format!("notify[{i}].late_after"), late, &LAG)?;
            }
        }
        if let Some(lineage) = &spec.lineage {
            self.env_only_url("lineage.url", &lineage.url)?;
            if lineage.namespace.trim().is_empty() {
                return Err(self.err("lineage.namespace", "must not be empty"));
            }
        }
        Ok(())
    }

    fn env_only_url(&self, key: &str, url: &str) -> Result<(), Error> {
        let template = Template::parse(url).map_err(|e| self.err(key, e))?;
        if template.uses_period() || url.contains("{source.id}") || url.contains("{pipeline.name}")
        {
            return Err(self.err(
                key,
                "a notice URL may read the environment (`${NAME}`) but no period, source or pipeline placeholder",
            ));
        }
        let http = url.starts_with("http://") || url.starts_with("https://");
        if !(template.uses_env() || http) {
            return Err(self.err(key, format!("{url:?} is not an http:// or https:// URL")));
        }
        Ok(())
    }
}
