//! Templates used in paths, URLs, query parameters, headers and `value`
//! fields: `{period.start:FMT}`, `{period.end:FMT}`, `{source.id}`,
//! `{pipeline.name}` and `${ENV_NAME}`. `{{` and `}}` are literal braces.
//!
//! Templates are parsed when the pipeline is loaded, so a bad placeholder is
//! a configuration error before anything runs.

use chrono::format::{Item, StrftimeItems};
use chrono::SecondsFormat;

use crate::period::Period;

/// One piece of a parsed template.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Segment {
    Literal(String),
    PeriodStart(Option<String>),
    PeriodEnd(Option<String>),
    SourceId,
    PipelineName,
    Env(String),
}

/// A parsed template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template {
    segments: Vec<Segment>,
}

/// What a template is rendered with.
#[derive(Debug, Clone, Copy)]
pub struct TemplateContext<'a> {
    /// The period being run.
    pub period: &'a Period,
    /// The source's id.
    pub source_id: &'a str,
    /// The pipeline's name.
    pub pipeline: &'a str,
}

/// Reading an environment variable failed while rendering.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("environment variable `{0}` is not set")]
pub struct MissingEnv(pub String);

impl Template {
    /// Parses a template, explaining what is wrong on failure.
    pub fn parse(text: &str) -> Result<Template, String> {
        let mut segments = Vec::new();
        let mut literal = String::new();
        let mut chars = text.char_indices().peekable();
        while let Some((i, c)) = chars.next() {
            match c {
                '{' if matches!(chars.peek(), Some((_, '{'))) => {
                    chars.next();
                    literal.push('{');
                }
                '}' if matches!(chars.peek(), Some((_, '}'))) => {
                    chars.next();
                    literal.push('}');
                }
                '$' if matches!(chars.peek(), Some((_, '{'))) => {
                    let end = text[i..]
                        .find('}')
                        .ok_or_else(|| format!("unclosed `${{` at byte {i}"))?;
                    let name = &text[i + 2..i + end];
                    if name.is_empty()
                        || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                    {
                        return Err(format!("invalid environment variable name {name:?}"));
                    }
                    flush(&mut literal, &mut segments);
                    segments.push(Segment::Env(name.to_string()));
                    while chars.peek().is_some_and(|(j, _)| *j <= i + end) {
                        chars.next();
                    }
                }
                '{' => {
                    let end = text[i..]
                        .find('}')
                        .ok_or_else(|| format!("unclosed `{{` at byte {i}"))?;
                    let inner = &text[i + 1..i + end];
                    flush(&mut literal, &mut segments);
                    segments.push(parse_placeholder(inner)?);
                    while chars.peek().is_some_and(|(j, _)| *j <= i + end) {
                        chars.next();
                    }
                }
                '}' => {
                    return Err(format!(
                        "unmatched `}}` at byte {i} (write `}}}}` for a literal brace)"
                    ))
                }
                c => literal.push(c),
            }
        }
        flush(&mut literal, &mut segments);
        Ok(Template { segments })
    }

    /// Whether rendering reads the environment. Values that do are treated
    /// as secrets: never logged, never stored.
    pub fn uses_env(&self) -> bool {
        self.segments.iter().any(|s| matches!(s, Segment::Env(_)))
    }

    /// Whether the template depends on the period.
    pub fn uses_period(&self) -> bool {
        self.segments
            .iter()
            .any(|s| matches!(s, Segment::PeriodStart(_) | Segment::PeriodEnd(_)))
    }

    /// The environment variables the template reads.
    pub fn env_names(&self) -> impl Iterator<Item = &str> {
        self.segments.iter().filter_map(|s| match s {
            Segment::Env(name) => Some(name.as_str()),
            _ => None,
        })
    }

    /// Renders the template.
    pub fn render(&self, ctx: &TemplateContext<'_>) -> Result<String, MissingEnv> {
        self.render_with_env(ctx, |name| std::env::var(name).ok())
    }

    /// Renders with an explicit environment lookup (tests, redaction).
    pub fn render_with_env(
        &self,
        ctx: &TemplateContext<'_>,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<String, MissingEnv> {
        let mut out = String::new();
        for segment in &self.segments {
            match segment {
                Segment::Literal(s) => out.push_str(s),
                Segment::PeriodStart(fmt) => {
                    push_time(&mut out, ctx.period.start(), fmt.as_deref())
                }
                Segment::PeriodEnd(fmt) => push_time(&mut out, ctx.period.end(), fmt.as_deref()),
                Segment::SourceId => out.push_str(ctx.source_id),
                Segment::PipelineName => out.push_str(ctx.pipeline),
                Segment::Env(name) => {
                    out.push_str(&env(name).ok_or_else(|| MissingEnv(name.clone()))?)
                }
            }
        }
        Ok(out)
    }

    /// Renders a template that reads nothing but the environment (a
    /// `[[notify]]` or `[lineage]` URL, checked at load to hold no other
    /// placeholder): `env` looks each variable up.
    pub fn render_env_only(
        &self,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<String, MissingEnv> {
        let mut out = String::new();
        for segment in &self.segments {
            match segment {
                Segment::Literal(s) => out.push_str(s),
                Segment::Env(name) => {
                    out.push_str(&env(name).ok_or_else(|| MissingEnv(name.clone()))?)
                }
                Segment::PeriodStart(_)
                | Segment::PeriodEnd(_)
                | Segment::SourceId
                | Segment::PipelineName => {}
            }
        }
        Ok(out)
    }

    /// Renders with every `${ENV}` replaced by `***`: safe to log.
    pub fn render_redacted(&self, ctx: &TemplateContext<'_>) -> String {
        self.render_with_env(ctx, |_| Some("***".to_string()))
            .unwrap_or_default()
    }
}

fn flush(literal: &mut String, segments: &mut Vec<Segment>) {
    if !literal.is_empty() {
        segments.push(Segment::Literal(std::mem::take(literal)));
    }
}

fn parse_placeholder(inner: &str) -> Result<Segment, String> {
    let (name, fmt) = match inner.split_once(':') {
        Some((name, fmt)) => (name.trim(), Some(fmt.to_string())),
        None => (inner.trim(), None),
    };
    if let Some(fmt) = &fmt {
        if StrftimeItems::new(fmt).any(|item| matches!(item, Item::Error)) {
            return Err(format!("invalid time format {fmt:?} in `{{{inner}}}`"));
        }
    }
    match (name, fmt) {
        ("period.start", fmt) => Ok(Segment::PeriodStart(fmt)),
        ("period.end", fmt) => Ok(Segment::PeriodEnd(fmt)),
        ("source.id", None) => Ok(Segment::SourceId),
        ("pipeline.name", None) => Ok(Segment::PipelineName),
        (other, _) => Err(format!(
            "unknown placeholder `{{{other}}}`; expected period.start, period.end, source.id, pipeline.name or ${{ENV}}"
        )),
    }
}

fn push_time(out: &mut String, at: chrono::DateTime<chrono_tz::Tz>, fmt: Option<&str>) {
    use std::fmt::Write;
    match fmt {
        None => out.push_str(&at.to_rfc3339_opts(SecondsFormat::Secs, true)),
        Some(fmt) => {
            let _ = write!(out, "{}", at.format(fmt));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::period::Granularity;
    use chrono_tz::Europe::Berlin;

    fn ctx_render(text: &str) -> String {
        let period = Period::parse("2024-03-07", Granularity::Day, Berlin).unwrap();
        let ctx = TemplateContext {
            period: &period,
            source_id: "shop_eu",
            pipeline: "orders",
        };
        Template::parse(text)
            .unwrap()
            .render_with_env(&ctx, |n| (n == "TOKEN").then(|| "s3cret".to_string()))
            .unwrap()
    }

    #[test]
    fn renders_period_source_and_env() {
        assert_eq!(
            ctx_render("exports/{period.start:%Y/%m/%d}/orders*.csv"),
            "exports/2024/03/07/orders*.csv"
        );
        assert_eq!(ctx_render("{period.start}"), "2024-03-07T00:00:00+01:00");
        assert_eq!(ctx_render("{period.end:%Y-%m-%d}"), "2024-03-08");
        assert_eq!(ctx_render("{period.start:%s}"), "1709766000");
        assert_eq!(ctx_render("{period.start:%z}"), "+0100");
        assert_eq!(ctx_render("{source.id}-{pipeline.name}"), "shop_eu-orders");
        assert_eq!(ctx_render("Bearer ${TOKEN}"), "Bearer s3cret");
        assert_eq!(ctx_render("{{literal}}"), "{literal}");
    }

    #[test]
    fn rejects_bad_templates() {
        assert!(Template::parse("{period.middle}")
            .unwrap_err()
            .contains("unknown placeholder"));
        assert!(Template::parse("{period.start")
            .unwrap_err()
            .contains("unclosed"));
        assert!(Template::parse("{period.start:%Q}")
            .unwrap_err()
            .contains("invalid time format"));
        assert!(Template::parse("${}").is_err());
    }

    #[test]
    fn env_is_reported_and_redacted() {
        let t = Template::parse("Bearer ${TOKEN}").unwrap();
        assert!(t.uses_env());
        assert_eq!(t.env_names().collect::<Vec<_>>(), ["TOKEN"]);
        let period = Period::parse("2024-03-07", Granularity::Day, Berlin).unwrap();
        let ctx = TemplateContext {
            period: &period,
            source_id: "s",
            pipeline: "p",
        };
        assert_eq!(t.render_redacted(&ctx), "Bearer ***");
        assert_eq!(
            t.render_with_env(&ctx, |_| None),
            Err(MissingEnv("TOKEN".into()))
        );
    }
}
