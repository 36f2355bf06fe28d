//! Reading one raw value as one column type.
//!
//! Every function here returns `Err(message)` with a short, operator-facing
//! explanation; the caller adds the location, field and value. Nothing here
//! panics on any input: the data is untrusted.

use chrono::format::{Item, Parsed, StrftimeItems};
use chrono::offset::LocalResult;
use chrono::{DateTime, NaiveDate, NaiveDateTime, TimeZone, Utc};
use chrono_tz::Tz;
use rust_decimal::prelude::ToPrimitive;
use rust_decimal::Decimal;
use tidemark_core::{FieldType, Value};

use crate::decimal;

/// A present (non-absent) raw value, as the parser sees it.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Raw<'a> {
    /// Text to be read: a CSV cell, a rendered `value` template, a TOML
    /// string default. For `json` columns it is parsed as JSON.
    Text(&'a str),
    /// A JSON string from a JSON record. Same as `Text`, except that a
    /// `json` column keeps it as a JSON string instead of parsing it.
    JsonString(&'a str),
    /// Any other JSON value from a JSON record (or a non-string default).
    Json(&'a serde_json::Value),
}

/// Naive forms accepted for `timestamp` (and local `timestamptz`) without a `format`.
const NAIVE_FORMS: [&str; 4] = [
    "%Y-%m-%dT%H:%M:%S%.f",
    "%Y-%m-%d %H:%M:%S%.f",
    "%Y-%m-%dT%H:%M",
    "%Y-%m-%d %H:%M",
];

/// A compiled `format = "..."` for a date or time column.
#[derive(Debug, Clone)]
pub(crate) struct TimeFormat {
    text: String,
    items: Vec<Item<'static>>,
}

/// What a format read from one input.
enum Reading {
    /// The input pinned an instant by itself (a UTC offset or `%s` epoch
    /// seconds), so the pipeline's timezone must not be applied on top.
    Instant(DateTime<Utc>),
    /// A wall-clock reading, still to be placed in a timezone.
    Local(Parsed),
}

impl TimeFormat {
    /// Compiles once per run so a million rows do not re-parse the format.
    pub(crate) fn new(text: &str) -> Result<TimeFormat, String> {
        let items = StrftimeItems::new(text)
            .parse_to_owned()
            .map_err(|_| format!("invalid time format {text:?}"))?;
        Ok(TimeFormat {
            text: text.to_string(),
            items,
        })
    }

    fn mismatch(&self) -> String {
        format!("does not match format {:?}", self.text)
    }

    /// Parses `s`. Whether it names an instant is decided by what was read
    /// (an offset or epoch seconds), which covers every offset spelling
    /// chrono knows (`%z`, `%:z`, `%#z`, `%::z`, `%+`, ...).
    fn read(&self, s: &str) -> Result<Reading, String> {
        let mut parsed = Parsed::new();
        chrono::format::parse(&mut parsed, s, self.items.iter()).map_err(|_| self.mismatch())?;
        if parsed.offset().is_some() || parsed.timestamp().is_some() {
            let instant = parsed.to_datetime().map_err(|_| self.mismatch())?;
            return Ok(Reading::Instant(instant.with_timezone(&Utc)));
        }
        Ok(Reading::Local(parsed))
    }

    /// A wall-clock time, or an instant's wall clock in `tz`.
    fn naive(&self, s: &str, tz: Tz) -> Result<NaiveDateTime, String> {
        match self.read(s)? {
            Reading::Instant(t) => Ok(t.with_timezone(&tz).naive_local()),
            Reading::Local(p) => p
                .to_naive_datetime_with_offset(0)
                .map_err(|_| self.mismatch()),
        }
    }

    /// A date, or an instant's date in `tz`.
    fn date(&self, s: &str, tz: Tz) -> Result<NaiveDate, String> {
        match self.read(s)? {
            Reading::Instant(t) => Ok(t.with_timezone(&tz).date_naive()),
            Reading::Local(p) => p.to_naive_date().map_err(|_| self.mismatch()),
        }
    }

    /// An instant; a wall-clock reading is placed in `tz`.
    fn instant(&self, s: &str, tz: Tz) -> Result<DateTime<Utc>, String> {
        match self.read(s)? {
            Reading::Instant(t) => Ok(t),
            Reading::Local(p) => localise(
                p.to_naive_datetime_with_offset(0)
                    .map_err(|_| self.mismatch())?,
                tz,
            ),
        }
    }
}

/// How one column reads its values.
#[derive(Debug, Clone)]
pub(crate) struct Parser {
    pub(crate) ty: FieldType,
    pub(crate) format: Option<TimeFormat>,
    pub(crate) tz: Tz,
}

impl Parser {
    /// Types a present raw value. JSON numbers and booleans are read as
    /// their JSON text, so `5`, `"5"` and a CSV `5` all follow one rule.
    ///
    /// Values no database could store alike are refused on every backend,
    /// so a pipeline does not start failing when it moves from SQLite to
    /// PostgreSQL: text and JSON holding a NUL character (U+0000), which
    /// PostgreSQL cannot store in `text` or `jsonb`, and dates and times
    /// outside the years 0001–9999 (beyond PostgreSQL's range at one end,
    /// and out of order as SQLite text at both).
    ///
    /// Times keep microseconds, PostgreSQL's precision: finer digits are
    /// dropped here, so the value hashed is the value every database
    /// stores. (A nanosecond key stored by PostgreSQL as microseconds no
    /// longer matched its source key on the next run, and the row was
    /// reconciled away as vanished.)
    ///
    /// A leap second (`23:59:60`, which chrono reads and SQLite would keep
    /// as that text) is the first instant of the next minute, as PostgreSQL
    /// stores it: one value on both databases, hashed as stored.
    pub(crate) fn parse(&self, raw: Raw<'_>) -> Result<Value, String> {
        let value = as_stored(self.read(raw)?);
        storable(&value)?;
        Ok(value)
    }

    fn read(&self, raw: Raw<'_>) -> Result<Value, String> {
        use serde_json::Value as J;
        match raw {
            Raw::Json(v) if self.ty == FieldType::Json => Ok(Value::Json(v.clone())),
            Raw::JsonString(s) if self.ty == FieldType::Json => {
                Ok(Value::Json(J::String(s.to_string())))
            }
            Raw::Json(J::Null) => Ok(Value::Null),
            Raw::Json(J::Number(n)) => self.text(n.as_str()),
            Raw::Json(J::Bool(b)) => self.text(if *b { "true" } else { "false" }),
            Raw::Json(J::String(s)) => self.text(s),
            Raw::Text(s) | Raw::JsonString(s) => self.text(s),
            Raw::Json(J::Array(_)) => Err(format!(
                "expected a single {} value, got a JSON array",
                self.ty
            )),
            Raw::Json(J::Object(_)) => Err(format!(
                "expected a single {} value, got a JSON object",
                self.ty
            )),
        }
    }

    /// Types a text value.
    fn text(&self, s: &str) -> Result<Value, String> {
        match self.ty {
            FieldType::Text => Ok(Value::Text(s.to_string())),
            FieldType::Int => parse_int(s.trim()).map(Value::Int),
            FieldType::Float => parse_float(s.trim()).map(Value::Float),
            FieldType::Decimal => parse_decimal(s.trim()).map(Value::Decimal),
            FieldType::Bool => parse_bool(s.trim()).map(Value::Bool),
            FieldType::Date => self.date(s.trim()).map(Value::Date),
            FieldType::Timestamp => self.timestamp(s.trim()).map(Value::Timestamp),
            FieldType::Timestamptz => self.timestamptz(s.trim()).map(Value::Timestamptz),
            FieldType::Json => serde_json::from_str(s)
                .map(Value::Json)
                .map_err(|e| format!("not valid JSON: {e}")),
        }
    }

    fn date(&self, s: &str) -> Result<NaiveDate, String> {
        match &self.format {
            Some(f) => f.date(s, self.tz),
            None => NaiveDate::parse_from_str(s, "%Y-%m-%d")
                .map_err(|_| "not a date (expected YYYY-MM-DD)".to_string()),
        }
    }

    /// A naive timestamp is a wall-clock time in the pipeline's timezone, so
    /// an absolute input (offset or `%s`) is converted to that wall clock.
    fn timestamp(&self, s: &str) -> Result<NaiveDateTime, String> {
        match &self.format {
            Some(f) => f.naive(s, self.tz),
            None => naive_default(s).ok_or_else(|| {
                "not a timestamp (expected YYYY-MM-DDTHH:MM[:SS[.fff]])".to_string()
            }),
        }
    }

    fn timestamptz(&self, s: &str) -> Result<DateTime<Utc>, String> {
        match &self.format {
            Some(f) => f.instant(s, self.tz),
            None => {
                if let Some(t) = rfc3339(s) {
                    return Ok(t);
                }
                let naive = naive_default(s).ok_or_else(|| {
                    "not a timestamp (expected RFC 3339 such as 2024-03-07T13:45:00+01:00, or a local YYYY-MM-DDTHH:MM[:SS])"
                        .to_string()
                })?;
                localise(naive, self.tz)
            }
        }
    }
}

/// A time as every database stores it: a leap second moved to the next
/// minute, digits below the microsecond dropped.
fn as_stored(value: Value) -> Value {
    use chrono::SubsecRound;
    match value {
        Value::Timestamp(t) => Value::Timestamp(without_leap_second(t).trunc_subsecs(6)),
        Value::Timestamptz(t) => Value::Timestamptz(
            without_leap_second(t.naive_utc())
                .and_utc()
                .trunc_subsecs(6),
        ),
        other => other,
    }
}

/// chrono keeps a leap second as second 59 with a nanosecond count of one
/// second or more; this turns `23:59:60.5` into `00:00:00.5` of the next
/// minute.
fn without_leap_second(t: NaiveDateTime) -> NaiveDateTime {
    use chrono::Timelike;
    const SECOND: u32 = 1_000_000_000;
    match t.nanosecond().checked_sub(SECOND) {
        Some(within) => t
            .with_nanosecond(within)
            .and_then(|t| t.checked_add_signed(chrono::Duration::seconds(1)))
            .unwrap_or(t),
        None => t,
    }
}

/// Refuses what [`Parser::parse`] says no database stores alike.
fn storable(value: &Value) -> Result<(), String> {
    use chrono::Datelike;
    if holds_nul(value) {
        return Err("contains a NUL character (U+0000), which PostgreSQL cannot store".into());
    }
    let year = match value {
        Value::Date(d) => d.year(),
        Value::Timestamp(t) => t.year(),
        Value::Timestamptz(t) => t.year(),
        _ => return Ok(()),
    };
    if (1..=9999).contains(&year) {
        Ok(())
    } else {
        Err(format!(
            "year {year} is outside 0001–9999, the years tidemark stores"
        ))
    }
}

/// Whether a text or JSON value contains U+0000 anywhere (JSON: in any
/// string or object key).
fn holds_nul(value: &Value) -> bool {
    fn json(v: &serde_json::Value) -> bool {
        match v {
            serde_json::Value::String(s) => s.contains('\0'),
            serde_json::Value::Array(items) => items.iter().any(json),
            serde_json::Value::Object(map) => map.iter().any(|(k, v)| k.contains('\0') || json(v)),
            _ => false,
        }
    }
    match value {
        Value::Text(s) => s.contains('\0'),
        Value::Json(v) => json(v),
        _ => false,
    }
}

fn naive_default(s: &str) -> Option<NaiveDateTime> {
    NAIVE_FORMS
        .iter()
        .find_map(|f| NaiveDateTime::parse_from_str(s, f).ok())
}

/// RFC 3339, also with a space instead of the `T`.
fn rfc3339(s: &str) -> Option<DateTime<Utc>> {
    let parsed = match s.as_bytes().get(10) {
        Some(b' ') => {
            let mut fixed = s.to_string();
            fixed.replace_range(10..11, "T");
            DateTime::parse_from_rfc3339(&fixed)
        }
        _ => DateTime::parse_from_rfc3339(s),
    };
    parsed.ok().map(|t| t.with_timezone(&Utc))
}

/// Reads a wall-clock time in `tz`. A time repeated by a fall-back change is
/// taken at its first (earlier) occurrence; a time skipped by a
/// spring-forward change names no instant and is an error, not a guess.
pub(crate) fn localise(naive: NaiveDateTime, tz: Tz) -> Result<DateTime<Utc>, String> {
    match tz.from_local_datetime(&naive) {
        LocalResult::Single(t) | LocalResult::Ambiguous(t, _) => Ok(t.with_timezone(&Utc)),
        LocalResult::None => Err(format!(
            "local time {} does not exist in timezone {} (skipped by a daylight-saving change)",
            naive.format("%Y-%m-%d %H:%M:%S"),
            tz.name()
        )),
    }
}

/// Whether `s` is a plain decimal number: optional sign, digits with at most
/// one point, optional exponent. Stricter than the std and rust_decimal
/// parsers, which accept `_` separators, `inf` and the like.
fn is_plain_number(s: &str) -> bool {
    let b = s.as_bytes();
    let mut i = usize::from(matches!(b.first(), Some(b'+' | b'-')));
    let digits = |i: &mut usize| {
        let start = *i;
        while b.get(*i).is_some_and(u8::is_ascii_digit) {
            *i += 1;
        }
        *i - start
    };
    let mut mantissa = digits(&mut i);
    if b.get(i) == Some(&b'.') {
        i += 1;
        mantissa += digits(&mut i);
    }
    if mantissa == 0 {
        return false;
    }
    if matches!(b.get(i), Some(b'e' | b'E')) {
        i += 1;
        if matches!(b.get(i), Some(b'+' | b'-')) {
            i += 1;
        }
        if digits(&mut i) == 0 {
            return false;
        }
    }
    i == b.len()
}

/// An integer; a number with a zero fraction (`5.0`, `1e3`) is accepted
/// because JSON producers often write integers that way.
pub(crate) fn parse_int(s: &str) -> Result<i64, String> {
    if let Ok(i) = s.parse::<i64>() {
        return Ok(i);
    }
    if !is_plain_number(s) {
        return Err("not an integer".to_string());
    }
    let out_of_range = || "not an integer (out of the 64-bit range)".to_string();
    let decimal = match decimal::exact(s) {
        Ok(decimal) => decimal,
        Err(decimal::Unfit::Magnitude) => return Err(out_of_range()),
        // More digits or places than a decimal holds: some are fraction digits.
        Err(_) => return Err("not an integer (has a fraction)".to_string()),
    };
    if !decimal.fract().is_zero() {
        return Err("not an integer (has a fraction)".to_string());
    }
    decimal.to_i64().ok_or_else(out_of_range)
}

/// A finite binary float.
pub(crate) fn parse_float(s: &str) -> Result<f64, String> {
    if !is_plain_number(s) {
        return Err("not a float".to_string());
    }
    match s.parse::<f64>() {
        Ok(f) if f.is_finite() => Ok(f),
        Ok(_) => Err("not a finite float (out of range)".to_string()),
        Err(_) => Err("not a float".to_string()),
    }
}

/// An exact decimal, normalised. Never goes through `f64` and never
/// rounds: a value that does not fit is refused, naming the limit it passes
/// (magnitude, significant digits or places after the point).
pub(crate) fn parse_decimal(s: &str) -> Result<Decimal, String> {
    if !is_plain_number(s) {
        return Err("not a decimal".to_string());
    }
    decimal::exact(s).map_err(|unfit| unfit.to_string())
}

/// true/false, t/f, yes/no, y/n, 1/0, in any case.
pub(crate) fn parse_bool(s: &str) -> Result<bool, String> {
    const TRUE: [&str; 4] = ["true", "t", "yes", "y"];
    const FALSE: [&str; 4] = ["false", "f", "no", "n"];
    if s == "1" || TRUE.iter().any(|t| s.eq_ignore_ascii_case(t)) {
        Ok(true)
    } else if s == "0" || FALSE.iter().any(|f| s.eq_ignore_ascii_case(f)) {
        Ok(false)
    } else {
        Err("not a boolean (expected true/false, yes/no, y/n, t/f or 1/0)".to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono_tz::Europe::Berlin;
    use serde_json::json;
    use std::str::FromStr;

    fn parser(ty: FieldType, format: Option<&str>) -> Parser {
        Parser {
            ty,
            format: format.map(|f| TimeFormat::new(f).expect("format")),
            tz: Berlin,
        }
    }

    fn text(ty: FieldType, s: &str) -> Result<Value, String> {
        parser(ty, None).parse(Raw::Text(s))
    }

    fn json(ty: FieldType, v: serde_json::Value) -> Result<Value, String> {
        parser(ty, None).parse(Raw::Json(&v))
    }

    fn dec(s: &str) -> Decimal {
        Decimal::from_str(s).expect("test decimal")
    }

    fn utc(s: &str) -> Value {
        Value::Timestamptz(
            DateTime::parse_from_rfc3339(s)
                .expect("rfc3339")
                .with_timezone(&Utc),
        )
    }

    #[test]
    fn plain_number_syntax() {
        for good in ["0", "-5", "+5", "5.", ".5", "1e3", "1.5E-3", "1e+3", "007"] {
            assert!(is_plain_number(good), "{good}");
        }
        for bad in [
            "", "-", ".", "1_000", "1,5", "1e", "1e+", "inf", "NaN", "0x10", "1.2.3", " 1", "1 ",
        ] {
            assert!(!is_plain_number(bad), "{bad}");
        }
    }

    #[test]
    fn nul_characters_are_refused_in_text_and_json() {
        for refused in [
            text(FieldType::Text, "a\0b"),
            text(FieldType::Json, r#"{"k": "a\u0000b"}"#),
            json(FieldType::Json, json!({"k": ["x", "a\u{0}b"]})),
            json(FieldType::Json, json!({"a\u{0}": 1})),
            json(FieldType::Text, json!("a\u{0}b")),
        ] {
            assert!(refused.unwrap_err().contains("NUL character"));
        }
        assert!(text(FieldType::Json, r#"{"k": "a\\u0000b"}"#).is_ok());
    }

    #[test]
    fn dates_and_times_outside_years_1_to_9999_are_refused() {
        for ty in [
            FieldType::Date,
            FieldType::Timestamp,
            FieldType::Timestamptz,
        ] {
            for day in ["-5000-01-01", "+99999-01-01", "0000-12-31"] {
                let input = if ty == FieldType::Date {
                    day.to_string()
                } else {
                    format!("{day}T00:00:00")
                };
                let refused = text(ty, &input).unwrap_err();
                assert!(
                    refused.contains("outside 0001–9999"),
                    "{ty} {input}: {refused}"
                );
            }
            let edge = if ty == FieldType::Date {
                "9999-12-31"
            } else {
                "9999-12-31T22:00:00"
            };
            assert!(text(ty, edge).is_ok(), "{ty} {edge}");
        }
    }

    #[test]
    fn a_leap_second_is_the_next_minute_as_postgresql_stores_it() {
        for (input, stored) in [
            ("2016-12-31T23:59:60Z", "2017-01-01T00:00:00Z"),
            ("2016-12-31T23:59:60.5Z", "2017-01-01T00:00:00.5Z"),
            (
                "2016-12-31T23:59:60.123456789Z",
                "2017-01-01T00:00:00.123456Z",
            ),
            ("2017-01-01T00:59:60+01:00", "2017-01-01T00:00:00Z"),
        ] {
            assert_eq!(
                text(FieldType::Timestamptz, input),
                Ok(utc(stored)),
                "{input}"
            );
        }
        let naive = text(FieldType::Timestamp, "2016-12-31T23:59:60").unwrap();
        assert_eq!(
            naive.canonical_text().as_deref(),
            Some("2017-01-01T00:00:00")
        );
        let german = parser(FieldType::Timestamptz, Some("%d.%m.%Y %H:%M:%S"));
        assert_eq!(
            german.parse(Raw::Text("31.12.2016 23:59:60")),
            Ok(utc("2016-12-31T23:00:00Z"))
        );
    }

    #[test]
    fn times_keep_microseconds_and_drop_finer_digits() {
        assert_eq!(
            text(FieldType::Timestamptz, "2024-01-01T00:00:00.123456789Z"),
            Ok(utc("2024-01-01T00:00:00.123456Z"))
        );
        let naive = text(FieldType::Timestamp, "2024-01-01T00:00:00.999999999").unwrap();
        assert_eq!(
            naive.canonical_text().as_deref(),
            Some("2024-01-01T00:00:00.999999")
        );
    }

    #[test]
    fn text_keeps_strings_and_reads_json_scalars_as_their_text() {
        assert_eq!(
            text(FieldType::Text, " a b "),
            Ok(Value::Text(" a b ".into()))
        );
        let big: serde_json::Value = serde_json::from_str("12345678901234567890.10").expect("json");
        assert_eq!(
            json(FieldType::Text, big),
            Ok(Value::Text("12345678901234567890.10".into()))
        );
        assert_eq!(
            json(FieldType::Text, json!(true)),
            Ok(Value::Text("true".into()))
        );
        assert!(json(FieldType::Text, json!([1]))
            .unwrap_err()
            .contains("JSON array"));
        assert!(json(FieldType::Text, json!({"a": 1}))
            .unwrap_err()
            .contains("JSON object"));
    }

    #[test]
    fn ints() {
        assert_eq!(text(FieldType::Int, " -42 "), Ok(Value::Int(-42)));
        assert_eq!(text(FieldType::Int, "+7"), Ok(Value::Int(7)));
        assert_eq!(text(FieldType::Int, "5.0"), Ok(Value::Int(5)));
        assert_eq!(text(FieldType::Int, "1e3"), Ok(Value::Int(1000)));
        assert_eq!(
            json(FieldType::Int, json!(9_223_372_036_854_775_807_i64)),
            Ok(Value::Int(i64::MAX))
        );
        let five: serde_json::Value = serde_json::from_str("5.0").expect("json");
        assert_eq!(json(FieldType::Int, five), Ok(Value::Int(5)));
        assert!(text(FieldType::Int, "5.5")
            .unwrap_err()
            .contains("fraction"));
        assert!(text(FieldType::Int, "9223372036854775808")
            .unwrap_err()
            .contains("range"));
        assert!(text(FieldType::Int, "-99999999999999999999999999999999999").is_err());
        assert_eq!(text(FieldType::Int, "abc"), Err("not an integer".into()));
        assert_eq!(text(FieldType::Int, "1_000"), Err("not an integer".into()));
        assert_eq!(text(FieldType::Int, "1,000"), Err("not an integer".into()));
        assert_eq!(
            json(FieldType::Int, json!(true)),
            Err("not an integer".into())
        );
        assert_eq!(
            json(FieldType::Int, json!(5.5)),
            Err("not an integer (has a fraction)".into())
        );
    }

    #[test]
    fn floats() {
        assert_eq!(text(FieldType::Float, " 1.5 "), Ok(Value::Float(1.5)));
        assert_eq!(text(FieldType::Float, "-2e3"), Ok(Value::Float(-2000.0)));
        assert_eq!(json(FieldType::Float, json!(3)), Ok(Value::Float(3.0)));
        assert_eq!(json(FieldType::Float, json!(0.1)), Ok(Value::Float(0.1)));
        for bad in ["NaN", "inf", "-infinity", "1_0", "abc", "1.5x"] {
            assert_eq!(
                text(FieldType::Float, bad),
                Err("not a float".into()),
                "{bad}"
            );
        }
        assert!(text(FieldType::Float, "1e400")
            .unwrap_err()
            .contains("finite"));
        let huge: serde_json::Value = serde_json::from_str("1e400").expect("json");
        assert!(json(FieldType::Float, huge).is_err());
        assert!(json(FieldType::Float, json!(false)).is_err());
    }

    #[test]
    fn decimals_are_exact_and_normalised() {
        assert_eq!(
            text(FieldType::Decimal, "10.50"),
            Ok(Value::Decimal(dec("10.5")))
        );
        // Stored normalised: the canonical text has no trailing zeros and no negative zero.
        for (input, stored) in [
            ("10.50", "10.5"),
            ("150e-2", "1.5"),
            ("-0", "0"),
            ("1200", "1200"),
            ("1.2e3", "1200"),
        ] {
            let Ok(Value::Decimal(d)) = text(FieldType::Decimal, input) else {
                panic!("{input}")
            };
            assert_eq!(d.to_string(), stored, "{input}");
        }
        assert_eq!(
            text(FieldType::Decimal, "1e3"),
            Ok(Value::Decimal(dec("1000")))
        );
        assert_eq!(
            text(FieldType::Decimal, "-1.25E-2"),
            Ok(Value::Decimal(dec("-0.0125")))
        );
        assert_eq!(
            text(FieldType::Decimal, "-0.0"),
            Ok(Value::Decimal(dec("0")))
        );
        assert_eq!(
            text(FieldType::Decimal, "000000000000000000000000000000012.50"),
            Ok(Value::Decimal(dec("12.5")))
        );
        assert_eq!(
            text(FieldType::Decimal, "1.00000000000000000000000000000000000"),
            Ok(Value::Decimal(dec("1")))
        );
        // JSON numbers are read from their original text, never through f64.
        let precise: serde_json::Value =
            serde_json::from_str("0.1000000000000000055511151231257827").expect("json");
        assert!(json(FieldType::Decimal, precise)
            .unwrap_err()
            .contains("out of range"));
        let money: serde_json::Value = serde_json::from_str("1234567890123456.78").expect("json");
        assert_eq!(
            json(FieldType::Decimal, money),
            Ok(Value::Decimal(dec("1234567890123456.78")))
        );
        assert!(text(FieldType::Decimal, "99999999999999999999999999999")
            .unwrap_err()
            .contains("out of range"));
        assert!(text(FieldType::Decimal, "1e40")
            .unwrap_err()
            .contains("out of range"));
        // Two significant digits: the limit passed is the magnitude.
        let magnitude = text(FieldType::Decimal, "1.5E+30").unwrap_err();
        assert!(
            magnitude.contains("magnitude exceeds 79228162514264337593543950335")
                && !magnitude.contains("significant"),
            "{magnitude}"
        );
        assert!(text(FieldType::Decimal, "1e-29")
            .unwrap_err()
            .contains("29 places after the point"));
        assert!(text(FieldType::Int, "1e30")
            .unwrap_err()
            .contains("64-bit range"));
        assert!(
            text(FieldType::Decimal, "1.0000000000000000000000000000001")
                .unwrap_err()
                .contains("out of range")
        );
        for bad in ["1_000", "abc", "1,5", "NaN", "", "1e"] {
            assert_eq!(
                text(FieldType::Decimal, bad),
                Err("not a decimal".into()),
                "{bad}"
            );
        }
        assert_eq!(
            json(FieldType::Decimal, json!(true)),
            Err("not a decimal".into())
        );
    }

    #[test]
    fn bools() {
        for t in ["true", "TRUE", " t ", "Yes", "y", "1"] {
            assert_eq!(text(FieldType::Bool, t), Ok(Value::Bool(true)), "{t}");
        }
        for f in ["false", "F", "no", "N", "0"] {
            assert_eq!(text(FieldType::Bool, f), Ok(Value::Bool(false)), "{f}");
        }
        assert_eq!(json(FieldType::Bool, json!(true)), Ok(Value::Bool(true)));
        assert_eq!(json(FieldType::Bool, json!(0)), Ok(Value::Bool(false)));
        assert_eq!(json(FieldType::Bool, json!(1)), Ok(Value::Bool(true)));
        for bad in [json!(2), json!(1.0), json!("maybe"), json!([true])] {
            assert!(json(FieldType::Bool, bad.clone()).is_err(), "{bad}");
        }
    }

    #[test]
    fn dates() {
        let d = |s: &str| Value::Date(NaiveDate::parse_from_str(s, "%Y-%m-%d").expect("date"));
        assert_eq!(text(FieldType::Date, "2024-03-07"), Ok(d("2024-03-07")));
        assert!(text(FieldType::Date, "07.03.2024")
            .unwrap_err()
            .contains("not a date"));
        assert!(text(FieldType::Date, "2024-02-30").is_err());
        let german = parser(FieldType::Date, Some("%d.%m.%Y"));
        assert_eq!(german.parse(Raw::Text("07.03.2024")), Ok(d("2024-03-07")));
        assert_eq!(
            german.parse(Raw::Text("2024-03-07")),
            Err("does not match format \"%d.%m.%Y\"".into())
        );
        // Epoch seconds name an instant: its date in the pipeline's timezone.
        let epoch = parser(FieldType::Date, Some("%s"));
        assert_eq!(
            epoch.parse(Raw::Json(&json!(1_709_852_400))),
            Ok(d("2024-03-08"))
        );
    }

    #[test]
    fn naive_timestamps() {
        let t = |s: &str| {
            Value::Timestamp(NaiveDateTime::parse_from_str(s, "%Y-%m-%dT%H:%M:%S%.f").expect("ts"))
        };
        assert_eq!(
            text(FieldType::Timestamp, "2024-03-07T13:45:10.25"),
            Ok(t("2024-03-07T13:45:10.25"))
        );
        assert_eq!(
            text(FieldType::Timestamp, "2024-03-07 13:45:10"),
            Ok(t("2024-03-07T13:45:10"))
        );
        assert_eq!(
            text(FieldType::Timestamp, "2024-03-07T13:45"),
            Ok(t("2024-03-07T13:45:00"))
        );
        assert_eq!(
            text(FieldType::Timestamp, "2024-03-07 13:45"),
            Ok(t("2024-03-07T13:45:00"))
        );
        assert!(text(FieldType::Timestamp, "2024-03-07")
            .unwrap_err()
            .contains("not a timestamp"));
        assert!(text(FieldType::Timestamp, "2024-03-07T25:00").is_err());
        let german = parser(FieldType::Timestamp, Some("%d.%m.%Y %H:%M"));
        assert_eq!(
            german.parse(Raw::Text("07.03.2024 13:45")),
            Ok(t("2024-03-07T13:45:00"))
        );
        assert_eq!(
            german.parse(Raw::Text("07.03.2024")),
            Err("does not match format \"%d.%m.%Y %H:%M\"".into())
        );
        // An instant with an offset becomes Berlin wall-clock time (+01:00 in March).
        let offset = parser(FieldType::Timestamp, Some("%Y-%m-%d %H:%M%z"));
        assert_eq!(
            offset.parse(Raw::Text("2024-03-07 12:45+0000")),
            Ok(t("2024-03-07T13:45:00"))
        );
    }

    #[test]
    fn timestamptz_without_format() {
        assert_eq!(
            text(FieldType::Timestamptz, "2024-03-07T13:45:00+01:00"),
            Ok(utc("2024-03-07T12:45:00Z"))
        );
        assert_eq!(
            text(FieldType::Timestamptz, "2024-03-07 13:45:00Z"),
            Ok(utc("2024-03-07T13:45:00Z"))
        );
        assert_eq!(
            text(FieldType::Timestamptz, "2024-03-07T13:45:00.5-05:00"),
            Ok(utc("2024-03-07T18:45:00.5Z"))
        );
        // Naive forms are Berlin wall-clock times: +01:00 in winter, +02:00 in summer.
        assert_eq!(
            text(FieldType::Timestamptz, "2024-03-07T13:45"),
            Ok(utc("2024-03-07T12:45:00Z"))
        );
        assert_eq!(
            text(FieldType::Timestamptz, "2024-07-07 13:45:00"),
            Ok(utc("2024-07-07T11:45:00Z"))
        );
        assert!(text(FieldType::Timestamptz, "yesterday")
            .unwrap_err()
            .contains("RFC 3339"));
        assert!(text(FieldType::Timestamptz, "2024-03-07T13:45:00+25:00").is_err());
    }

    #[test]
    fn timestamptz_across_berlin_dst_changes() {
        // 2024-03-31 02:00-03:00 does not exist in Berlin.
        let gap = text(FieldType::Timestamptz, "2024-03-31T02:30").unwrap_err();
        assert!(
            gap.contains("does not exist in timezone Europe/Berlin"),
            "{gap}"
        );
        let german = parser(FieldType::Timestamptz, Some("%d.%m.%Y %H:%M"));
        assert!(german
            .parse(Raw::Text("31.03.2024 02:30"))
            .unwrap_err()
            .contains("does not exist"));
        assert_eq!(
            german.parse(Raw::Text("31.03.2024 03:30")),
            Ok(utc("2024-03-31T01:30:00Z"))
        );
        // 2024-10-27 02:00-03:00 happens twice; the earlier (+02:00) one is taken.
        assert_eq!(
            german.parse(Raw::Text("27.10.2024 02:30")),
            Ok(utc("2024-10-27T00:30:00Z"))
        );
        assert_eq!(
            text(FieldType::Timestamptz, "2024-10-27 02:30"),
            Ok(utc("2024-10-27T00:30:00Z"))
        );
        // An explicit offset picks the later one.
        assert_eq!(
            text(FieldType::Timestamptz, "2024-10-27T02:30:00+01:00"),
            Ok(utc("2024-10-27T01:30:00Z"))
        );
    }

    #[test]
    fn timestamptz_with_offset_and_epoch_formats() {
        for (format, input) in [
            ("%d.%m.%Y %H:%M %z", "07.03.2024 13:45 +0200"),
            ("%d.%m.%Y %H:%M %:z", "07.03.2024 13:45 +02:00"),
            ("%d.%m.%Y %H:%M %#z", "07.03.2024 13:45 +02"),
            // chrono reads `%::z` like `%:z` (no offset seconds).
            ("%d.%m.%Y %H:%M %::z", "07.03.2024 13:45 +02:00"),
            ("%+", "2024-03-07T13:45:00+02:00"),
        ] {
            assert_eq!(
                parser(FieldType::Timestamptz, Some(format)).parse(Raw::Text(input)),
                Ok(utc("2024-03-07T11:45:00Z")),
                "{format}"
            );
        }
        // Epoch seconds are UTC by definition; the pipeline's timezone must not shift them.
        let epoch = parser(FieldType::Timestamptz, Some("%s"));
        assert_eq!(
            epoch.parse(Raw::Text("1709766000")),
            Ok(utc("2024-03-06T23:00:00Z"))
        );
        assert_eq!(
            epoch.parse(Raw::Json(&json!(1_709_766_000))),
            Ok(utc("2024-03-06T23:00:00Z"))
        );
        assert!(epoch
            .parse(Raw::Text("soon"))
            .unwrap_err()
            .contains("does not match format \"%s\""));
        assert!(epoch.parse(Raw::Json(&json!(1.5))).is_err());
    }

    #[test]
    fn json_values() {
        let csv = parser(FieldType::Json, None);
        assert_eq!(
            csv.parse(Raw::Text(r#"{"b":1,"a":[true]}"#)),
            Ok(Value::Json(json!({"a": [true], "b": 1})))
        );
        assert!(csv
            .parse(Raw::Text("{oops"))
            .unwrap_err()
            .contains("not valid JSON"));
        assert_eq!(
            csv.parse(Raw::JsonString("{oops")),
            Ok(Value::Json(json!("{oops")))
        );
        assert_eq!(
            csv.parse(Raw::Json(&json!([1, {"x": null}]))),
            Ok(Value::Json(json!([1, {"x": null}])))
        );
    }

    #[test]
    fn invalid_formats_are_refused() {
        assert!(TimeFormat::new("%Q").is_err());
        assert!(TimeFormat::new("%d.%m.%Y %H:%M").is_ok());
    }
}
