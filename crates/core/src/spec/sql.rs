//! `transport = "sql"`: a period's window read from a database (PostgreSQL,
//! MySQL/MariaDB, SQLite) by a query that selects `[:period_start,
//! :period_end)`.
//!
//! Separate from the other transports because its checks are about SQL
//! text: the two period parameters are found here (outside string
//! literals, quoted identifiers and comments), so that a query that would
//! splice a value (`{…}` templates) or asks for a parameter tidemark does
//! not bind is refused when the pipeline is loaded, not when a period runs.

use indexmap::IndexMap;
use schemars::JsonSchema;
use serde::Deserialize;

use super::check::{Checker, Limit};
use super::source::RateLimit;
use crate::error::Error;

/// `transport = "sql"`.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SqlSourceSpec {
    /// Source id; part of the run key.
    #[schemars(length(min = 1))]
    pub id: String,
    /// The database: `postgres://…`, `mysql://…` (MariaDB too) or
    /// `sqlite://PATH` (relative to the pipeline file). `${ENV}` values are
    /// secrets; a password written in the URL is never shown either.
    pub url: String,
    /// The query of one period: `:period_start` and `:period_end` (and no
    /// other parameter) are bound as typed values, never spliced.
    pub query: String,
    /// Result columns that order the period's rows uniquely: the period
    /// is read in keyset chunks ordered by them, and the last key read is
    /// the checkpoint a new attempt continues after. Without it, each
    /// period is read in one read-only snapshot, from the start on resume.
    #[serde(default)]
    pub resume_key: Vec<String>,
    /// Rows per keyset chunk (one query each).
    #[serde(default = "default_chunk_size")]
    #[schemars(range(min = CHUNK_SIZE.min.0, max = CHUNK_SIZE.max.0))]
    pub chunk_size: u64,
    /// The time columns the period bounds are compared with, and what
    /// they hold: `instant` (a `timestamptz`, or UTC) or `wall_clock` (a
    /// timestamp without zone, read in the pipeline's timezone). The
    /// bounds are bound as that kind; default `instant`.
    #[serde(default)]
    pub time_columns: IndexMap<String, TimeKind>,
    /// A query with the same parameters that counts the period's rows:
    /// a period whose rows read differ from it fails as `incomplete`.
    #[serde(default)]
    pub count_query: Option<String>,
    /// Queries per second shared by every period of this source.
    #[serde(default)]
    pub rate_limit: Option<RateLimit>,
}

/// What a time column holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum TimeKind {
    /// An instant (`timestamptz`, MySQL `TIMESTAMP`, or UTC).
    #[default]
    Instant,
    /// A wall-clock time without zone, in the pipeline's timezone.
    WallClock,
}

impl SqlSourceSpec {
    /// How the period bounds are bound: the kind every declared time
    /// column shares (checked when loaded), `instant` when none is
    /// declared.
    pub fn bound_kind(&self) -> TimeKind {
        self.time_columns
            .values()
            .next()
            .copied()
            .unwrap_or_default()
    }
}

/// The two parameters a query may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SqlParam {
    /// `:period_start`, the first instant of the period.
    PeriodStart,
    /// `:period_end`, the first instant after it.
    PeriodEnd,
}

/// A query cut at its parameters: SQL text and the parameters between.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SqlPiece {
    /// SQL as written.
    Text(String),
    /// A parameter, to become the database's placeholder.
    Param(SqlParam),
}

/// The bounds of `chunk_size`.
pub(super) const CHUNK_SIZE: Limit<u64> = Limit {
    min: (1, "1"),
    max: (1_000_000, "1000000"),
    why: "a chunk is one query whose rows are held at once: 0 rows never advance, and past 1000000 a chunk takes too much memory",
};

const fn default_chunk_size() -> u64 {
    10_000
}

/// `query` cut at its `:name` parameters. Text inside string literals,
/// quoted identifiers and comments is SQL as written, and so are `::`
/// (a PostgreSQL cast) and `:=`. Errors name what is wrong.
pub fn split_query(query: &str) -> Result<Vec<SqlPiece>, String> {
    // Quoted too: `'{period.start}'` would be a value spliced into SQL.
    if let Some(i) = ["${", "{period.", "{source.", "{pipeline."]
        .iter()
        .filter_map(|t| query.find(t))
        .min()
    {
        return Err(template_refused(i));
    }
    let mut pieces = Vec::new();
    let mut text = String::new();
    let mut chars = query.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        match c {
            '\'' | '"' | '`' => {
                text.push(c);
                for (_, d) in chars.by_ref() {
                    text.push(d);
                    if d == c {
                        break;
                    }
                }
            }
            '-' if query[i..].starts_with("--") => {
                let end = query[i..].find('\n').map_or(query.len(), |n| i + n);
                text.push_str(&query[i..end]);
                while chars.peek().is_some_and(|(j, _)| *j < end) {
                    chars.next();
                }
            }
            '/' if query[i..].starts_with("/*") => {
                let end = query[i + 2..].find("*/").map_or(query.len(), |n| i + n + 4);
                text.push_str(&query[i..end]);
                while chars.peek().is_some_and(|(j, _)| *j < end) {
                    chars.next();
                }
            }
            '{' => return Err(template_refused(i)),
            ':' if matches!(chars.peek(), Some((_, ':' | '='))) => {
                text.push(c);
                if let Some((_, d)) = chars.next() {
                    text.push(d);
                }
            }
            ':' if chars
                .peek()
                .is_some_and(|(_, d)| d.is_ascii_alphabetic() || *d == '_') =>
            {
                let name: String = query[i + 1..]
                    .chars()
                    .take_while(|d| d.is_ascii_alphanumeric() || *d == '_')
                    .collect();
                let param = match name.as_str() {
                    "period_start" => SqlParam::PeriodStart,
                    "period_end" => SqlParam::PeriodEnd,
                    other => {
                        return Err(format!(
                        "unknown parameter :{other}; only :period_start and :period_end are bound"
                    ))
                    }
                };
                for _ in 0..name.chars().count() {
                    chars.next();
                }
                if !text.is_empty() {
                    pieces.push(SqlPiece::Text(std::mem::take(&mut text)));
                }
                pieces.push(SqlPiece::Param(param));
            }
            c => text.push(c),
        }
    }
    let trimmed = text.trim_end().trim_end_matches(';').trim_end();
    if !trimmed.is_empty() {
        pieces.push(SqlPiece::Text(trimmed.to_string()));
    }
    Ok(pieces)
}

fn template_refused(at: usize) -> String {
    format!(
        "`{{` at byte {at}: templates are not spliced into SQL; use :period_start and \
         :period_end, which are bound as typed parameters"
    )
}

/// The URL schemes tidemark reads.
const SCHEMES: [&str; 5] = ["postgres:", "postgresql:", "mysql:", "mariadb:", "sqlite:"];

impl Checker<'_> {
    pub(super) fn sql_source(
        &self,
        at: &dyn Fn(&str) -> String,
        s: &SqlSourceSpec,
    ) -> Result<(), Error> {
        let url = self.template(&at("url"), &s.url)?;
        if url.uses_period() {
            return Err(self.err(at("url"), "the URL cannot depend on the period"));
        }
        if !s.url.starts_with("${") && !SCHEMES.iter().any(|p| s.url.starts_with(p)) {
            return Err(self.err(
                at("url"),
                "must start with postgres://, mysql:// (MariaDB too) or sqlite://",
            ));
        }
        split_query(&s.query).map_err(|e| self.err(at("query"), e))?;
        if let Some(count) = &s.count_query {
            split_query(count).map_err(|e| self.err(at("count_query"), e))?;
        }
        for (i, column) in s.resume_key.iter().enumerate() {
            if column.trim().is_empty() {
                return Err(self.err(at("resume_key"), "a column name must not be empty"));
            }
            if s.resume_key[..i].contains(column) {
                return Err(self.err(at("resume_key"), format!("{column:?} is named twice")));
            }
        }
        self.count(&at("chunk_size"), s.chunk_size, &CHUNK_SIZE)?;
        let kind = s.bound_kind();
        if let Some((column, other)) = s.time_columns.iter().find(|(_, k)| **k != kind) {
            return Err(self.err(
                at(&format!("time_columns.{column}")),
                format!(
                    "{other:?} differs from the other time columns ({kind:?}): the period bounds are \
                     bound as one kind, so every column they are compared with must hold that kind"
                ),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::tests::{config_err, parse, GOOD};
    use crate::spec::SourceSpec;

    fn sql(extra: &str) -> String {
        GOOD.replace(
            "transport = \"file\"\nformat = \"csv\"\npath = \"exports/{period.start:%Y/%m/%d}/orders*.csv\"",
            &format!("transport = \"sql\"\n{extra}"),
        )
    }

    const QUERY: &str = "url = \"sqlite://shop.db\"\nquery = \"select * from o where t >= :period_start and t < :period_end\"\n";

    #[test]
    fn a_sql_source_parses_with_its_defaults() {
        let p = parse(&sql(&format!(
            "{QUERY}resume_key = [\"t\", \"id\"]\ntime_columns = {{ t = \"wall_clock\" }}"
        )))
        .unwrap();
        let SourceSpec::Sql(s) = &p.spec.sources[0] else {
            panic!("expected a SQL source")
        };
        assert_eq!(s.chunk_size, 10_000);
        assert_eq!(s.resume_key, ["t", "id"]);
        assert_eq!(s.bound_kind(), TimeKind::WallClock);
        let p = parse(&sql(QUERY)).unwrap();
        let SourceSpec::Sql(s) = &p.spec.sources[0] else {
            panic!("expected a SQL source")
        };
        assert_eq!(s.bound_kind(), TimeKind::Instant);
    }

    #[test]
    fn bad_sql_sources_are_refused_naming_the_key() {
        for (extra, key, says) in [
            (
                "url = \"sqlite://x.db\"\nquery = \"select * from o where d = '{period.start}' or d > {period.start}\"",
                "sources[0].query",
                "templates",
            ),
            (
                "url = \"sqlite://x.db\"\nquery = \"select * from o where id = :last_id\"",
                "sources[0].query",
                ":last_id",
            ),
            (
                "url = \"ftp://x\"\nquery = \"select 1\"",
                "sources[0].url",
                "postgres://",
            ),
            (
                "url = \"sqlite://x.db\"\nquery = \"select 1\"\ncount_query = \"select count(*) from o where a = :a\"",
                "sources[0].count_query",
                ":a",
            ),
            (
                &format!("{QUERY}resume_key = [\"id\", \"id\"]"),
                "sources[0].resume_key",
                "twice",
            ),
            (
                &format!("{QUERY}chunk_size = 0"),
                "sources[0].chunk_size",
                "cannot work",
            ),
            (
                &format!("{QUERY}time_columns = {{ a = \"instant\", b = \"wall_clock\" }}"),
                "sources[0].time_columns.b",
                "one kind",
            ),
        ] {
            let (got, message) = config_err(&sql(extra));
            assert_eq!(got, key, "{extra}: {message}");
            assert!(message.contains(says), "{extra}: {message}");
        }
    }

    fn params(query: &str) -> Vec<SqlParam> {
        split_query(query)
            .unwrap()
            .into_iter()
            .filter_map(|p| match p {
                SqlPiece::Param(p) => Some(p),
                SqlPiece::Text(_) => None,
            })
            .collect()
    }

    #[test]
    fn the_two_period_parameters_are_found_outside_literals_and_comments() {
        assert_eq!(
            params("select a::text, ':x' as s, \"b:c\" from t -- :y\n where t >= :period_start /* :z */ and t < :period_end;"),
            [SqlParam::PeriodStart, SqlParam::PeriodEnd]
        );
        assert_eq!(
            split_query("select 1 where a < :period_end ;").unwrap(),
            [
                SqlPiece::Text("select 1 where a < ".into()),
                SqlPiece::Param(SqlParam::PeriodEnd)
            ]
        );
    }

    #[test]
    fn templates_and_other_parameters_are_refused() {
        let e = split_query("select * from t where d >= '{period.start}'").unwrap_err();
        assert!(e.contains("templates"), "{e}");
        let e = split_query("select * from t where id = :id").unwrap_err();
        assert!(e.contains(":id"), "{e}");
        assert!(split_query("select * from t where a := 1").is_ok());
    }
}
