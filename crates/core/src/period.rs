//! Periods: half-open windows `[start, end)` of a granularity in a timezone.
//!
//! Every instant lies in exactly one period of each granularity, and a
//! period is identified by its first instant. Two rules cut the time line,
//! one for hours and one for the calendar granularities (ADR 0005):
//!
//! - **Days, weeks and months** run from the first instant at which the
//!   local clock reads their first midnight (or later) to the same instant
//!   of the next one. A DST day is 23 or 25 hours; a midnight that does not
//!   exist starts the day at the first instant after the gap; a day the
//!   clocks skip altogether (Pacific/Apia, 2011-12-30) is no period at all:
//!   the day before it ends where the day after it starts. A stretch the
//!   clocks repeat belongs to the period that was already reached, so a
//!   repeated day is one period of up to 48 hours.
//! - **Hours** are the instants during which the local clock shows one hour
//!   at one UTC offset. Every change of offset starts a new hour: the
//!   repeated hour of a fall-back night is two periods, and on a night with
//!   a 30-minute shift the part of the hour before the shift and the part
//!   after it are two periods (Australia/Lord_Howe, 2024-04-07: 01:00+11:00
//!   for 60 minutes, 01:30+10:30 for 30, then 02:00+10:30). Every other hour
//!   starts at :00 local time.
//!
//! So [`Period::next`] is always strictly later than the period's start and
//! [`Period::containing_instant`] agrees with it on every instant; both are
//! property-tested against an independent model over every IANA zone.
//! Periods exist within the years 0001–9999, local and UTC; [`Period::parse`]
//! refuses a period reaching outside them.

use std::fmt;

use chrono::{
    DateTime, Datelike, Days, Duration, LocalResult, Months, NaiveDate, NaiveDateTime, NaiveTime,
    Offset, SecondsFormat, TimeZone, Timelike, Utc,
};
use chrono_tz::{GapInfo, Tz};
use serde::{Deserialize, Serialize};

/// The length of a period.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
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

/// The first and last years a period may touch, local and UTC: what both
/// databases store alike (PostgreSQL has no year 0; RFC 3339 has four
/// digits).
pub const YEARS: std::ops::RangeInclusive<i32> = 1..=9999;

/// A period could not be named from text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PeriodParseError {
    /// Not a date or time at all.
    #[error("invalid period {text:?}: expected a date or time such as 2024-03-07, 2024-03, 2024-03-07T13:00 or 2024-03-07T13:00:00+01:00")]
    Syntax {
        /// The text that was given.
        text: String,
    },
    /// The timezone's clocks skip the whole period (a spring-forward hour,
    /// or a day skipped by a jump across the date line).
    #[error("{timezone} has no {granularity} {name} (named by {text:?}): its clocks skip the local times from {gap_from} to {gap_to}, so that {granularity} holds no instant; name the {granularity} before or after it")]
    Skipped {
        /// The text that was given.
        text: String,
        /// The granularity.
        granularity: Granularity,
        /// The timezone's IANA name.
        timezone: String,
        /// The skipped period, as its label would read.
        name: String,
        /// The first local time the clocks skip.
        gap_from: String,
        /// The first local time after the gap.
        gap_to: String,
    },
    /// The period reaches outside the years 0001–9999.
    #[error("period {text:?} is outside the years 0001-9999 that tidemark stores: {reason}")]
    OutOfRange {
        /// The text that was given.
        text: String,
        /// Which end lies outside, and where.
        reason: String,
    },
}

/// One period: a granularity, a timezone and the start instant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Period {
    granularity: Granularity,
    start: DateTime<Tz>,
}

impl Period {
    /// The period of `granularity` in `tz` named by the local wall-clock
    /// time `local`: the one whose local date (day, week, month) or local
    /// hour holds it; for an hour shown twice, its first occurrence. `None`
    /// when the clocks skip that whole period.
    pub fn containing(granularity: Granularity, tz: Tz, local: NaiveDateTime) -> Option<Period> {
        let boundary = boundary_of(granularity, local);
        let start = first_instant_from(tz, boundary)?;
        let reached = start.naive_local();
        match granularity {
            Granularity::Hour => (reached < boundary.checked_add_signed(Duration::hours(1))?)
                .then(|| Period::containing_instant(granularity, tz, start.with_timezone(&Utc))),
            _ => (boundary_of(granularity, reached) == boundary)
                .then_some(Period { granularity, start }),
        }
    }

    /// The period containing the instant `at`.
    pub fn containing_instant(granularity: Granularity, tz: Tz, at: DateTime<Utc>) -> Period {
        if granularity == Granularity::Hour {
            return Period {
                granularity,
                start: hour_start(tz, at).with_timezone(&tz),
            };
        }
        let local = at.with_timezone(&tz).naive_local();
        let start = first_instant_from(tz, boundary_of(granularity, local))
            .unwrap_or_else(|| at.with_timezone(&tz));
        let mut period = Period { granularity, start };
        // After clocks went back across a boundary, `at`'s local date is
        // still the earlier one but the later period has begun.
        while period.end().with_timezone(&Utc) <= at {
            period = period.next();
        }
        period
    }

    /// Parses any date or time inside a period: `2024`, `2024-03`,
    /// `2024-03-07`, `2024-03-07T13`, `2024-03-07T13:00[:00]` (also with a
    /// space instead of `T`) as wall-clock time in `tz`, or an instant with
    /// its offset (`2024-11-03T01:30:00-05:00`, as `status` prints period
    /// starts), which names even the second of two hours the clock shows
    /// twice.
    pub fn parse(text: &str, granularity: Granularity, tz: Tz) -> Result<Period, PeriodParseError> {
        let trimmed = text.trim();
        let out_of_range = |reason: String| PeriodParseError::OutOfRange {
            text: text.to_string(),
            reason,
        };
        let period = if let Some(at) = parse_instant(trimmed) {
            if !YEARS.contains(&at.year()) {
                return Err(out_of_range(format!(
                    "{} is in the year {}",
                    rfc3339(&at),
                    at.year()
                )));
            }
            Period::containing_instant(granularity, tz, at)
        } else {
            let local = parse_local(trimmed).ok_or_else(|| PeriodParseError::Syntax {
                text: text.to_string(),
            })?;
            if !YEARS.contains(&local.year()) {
                return Err(out_of_range(format!("the year {} is named", local.year())));
            }
            Period::containing(granularity, tz, local)
                .ok_or_else(|| skipped(text, granularity, tz, local))?
        };
        period.within_years().map_err(out_of_range)?;
        Ok(period)
    }

    /// Checks that the period starts and ends within the years 0001–9999,
    /// in its timezone and in UTC; the error says which end does not.
    fn within_years(&self) -> Result<(), String> {
        // The end is exclusive, but it is stored too: a period ending at
        // 10000-01-01T00:00 ends outside.
        for (which, at) in [("starts", self.start), ("ends", self.end())] {
            if !YEARS.contains(&at.year()) || !YEARS.contains(&at.naive_utc().year()) {
                return Err(format!(
                    "it {which} at {} ({})",
                    exact_rfc3339(at),
                    rfc3339(&at.with_timezone(&Utc))
                ));
            }
        }
        Ok(())
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

    /// The following period; its start is always strictly later than this
    /// one's (asserted: a period that did not advance would make every
    /// range over it endless).
    pub fn next(&self) -> Period {
        let tz = self.start.timezone();
        let next = match self.granularity {
            Granularity::Hour => {
                hour_end(tz, self.start.with_timezone(&Utc)).map(|t| t.with_timezone(&tz))
            }
            g => next_boundary(g, boundary_of(g, self.start.naive_local()))
                .and_then(|b| first_instant_from(tz, b)),
        };
        // Only past chrono's own limits (year 262143), far outside what
        // `parse` accepts, is there no next boundary.
        let start = next.unwrap_or_else(|| DateTime::<Utc>::MAX_UTC.with_timezone(&tz));
        assert!(
            start > self.start,
            "the {} after {} does not start later ({})",
            self.granularity,
            self.start_rfc3339(),
            start.to_rfc3339()
        );
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
    /// RFC 3339 with the timezone's offset at that instant (in UTC when
    /// that offset has seconds, such as Africa/Monrovia's -00:44:30 until
    /// 1972, which RFC 3339 cannot write: chrono would drop them and name
    /// another instant).
    pub fn start_rfc3339(&self) -> String {
        exact_rfc3339(self.start)
    }

    /// The end, formatted like [`Period::start_rfc3339`].
    pub fn end_rfc3339(&self) -> String {
        exact_rfc3339(self.end())
    }

    /// A short human name: `2024-03-07`, `2024-03`, `2024-W10`,
    /// `2024-03-07T13:00` (an hour that starts at an offset change that is
    /// not a whole hour reads `2024-04-07T01:30`).
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

fn exact_rfc3339(at: DateTime<Tz>) -> String {
    if at.offset().fix().local_minus_utc() % 60 == 0 {
        at.to_rfc3339_opts(SecondsFormat::Secs, true)
    } else {
        rfc3339(&at.with_timezone(&Utc))
    }
}

fn rfc3339(at: &DateTime<Utc>) -> String {
    at.to_rfc3339_opts(SecondsFormat::Secs, true)
}

/// The error for a period the clocks skip, naming the gap.
fn skipped(text: &str, granularity: Granularity, tz: Tz, local: NaiveDateTime) -> PeriodParseError {
    let boundary = boundary_of(granularity, local);
    let gap = GapInfo::new(&boundary, &tz);
    let minute = |t: NaiveDateTime| t.format("%Y-%m-%dT%H:%M").to_string();
    let gap_from = gap
        .as_ref()
        .and_then(|g| g.begin.map(|(t, _)| minute(t)))
        .unwrap_or_else(|| minute(boundary));
    let gap_to = gap
        .and_then(|g| g.end)
        .map(|t| minute(t.naive_local()))
        .unwrap_or_else(|| "the next valid time".to_string());
    let name = match granularity {
        Granularity::Hour => boundary.format("%Y-%m-%dT%H:00").to_string(),
        _ => boundary.format("%Y-%m-%d").to_string(),
    };
    PeriodParseError::Skipped {
        text: text.to_string(),
        granularity,
        timezone: tz.name().to_string(),
        name,
        gap_from,
        gap_to,
    }
}

/// The local wall-clock time at which the period of `granularity` holding
/// `local` begins on the calendar: the top of its hour, its midnight, its
/// Monday's or its first day's midnight.
fn boundary_of(granularity: Granularity, local: NaiveDateTime) -> NaiveDateTime {
    let date = local.date();
    let day = match granularity {
        Granularity::Hour => return date.and_hms_opt(local.hour(), 0, 0).unwrap_or(local),
        Granularity::Day => date,
        Granularity::Week => date
            .checked_sub_days(Days::new(u64::from(date.weekday().num_days_from_monday())))
            .unwrap_or(date),
        Granularity::Month => date.with_day(1).unwrap_or(date),
    };
    day.and_time(NaiveTime::MIN)
}

/// The calendar boundary after `boundary` (days, weeks and months only).
fn next_boundary(granularity: Granularity, boundary: NaiveDateTime) -> Option<NaiveDateTime> {
    let date: NaiveDate = boundary.date();
    let next = match granularity {
        Granularity::Hour | Granularity::Day => date.checked_add_days(Days::new(1)),
        Granularity::Week => date.checked_add_days(Days::new(7)),
        Granularity::Month => date.checked_add_months(Months::new(1)),
    }?;
    Some(next.and_time(NaiveTime::MIN))
}

/// The earliest instant at which the local clock of `tz` reads `local` or
/// later: `local` itself (its first occurrence when the clocks show it
/// twice), or, when the clocks skip it, the first instant after the gap,
/// however long the gap (a whole day in Pacific/Apia).
fn first_instant_from(tz: Tz, local: NaiveDateTime) -> Option<DateTime<Tz>> {
    match tz.from_local_datetime(&local) {
        LocalResult::Single(t) | LocalResult::Ambiguous(t, _) => Some(t),
        LocalResult::None => GapInfo::new(&local, &tz)?.end,
    }
}

/// The UTC offset of `tz` at `at`, in seconds.
fn offset_at(tz: Tz, at: DateTime<Utc>) -> i32 {
    tz.offset_from_utc_datetime(&at.naive_utc())
        .fix()
        .local_minus_utc()
}

fn offset_at_second(tz: Tz, second: i64) -> Option<i32> {
    DateTime::from_timestamp(second, 0).map(|t| offset_at(tz, t))
}

/// How far the local clock is past the top of its hour.
fn into_hour(local: NaiveDateTime) -> Duration {
    Duration::seconds(i64::from(local.minute() * 60 + local.second()))
        + Duration::nanoseconds(i64::from(local.nanosecond()))
}

/// The first instant of the hour period holding `at`: the top of `at`'s
/// local hour at `at`'s offset, or the offset change after it, if any.
fn hour_start(tz: Tz, at: DateTime<Utc>) -> DateTime<Utc> {
    let local = at.with_timezone(&tz).naive_local();
    let Some(top) = at.checked_sub_signed(into_hour(local)) else {
        return at;
    };
    last_offset_change(tz, top, at).unwrap_or(top)
}

/// The first instant after the hour period starting at `start`: the next
/// top of the hour at `start`'s offset, or an offset change before it.
fn hour_end(tz: Tz, start: DateTime<Utc>) -> Option<DateTime<Utc>> {
    let local = start.with_timezone(&tz).naive_local();
    let top = start
        .checked_sub_signed(into_hour(local))?
        .checked_add_signed(Duration::hours(1))?;
    Some(first_offset_change(tz, start, top).unwrap_or(top))
}

// The two searches below bisect whole seconds (the tz database changes
// offsets on whole seconds) and rely on an offset changing at most once
// within an hour: changes are at least two days apart in every zone
// (checked by the transition tests over all zones).

/// The first whole second in `(from, to)` whose offset differs from the
/// offset at `from`.
fn first_offset_change(tz: Tz, from: DateTime<Utc>, to: DateTime<Utc>) -> Option<DateTime<Utc>> {
    let before = offset_at(tz, from);
    let (mut lo, mut hi) = (from.timestamp(), to.timestamp() - 1);
    if hi <= lo || offset_at_second(tz, hi)? == before {
        return None;
    }
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if offset_at_second(tz, mid)? == before {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    DateTime::from_timestamp(hi, 0)
}

/// The last whole second in `(from, to]` at which the offset of `to`
/// began, if the offset at `from` differs.
fn last_offset_change(tz: Tz, from: DateTime<Utc>, to: DateTime<Utc>) -> Option<DateTime<Utc>> {
    let after = offset_at(tz, to);
    if offset_at(tz, from) == after {
        return None;
    }
    let (mut lo, mut hi) = (from.timestamp(), to.timestamp());
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if offset_at_second(tz, mid)? == after {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    DateTime::from_timestamp(hi, 0)
}

/// An instant written with its offset (RFC 3339, also without seconds or
/// with a space instead of `T`).
fn parse_instant(text: &str) -> Option<DateTime<Utc>> {
    let text = text.replacen(' ', "T", 1);
    DateTime::parse_from_rfc3339(&text)
        .or_else(|_| DateTime::parse_from_str(&text, "%Y-%m-%dT%H:%M%:z"))
        .ok()
        .map(|t| t.with_timezone(&Utc))
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
mod tests;
