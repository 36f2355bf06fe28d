//! One database value, whatever the database: what each dialect decodes
//! its columns into, what the reader turns into a record's JSON, and what a
//! checkpoint keeps of the last resume key (so that it is bound again with
//! its own type on resume, never as text the database would have to cast).

use chrono::{DateTime, NaiveDate, NaiveDateTime, SecondsFormat, TimeZone, Utc};
use chrono_tz::Tz;
use rust_decimal::Decimal;
use serde::{Deserialize, Serialize};
use serde_json::Value as Json;
use tidemark_core::spec::TimeKind;
use tidemark_core::FieldType;

/// A decoded value.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "t", content = "v", rename_all = "snake_case")]
pub(crate) enum Cell {
    /// SQL NULL.
    Null,
    /// Any integer that fits 64 bits.
    Int(i64),
    /// A binary float.
    Float(f64),
    /// An exact decimal, kept exact.
    Decimal(Decimal),
    /// Text.
    Text(String),
    /// A boolean.
    Bool(bool),
    /// A calendar date.
    Date(NaiveDate),
    /// A timestamp without zone.
    Timestamp(NaiveDateTime),
    /// An instant.
    Timestamptz(DateTime<Utc>),
    /// JSON (`json`, `jsonb`).
    Json(Json),
}

/// The naive text forms a SQLite time column is read in (SQLite keeps
/// times as text; `datetime()` writes the first).
const NAIVE_FORMS: [&str; 2] = ["%Y-%m-%d %H:%M:%S%.f", "%Y-%m-%dT%H:%M:%S%.f"];

impl Cell {
    /// The value as a declared time column holds it: an instant column
    /// that the database keeps without zone holds UTC; a wall-clock
    /// column that the database keeps as an instant is that instant's wall
    /// clock in `tz`. Text (SQLite) is read first; text that is no time is
    /// left for `[fields]` to judge.
    pub(crate) fn into_time(self, kind: TimeKind, tz: Tz) -> Cell {
        let cell = match self {
            Cell::Text(text) => match parse_time(&text) {
                Some(cell) => cell,
                None => return Cell::Text(text),
            },
            other => other,
        };
        match (cell, kind) {
            (Cell::Timestamp(t), TimeKind::Instant) => Cell::Timestamptz(Utc.from_utc_datetime(&t)),
            (Cell::Timestamptz(t), TimeKind::WallClock) => {
                Cell::Timestamp(t.with_timezone(&tz).naive_local())
            }
            (other, _) => other,
        }
    }

    /// Whether a field of type `ty` can read the value at all (whether
    /// this value parses is the field's own check, row by row). Text can
    /// hold anything (SQLite keeps everything as text), and a NULL says
    /// nothing.
    pub(crate) fn fits(&self, ty: FieldType) -> bool {
        use FieldType as F;
        match self {
            Cell::Null | Cell::Text(_) => true,
            _ if matches!(ty, F::Text | F::Json) => !matches!(self, Cell::Json(_)) || ty == F::Json,
            Cell::Int(_) => matches!(ty, F::Int | F::Float | F::Decimal | F::Bool),
            Cell::Float(_) | Cell::Decimal(_) => matches!(ty, F::Int | F::Float | F::Decimal),
            Cell::Bool(_) => ty == F::Bool,
            Cell::Date(_) => ty == F::Date,
            Cell::Timestamp(_) | Cell::Timestamptz(_) => {
                matches!(ty, F::Timestamp | F::Timestamptz)
            }
            Cell::Json(_) => false,
        }
    }

    /// What the value is, for messages.
    pub(crate) fn describe(&self) -> &'static str {
        match self {
            Cell::Null => "NULL",
            Cell::Int(_) => "an integer",
            Cell::Float(_) => "a float",
            Cell::Decimal(_) => "a decimal",
            Cell::Text(_) => "text",
            Cell::Bool(_) => "a boolean",
            Cell::Date(_) => "a date",
            Cell::Timestamp(_) => "a timestamp without zone",
            Cell::Timestamptz(_) => "an instant (timestamp with zone)",
            Cell::Json(_) => "JSON",
        }
    }

    /// The value as the text of a CSV cell, which `[fields]` types as it
    /// types a file's cell: the same value [`Cell::into_json`] gives, in
    /// far less memory and work (no JSON object per row, no key copies).
    /// NULL, and JSON `null` or `""` (which JSON records treat as absent),
    /// are the empty cell, which is absent too.
    pub(crate) fn push_text(&self, out: &mut String) {
        use std::fmt::Write as _;
        // Writing to a String cannot fail.
        let _ = match self {
            Cell::Null => Ok(()),
            Cell::Int(i) => write!(out, "{i}"),
            Cell::Float(f) => write!(out, "{f}"),
            Cell::Decimal(d) => write!(out, "{d}"),
            Cell::Text(s) => {
                out.push_str(s);
                Ok(())
            }
            Cell::Bool(b) => {
                out.push_str(if *b { "true" } else { "false" });
                Ok(())
            }
            Cell::Date(d) => write!(out, "{}", d.format("%Y-%m-%d")),
            Cell::Timestamp(t) => write!(out, "{}", t.format("%Y-%m-%dT%H:%M:%S%.f")),
            Cell::Timestamptz(t) => {
                out.push_str(&t.to_rfc3339_opts(SecondsFormat::AutoSi, true));
                Ok(())
            }
            Cell::Json(Json::Null) => Ok(()),
            Cell::Json(Json::String(s)) if s.is_empty() => Ok(()),
            Cell::Json(v) => write!(out, "{v}"),
        };
    }

    /// The value in a record: JSON that `[fields]` types as it types any
    /// JSON record (decimals as exact numbers, times as ISO 8601 text).
    pub(crate) fn into_json(self) -> Json {
        match self {
            Cell::Null => Json::Null,
            Cell::Int(i) => Json::from(i),
            Cell::Float(f) => serde_json::Number::from_f64(f)
                .map_or_else(|| Json::String(f.to_string()), Json::Number),
            Cell::Decimal(d) => {
                let text = d.to_string();
                text.parse::<serde_json::Number>()
                    .map_or(Json::String(text), Json::Number)
            }
            Cell::Text(s) => Json::String(s),
            Cell::Bool(b) => Json::Bool(b),
            Cell::Date(d) => Json::String(d.format("%Y-%m-%d").to_string()),
            Cell::Timestamp(t) => Json::String(t.format("%Y-%m-%dT%H:%M:%S%.f").to_string()),
            Cell::Timestamptz(t) => Json::String(t.to_rfc3339_opts(SecondsFormat::AutoSi, true)),
            Cell::Json(v) => v,
        }
    }
}

fn parse_time(text: &str) -> Option<Cell> {
    if let Ok(t) = DateTime::parse_from_rfc3339(text) {
        return Some(Cell::Timestamptz(t.with_timezone(&Utc)));
    }
    NAIVE_FORMS
        .iter()
        .find_map(|form| NaiveDateTime::parse_from_str(text, form).ok())
        .map(Cell::Timestamp)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A text record must say what a JSON record says, or a source would
    /// hash (and store) differently depending on how its fields are read.
    #[test]
    fn text_cells_say_what_json_cells_say() {
        let at = NaiveDate::from_ymd_opt(2026, 3, 29)
            .unwrap()
            .and_hms_micro_opt(1, 30, 5, 120)
            .unwrap();
        let cells = [
            Cell::Int(-7),
            Cell::Float(0.1),
            Cell::Float(1.5),
            Cell::Decimal("12.30".parse().unwrap()),
            Cell::Text("a, \"b\"".into()),
            Cell::Bool(false),
            Cell::Date(at.date()),
            Cell::Timestamp(at),
            Cell::Timestamptz(Utc.from_utc_datetime(&at)),
            Cell::Json(serde_json::json!({"k": [1, "x"]})),
        ];
        for cell in cells {
            let mut text = String::new();
            cell.push_text(&mut text);
            let expected = match cell.clone().into_json() {
                Json::String(s) => s,
                other => other.to_string(),
            };
            assert_eq!(text, expected, "{cell:?}");
        }
        // What a JSON record treats as absent is the empty cell.
        for absent in [
            Cell::Null,
            Cell::Json(Json::Null),
            Cell::Json(Json::String(String::new())),
        ] {
            let mut text = String::new();
            absent.push_text(&mut text);
            assert_eq!(text, "", "{absent:?}");
        }
    }

    #[test]
    fn time_columns_read_as_their_kind() {
        let berlin: Tz = "Europe/Berlin".parse().unwrap();
        let naive = NaiveDate::from_ymd_opt(2026, 3, 29)
            .unwrap()
            .and_hms_opt(1, 30, 0)
            .unwrap();
        let instant = Utc.from_utc_datetime(&naive);
        assert_eq!(
            Cell::Text("2026-03-29 01:30:00".into()).into_time(TimeKind::Instant, berlin),
            Cell::Timestamptz(instant)
        );
        assert_eq!(
            Cell::Timestamptz(instant).into_time(TimeKind::WallClock, berlin),
            // 01:30 UTC on the day Berlin moves to summer time (at 01:00 UTC).
            Cell::Timestamp(naive + chrono::Duration::hours(2))
        );
        assert_eq!(
            Cell::Text("soon".into()).into_time(TimeKind::WallClock, berlin),
            Cell::Text("soon".into())
        );
        assert_eq!(
            Cell::Timestamptz(instant).into_json(),
            Json::String("2026-03-29T01:30:00Z".into())
        );
    }

    #[test]
    fn a_field_reads_only_the_kinds_it_can() {
        let at = Cell::Timestamp(
            NaiveDate::from_ymd_opt(2026, 1, 2)
                .unwrap()
                .and_hms_opt(3, 4, 5)
                .unwrap(),
        );
        assert!(at.fits(FieldType::Timestamptz) && at.fits(FieldType::Text));
        assert!(!at.fits(FieldType::Int) && !at.fits(FieldType::Date));
        assert!(Cell::Int(1).fits(FieldType::Decimal) && !Cell::Int(1).fits(FieldType::Date));
        assert!(
            Cell::Text("x".into()).fits(FieldType::Int),
            "text is for the field to judge"
        );
        assert!(Cell::Null.fits(FieldType::Bool));
        let json = Cell::Json(serde_json::json!({"a": 1}));
        assert!(json.fits(FieldType::Json) && !json.fits(FieldType::Text));
    }

    #[test]
    fn decimals_stay_exact_and_checkpoints_keep_types() {
        let d: Decimal = "12345678901234567890.123456".parse().unwrap();
        assert_eq!(
            Cell::Decimal(d).into_json().to_string(),
            "12345678901234567890.123456"
        );
        let key = vec![
            Cell::Timestamp(
                NaiveDate::from_ymd_opt(2026, 1, 2)
                    .unwrap()
                    .and_hms_opt(3, 4, 5)
                    .unwrap(),
            ),
            Cell::Int(7),
        ];
        let json = serde_json::to_value(&key).unwrap();
        let back: Vec<Cell> = serde_json::from_value(json).unwrap();
        assert_eq!(back, key);
    }
}
