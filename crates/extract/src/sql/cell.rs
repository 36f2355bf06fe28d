//! One database value, whatever the database: what each dialect decodes
//! its columns into, what the reader turns into a record's JSON, and what a
//! checkpoint keeps of the last resume key (so that it is bound again with
//! its own type on resume, never as text the database would have to cast).

use chrono::{
    DateTime, Datelike, NaiveDate, NaiveDateTime, NaiveTime, SecondsFormat, TimeZone, Timelike, Utc,
};
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
            Cell::Int(i) => {
                out.push_str(itoa::Buffer::new().format(*i));
                Ok(())
            }
            Cell::Float(f) => write!(out, "{f}"),
            Cell::Decimal(d) => {
                push_decimal(d, out);
                Ok(())
            }
            Cell::Text(s) => {
                out.push_str(s);
                Ok(())
            }
            Cell::Bool(b) => {
                out.push_str(if *b { "true" } else { "false" });
                Ok(())
            }
            Cell::Date(d) => {
                push_date(*d, out);
                Ok(())
            }
            Cell::Timestamp(t) => {
                push_naive(*t, out);
                Ok(())
            }
            Cell::Timestamptz(t) => {
                push_instant(t, out);
                Ok(())
            }
            Cell::Json(Json::Null) => Ok(()),
            Cell::Json(Json::String(s)) if s.is_empty() => Ok(()),
            Cell::Json(v) => write!(out, "{v}"),
        };
    }

    /// The text [`Cell::push_text`] gives for the value
    /// [`Cell::into_time`] makes of it, without consuming the cell (the
    /// reader decodes every row into the same cells).
    pub(crate) fn push_time_text(&self, kind: TimeKind, tz: Tz, out: &mut String) {
        match (self, kind) {
            (Cell::Text(text), _) => match parse_time(text) {
                Some(cell) => cell.push_time_text(kind, tz, out),
                None => out.push_str(text),
            },
            (Cell::Timestamp(t), TimeKind::Instant) => push_instant(&Utc.from_utc_datetime(t), out),
            (Cell::Timestamptz(t), TimeKind::WallClock) => {
                push_naive(t.with_timezone(&tz).naive_local(), out)
            }
            (other, _) => other.push_text(out),
        }
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

/// `Decimal`'s `Display`, digit for digit (records' text and raw hashes
/// stay what they were), by integer formatting: `Display` divides the
/// 96-bit mantissa by ten per digit and goes through `fmt`, 2.4 % of a SQL
/// re-sync's CPU. Like `Display`: a negative zero keeps its sign, and zero
/// has no digits of its own (`0`, `0.00`).
fn push_decimal(d: &Decimal, out: &mut String) {
    if d.is_sign_negative() {
        out.push('-');
    }
    let mut buffer = itoa::Buffer::new();
    let digits = match d.mantissa() {
        0 => "",
        m => buffer.format(m.unsigned_abs()),
    };
    let scale = d.scale() as usize;
    match digits.len().checked_sub(scale).filter(|whole| *whole > 0) {
        Some(whole) => {
            out.push_str(&digits[..whole]);
            if scale > 0 {
                out.push('.');
                out.push_str(&digits[whole..]);
            }
        }
        None => {
            out.push('0');
            if scale > 0 {
                out.push('.');
                out.extend(std::iter::repeat('0').take(scale - digits.len()));
                out.push_str(digits);
            }
        }
    }
}

/// The last decimal digit of `n`.
fn digit(n: u32) -> char {
    char::from_digit(n % 10, 10).unwrap_or('0')
}

/// Two decimal digits, zero-padded.
fn push_two(n: u32, out: &mut String) {
    out.push(digit(n / 10));
    out.push(digit(n));
}

/// The digits of `n`, zero-padded to `width` (at most 9).
fn push_padded(mut n: u32, width: usize, out: &mut String) {
    let mut digits = ['0'; 9];
    let width = width.min(digits.len());
    for d in digits[..width].iter_mut().rev() {
        *d = digit(n);
        n /= 10;
    }
    out.extend(&digits[..width]);
}

/// `%Y-%m-%d`, by hand: it is written for every row of a source, and
/// chrono's formatter parses its format string and goes through `fmt`
/// each time. Years chrono writes with a sign (before 0, after 9999) are
/// left to chrono.
fn push_date(d: NaiveDate, out: &mut String) {
    let Ok(year @ 0..=9999) = u32::try_from(d.year()) else {
        out.push_str(&d.format("%Y-%m-%d").to_string());
        return;
    };
    push_two(year / 100, out);
    push_two(year % 100, out);
    out.push('-');
    push_two(d.month(), out);
    out.push('-');
    push_two(d.day(), out);
}

/// `%H:%M:%S%.f`: the fraction in 0, 3, 6 or 9 digits, as few as the
/// value needs (chrono's `%.f` and `SecondsFormat::AutoSi`). A leap
/// second is left to chrono.
fn push_clock(t: NaiveTime, out: &mut String) {
    let nano = t.nanosecond();
    if nano >= 1_000_000_000 {
        out.push_str(&t.format("%H:%M:%S%.f").to_string());
        return;
    }
    push_two(t.hour(), out);
    out.push(':');
    push_two(t.minute(), out);
    out.push(':');
    push_two(t.second(), out);
    if nano == 0 {
        return;
    }
    out.push('.');
    match (nano % 1_000_000, nano % 1_000) {
        (0, _) => push_padded(nano / 1_000_000, 3, out),
        (_, 0) => push_padded(nano / 1_000, 6, out),
        _ => push_padded(nano, 9, out),
    }
}

/// `%Y-%m-%dT%H:%M:%S%.f`.
fn push_naive(t: NaiveDateTime, out: &mut String) {
    if !(0..=9999).contains(&t.year()) {
        out.push_str(&t.format("%Y-%m-%dT%H:%M:%S%.f").to_string());
        return;
    }
    push_date(t.date(), out);
    out.push('T');
    push_clock(t.time(), out);
}

/// RFC 3339 in UTC with `Z`, the fraction as [`push_clock`] writes it
/// (chrono's `to_rfc3339_opts(SecondsFormat::AutoSi, true)`).
fn push_instant(t: &DateTime<Utc>, out: &mut String) {
    let naive = t.naive_utc();
    if !(0..=9999).contains(&naive.year()) || naive.nanosecond() >= 1_000_000_000 {
        out.push_str(&t.to_rfc3339_opts(SecondsFormat::AutoSi, true));
        return;
    }
    push_naive(naive, out);
    out.push('Z');
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

    /// Decimals are written as `Display` writes them, sign, zeros and
    /// scale included (a stored raw hash must not change with the build).
    #[test]
    fn decimals_are_written_as_display_writes_them() {
        let mut values: Vec<Decimal> = [
            "0",
            "0.00",
            "-0.00",
            "1",
            "-1",
            "0.005",
            "-0.005",
            "12345.67",
            "100",
            "0.1000",
            "79228162514264337593543950335",
            "-79228162514264337593543950335",
            "0.0000000000000000000000000001",
            "7.9228162514264337593543950335",
        ]
        .iter()
        .map(|v| v.parse().unwrap())
        .collect();
        values.push(Decimal::from_parts(0, 0, 0, true, 0));
        values.push(Decimal::from_parts(0, 0, 0, true, 3));
        values.push(Decimal::from_parts(5, 0, 0, true, 28));
        for mantissa in [1i64, 9, 10, 99, 101, 123_456, -42, 1_000_000_007] {
            for scale in 0..=12 {
                values.push(Decimal::new(mantissa, scale));
            }
        }
        for value in values {
            let mut ours = String::new();
            push_decimal(&value, &mut ours);
            assert_eq!(ours, value.to_string(), "{value:?}");
        }
    }

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

    /// The hand-written date and time text is chrono's, to the byte: a
    /// sweep over leap years, month ends, every fraction width and the
    /// years chrono writes with a sign.
    #[test]
    fn hand_written_times_are_chronos() {
        let dates = [
            (0, 1, 1),
            (1, 12, 31),
            (999, 3, 4),
            (1900, 2, 28),
            (1970, 1, 1),
            (2000, 2, 29),
            (2024, 2, 29),
            (2026, 3, 29),
            (2026, 10, 25),
            (2100, 3, 1),
            (9999, 12, 31),
            (-1, 6, 15),
            (10000, 1, 1),
            (-44, 3, 15),
        ];
        let nanos = [
            0,
            1,
            999,
            1_000,
            120_000,
            123_456,
            1_000_000,
            5_000_000,
            100_000_000,
            123_456_789,
            999_999_999,
            // A leap second.
            1_500_000_000,
        ];
        let clocks = [(0, 0, 0), (1, 30, 5), (9, 5, 9), (12, 0, 59), (23, 59, 59)];
        let mut text = String::new();
        let mut checked = 0;
        for (y, m, d) in dates {
            let date = NaiveDate::from_ymd_opt(y, m, d).unwrap();
            text.clear();
            Cell::Date(date).push_text(&mut text);
            assert_eq!(text, date.format("%Y-%m-%d").to_string());
            for (h, mi, s) in clocks {
                for nano in nanos {
                    let Some(t) = date.and_hms_nano_opt(h, mi, s, nano) else {
                        continue;
                    };
                    text.clear();
                    Cell::Timestamp(t).push_text(&mut text);
                    assert_eq!(text, t.format("%Y-%m-%dT%H:%M:%S%.f").to_string());
                    let instant = Utc.from_utc_datetime(&t);
                    text.clear();
                    Cell::Timestamptz(instant).push_text(&mut text);
                    assert_eq!(
                        text,
                        instant.to_rfc3339_opts(SecondsFormat::AutoSi, true),
                        "{t:?}"
                    );
                    checked += 1;
                }
            }
        }
        assert!(checked > 700, "{checked}");
        // Every microsecond width of a day's first second, and a walk over
        // four years of days (leap days included) at odd times.
        let start = NaiveDate::from_ymd_opt(2023, 1, 1).unwrap();
        for step in 0..1_500u32 {
            let t = start.and_hms_micro_opt(0, 0, 0, 0).unwrap()
                + chrono::Duration::seconds(i64::from(step) * 86_400 + i64::from(step) * 37)
                + chrono::Duration::microseconds(i64::from(step) * 7_919 % 1_000_000);
            text.clear();
            Cell::Timestamp(t).push_text(&mut text);
            assert_eq!(text, t.format("%Y-%m-%dT%H:%M:%S%.f").to_string());
        }
    }

    /// The borrowed time text is what the cell's own conversion says,
    /// in zones east and west of UTC (negative offsets) and across DST.
    #[test]
    fn time_text_is_into_time_then_text() {
        let zones: [Tz; 4] = [
            "UTC".parse().unwrap(),
            "Europe/Berlin".parse().unwrap(),
            "America/New_York".parse().unwrap(),
            "America/St_Johns".parse().unwrap(),
        ];
        let base = NaiveDate::from_ymd_opt(2026, 3, 8)
            .unwrap()
            .and_hms_micro_opt(0, 15, 0, 250)
            .unwrap();
        let mut cells = Vec::new();
        for hour in 0..60 {
            let t = base + chrono::Duration::minutes(hour * 47);
            cells.push(Cell::Timestamp(t));
            cells.push(Cell::Timestamptz(Utc.from_utc_datetime(&t)));
            cells.push(Cell::Text(t.format("%Y-%m-%d %H:%M:%S%.f").to_string()));
            cells.push(Cell::Text(format!(
                "{}-03:30",
                t.format("%Y-%m-%dT%H:%M:%S")
            )));
        }
        cells.extend([Cell::Text("soon".into()), Cell::Null, Cell::Int(3)]);
        let mut text = String::new();
        for tz in zones {
            for kind in [TimeKind::Instant, TimeKind::WallClock] {
                for cell in &cells {
                    let mut expected = String::new();
                    cell.clone().into_time(kind, tz).push_text(&mut expected);
                    text.clear();
                    cell.push_time_text(kind, tz, &mut text);
                    assert_eq!(text, expected, "{cell:?} {kind:?} {tz}");
                }
            }
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
