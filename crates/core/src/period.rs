//! Periods: half-open windows `[start, end)` of a granularity in a timezone.
//!
//! A period is always anchored at local wall-clock boundaries (midnight,
//! Monday, the first of the month) of its timezone, so a DST day is 23 or
//! 25 hours long. Hour periods step by one absolute hour, so the repeated
//! hour of a fall-back night is two periods.

use std::fmt;

use chrono::{
    DateTime, Datelike, Duration, LocalResult, Months, NaiveDate, NaiveDateTime, NaiveTime,
    SecondsFormat, TimeZone, Timelike, Utc,
};
use chrono_tz::Tz;
use serde::{Deserialize, Serialize};

/// The length of a period.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Granularity {
    /// One hour.
    Hour,
    /// One local calendar day.
    Day,
    /// One ISO week, Monday to Monday.
    Week,
    /// One calendar month.
    Month,
}

impl fmt::Display for Granularity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Granularity::Hour => "hour",
            Granularity::Day => "day",
            Granularity::Week => "week",
            Granularity::Month => "month",
        })
    }
}

/// A period could not be parsed from text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid period {text:?}: expected a date or time such as 2024-03-07, 2024-03 or 2024-03-07T13:00")]
pub struct PeriodParseError {
    /// The text that was given.
    pub text: String,
}

/// One period: a granularity, a timezone and the start instant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Period {
    granularity: Granularity,
    start: DateTime<Tz>,
}

impl Period {
    /// The period of `granularity` in `tz` that contains the local wall-clock
    /// time `local`.
    pub fn containing(granularity: Granularity, tz: Tz, local: NaiveDateTime) -> Period {
        let date = local.date();
        let start = match granularity {
            Granularity::Hour => {
                let hour = local
                    .date()
                    .and_hms_opt(local.hour(), 0, 0)
                    .unwrap_or(local);
                resolve_local(tz, hour)
            }
            Granularity::Day => local_midnight(tz, date),
            Granularity::Week => {
                let monday =
                    date - Duration::days(i64::from(date.weekday().num_days_from_monday()));
                local_midnight(tz, monday)
            }
            Granularity::Month => local_midnight(tz, first_of_month(date)),
        };
        Period { granularity, start }
    }

    /// The period containing the instant `at`.
    pub fn containing_instant(granularity: Granularity, tz: Tz, at: DateTime<Utc>) -> Period {
        let local = at.with_timezone(&tz).naive_local();
        let period = Period::containing(granularity, tz, local);
        // An ambiguous local hour resolves to its first occurrence; an
        // instant in the second occurrence belongs to the following period.
        if period.end().with_timezone(&Utc) <= at {
            period.next()
        } else {
            period
        }
    }

    /// Parses any date or time inside a period: `2024`, `2024-03`,
    /// `2024-03-07`, `2024-03-07T13`, `2024-03-07T13:00[:00]` (also with a
    /// space instead of `T`). Times are wall-clock times in `tz`.
    pub fn parse(text: &str, granularity: Granularity, tz: Tz) -> Result<Period, PeriodParseError> {
        let local = parse_local(text.trim()).ok_or_else(|| PeriodParseError {
            text: text.to_string(),
        })?;
        Ok(Period::containing(granularity, tz, local))
    }

    /// Rebuilds a period from a stored start instant.
    pub fn from_start(granularity: Granularity, tz: Tz, start: DateTime<Utc>) -> Period {
        Period::containing_instant(granularity, tz, start)
    }

    /// The granularity.
    pub fn granularity(&self) -> Granularity {
        self.granularity
    }

    /// The timezone.
    pub fn timezone(&self) -> Tz {
        self.start.timezone()
    }

    /// The first instant of the period.
    pub fn start(&self) -> DateTime<Tz> {
        self.start
    }

    /// The first instant after the period.
    pub fn end(&self) -> DateTime<Tz> {
        self.next().start
    }

    /// The following period.
    pub fn next(&self) -> Period {
        let tz = self.start.timezone();
        let local_date = self.start.naive_local().date();
        let start = match self.granularity {
            Granularity::Hour => self.start + Duration::hours(1),
            Granularity::Day => local_midnight(tz, local_date + Duration::days(1)),
            Granularity::Week => local_midnight(tz, local_date + Duration::days(7)),
            Granularity::Month => local_midnight(tz, first_of_month(local_date) + Months::new(1)),
        };
        Period {
            granularity: self.granularity,
            start,
        }
    }

    /// Every period from `from` to `to`, both included.
    pub fn range_inclusive(from: Period, to: Period) -> impl Iterator<Item = Period> {
        let last = to.start;
        std::iter::successors(Some(from), |p| Some(p.next())).take_while(move |p| p.start <= last)
    }

    /// The start as stored in the ledger and in `_tm_period_start`:
    /// RFC 3339 with the timezone's offset at that instant.
    pub fn start_rfc3339(&self) -> String {
        self.start.to_rfc3339_opts(SecondsFormat::Secs, true)
    }

    /// The end, formatted like [`Period::start_rfc3339`].
    pub fn end_rfc3339(&self) -> String {
        self.end().to_rfc3339_opts(SecondsFormat::Secs, true)
    }

    /// A short human name: `2024-03-07`, `2024-03`, `2024-W10`, `2024-03-07T13:00`.
    pub fn label(&self) -> String {
        let local = self.start.naive_local();
        match self.granularity {
            Granularity::Hour => local.format("%Y-%m-%dT%H:%M").to_string(),
            Granularity::Day => local.format("%Y-%m-%d").to_string(),
            Granularity::Week => {
                let week = local.date().iso_week();
                format!("{}-W{:02}", week.year(), week.week())
            }
            Granularity::Month => local.format("%Y-%m").to_string(),
        }
    }
}

impl fmt::Display for Period {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.label())
    }
}

fn first_of_month(date: NaiveDate) -> NaiveDate {
    date.with_day(1).unwrap_or(date)
}

fn local_midnight(tz: Tz, date: NaiveDate) -> DateTime<Tz> {
    resolve_local(tz, date.and_time(NaiveTime::MIN))
}

/// Maps a local wall-clock time to an instant: the earlier one when the
/// time is ambiguous (fall back), the first valid time after it when it
/// falls in a gap (spring forward, e.g. a midnight that does not exist).
fn resolve_local(tz: Tz, local: NaiveDateTime) -> DateTime<Tz> {
    let mut probe = local;
    for _ in 0..48 {
        match tz.from_local_datetime(&probe) {
            LocalResult::Single(t) => return t,
            LocalResult::Ambiguous(earliest, _) => return earliest,
            LocalResult::None => probe += Duration::minutes(15),
        }
    }
    // No timezone has a gap of 12 hours; fall back to reading it as UTC.
    tz.from_utc_datetime(&local)
}

fn parse_local(text: &str) -> Option<NaiveDateTime> {
    let text = text.replace(' ', "T");
    if let Ok(d) = NaiveDate::parse_from_str(&text, "%Y-%m-%d") {
        return d.and_hms_opt(0, 0, 0);
    }
    for fmt in ["%Y-%m-%dT%H:%M:%S%.f", "%Y-%m-%dT%H:%M"] {
        if let Ok(t) = NaiveDateTime::parse_from_str(&text, fmt) {
            return Some(t);
        }
    }
    if let Some((date, hour)) = text.split_once('T') {
        let date = NaiveDate::parse_from_str(date, "%Y-%m-%d").ok()?;
        let hour: u32 = hour.parse().ok()?;
        return date.and_hms_opt(hour, 0, 0);
    }
    if let Ok(d) = NaiveDate::parse_from_str(&format!("{text}-01"), "%Y-%m-%d") {
        return d.and_hms_opt(0, 0, 0);
    }
    if text.len() == 4 {
        let year: i32 = text.parse().ok()?;
        return NaiveDate::from_ymd_opt(year, 1, 1)?.and_hms_opt(0, 0, 0);
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono_tz::{America::New_York, Europe::Berlin, UTC};

    fn p(text: &str, g: Granularity, tz: Tz) -> Period {
        Period::parse(text, g, tz).unwrap()
    }

    fn hours(period: Period) -> i64 {
        (period.end() - period.start()).num_hours()
    }

    #[test]
    fn any_time_inside_names_the_period() {
        assert_eq!(
            p("2024-03-07T13:45", Granularity::Day, UTC),
            p("2024-03-07", Granularity::Day, UTC)
        );
        assert_eq!(p("2024-03-07", Granularity::Month, UTC).label(), "2024-03");
        assert_eq!(
            p("2024-03", Granularity::Month, UTC).start_rfc3339(),
            "2024-03-01T00:00:00Z"
        );
        assert_eq!(
            p("2024-03-07T13:20", Granularity::Hour, UTC).label(),
            "2024-03-07T13:00"
        );
        assert_eq!(
            p("2024-03-07T13", Granularity::Hour, UTC).label(),
            "2024-03-07T13:00"
        );
        assert_eq!(p("2024", Granularity::Month, UTC).label(), "2024-01");
        assert!(Period::parse("yesterday", Granularity::Day, UTC).is_err());
        assert!(Period::parse("2024-13-01", Granularity::Day, UTC).is_err());
    }

    #[test]
    fn weeks_are_iso_and_start_on_monday() {
        // 2024-03-07 is a Thursday; its ISO week starts Monday 2024-03-04.
        let week = p("2024-03-07", Granularity::Week, UTC);
        assert_eq!(week.start_rfc3339(), "2024-03-04T00:00:00Z");
        assert_eq!(week.end_rfc3339(), "2024-03-11T00:00:00Z");
        assert_eq!(week.label(), "2024-W10");
        // A week spanning a year boundary.
        assert_eq!(
            p("2025-01-01", Granularity::Week, UTC).start_rfc3339(),
            "2024-12-30T00:00:00Z"
        );
    }

    #[test]
    fn dst_days_are_23_and_25_hours() {
        assert_eq!(hours(p("2024-03-31", Granularity::Day, Berlin)), 23);
        assert_eq!(hours(p("2024-10-27", Granularity::Day, Berlin)), 25);
        assert_eq!(hours(p("2024-03-30", Granularity::Day, Berlin)), 24);
        assert_eq!(
            p("2024-03-31", Granularity::Day, Berlin).start_rfc3339(),
            "2024-03-31T00:00:00+01:00"
        );
        assert_eq!(
            p("2024-03-31", Granularity::Day, Berlin).end_rfc3339(),
            "2024-04-01T00:00:00+02:00"
        );
        assert_eq!(hours(p("2024-03-10", Granularity::Day, New_York)), 23);
    }

    #[test]
    fn fall_back_night_has_two_one_oclock_hours() {
        let from = p("2024-11-03T00:00", Granularity::Hour, New_York);
        let to = p("2024-11-03T03:00", Granularity::Hour, New_York);
        let all: Vec<String> = Period::range_inclusive(from, to)
            .map(|p| p.start_rfc3339())
            .collect();
        assert_eq!(
            all,
            [
                "2024-11-03T00:00:00-04:00",
                "2024-11-03T01:00:00-04:00",
                "2024-11-03T01:00:00-05:00",
                "2024-11-03T02:00:00-05:00",
                "2024-11-03T03:00:00-05:00",
            ]
        );
    }

    #[test]
    fn month_ends_and_leap_years() {
        let feb = p("2024-02-15", Granularity::Month, UTC);
        assert_eq!(feb.end_rfc3339(), "2024-03-01T00:00:00Z");
        assert_eq!(
            p("2024-02-29", Granularity::Day, UTC).next().label(),
            "2024-03-01"
        );
        assert_eq!(
            p("2023-12-31", Granularity::Day, UTC).next().label(),
            "2024-01-01"
        );
        let jan31 = p("2024-01-31", Granularity::Month, UTC);
        assert_eq!(jan31.label(), "2024-01");
        assert_eq!(jan31.next().label(), "2024-02");
        assert_eq!(jan31.next().next().label(), "2024-03");
    }

    #[test]
    fn inclusive_ranges_cover_both_ends() {
        let days: Vec<String> = Period::range_inclusive(
            p("2024-01-30", Granularity::Day, UTC),
            p("2024-02-02", Granularity::Day, UTC),
        )
        .map(|p| p.label())
        .collect();
        assert_eq!(
            days,
            ["2024-01-30", "2024-01-31", "2024-02-01", "2024-02-02"]
        );
        let none = Period::range_inclusive(
            p("2024-02-02", Granularity::Day, UTC),
            p("2024-02-01", Granularity::Day, UTC),
        );
        assert_eq!(none.count(), 0);
    }

    #[test]
    fn stored_starts_round_trip() {
        for text in ["2024-03-31", "2024-10-27", "2024-11-03"] {
            for tz in [Berlin, New_York, UTC] {
                let period = p(text, Granularity::Day, tz);
                let again =
                    Period::from_start(Granularity::Day, tz, period.start().with_timezone(&Utc));
                assert_eq!(period, again);
            }
        }
        let second_one = p("2024-11-03T01:00", Granularity::Hour, New_York).next();
        let again = Period::from_start(
            Granularity::Hour,
            New_York,
            second_one.start().with_timezone(&Utc),
        );
        assert_eq!(second_one, again);
    }
}
