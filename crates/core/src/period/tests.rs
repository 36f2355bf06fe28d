//! Periods: examples, then a property test and exhaustive checks against
//! an independent model of the rules in the module doc, over every zone of
//! the tz database that chrono-tz ships.

use std::collections::HashSet;

use chrono_tz::{
    America::New_York, Australia::Lord_Howe, Europe::Berlin, Pacific::Apia, TZ_VARIANTS, UTC,
};
use proptest::prelude::*;

use super::*;

fn p(text: &str, g: Granularity, tz: Tz) -> Period {
    Period::parse(text, g, tz).unwrap_or_else(|e| panic!("{text}: {e}"))
}

fn hours(period: Period) -> i64 {
    (period.end() - period.start()).num_hours()
}

fn starts(from: Period, to: Period) -> Vec<String> {
    Period::range_inclusive(from, to)
        .map(|p| p.start_rfc3339())
        .collect()
}

const ALL: [Granularity; 4] = [
    Granularity::Hour,
    Granularity::Day,
    Granularity::Week,
    Granularity::Month,
];

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
fn an_instant_with_its_offset_names_the_period_holding_it() {
    // 23:30 UTC on the 6th is 00:30 on the 7th in Berlin.
    assert_eq!(
        p("2024-03-06T23:30:00Z", Granularity::Day, Berlin).label(),
        "2024-03-07"
    );
    assert_eq!(
        p("2024-03-06 23:30+00:00", Granularity::Day, Berlin).label(),
        "2024-03-07"
    );
    // The second 01:00 of a fall-back night, named by its start as stored.
    let second = p("2024-11-03T01:00", Granularity::Hour, New_York).next();
    assert_eq!(
        p("2024-11-03T01:00:00-05:00", Granularity::Hour, New_York),
        second
    );
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
    assert_eq!(
        starts(from, to),
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
fn a_spring_forward_hour_is_no_period() {
    let from = p("2024-03-31T01:00", Granularity::Hour, Berlin);
    let to = p("2024-03-31T03:00", Granularity::Hour, Berlin);
    assert_eq!(
        starts(from, to),
        ["2024-03-31T01:00:00+01:00", "2024-03-31T03:00:00+02:00"]
    );
    let err = Period::parse("2024-03-31T02:30", Granularity::Hour, Berlin).unwrap_err();
    assert!(matches!(err, PeriodParseError::Skipped { .. }), "{err:?}");
    let message = err.to_string();
    assert!(
        message.contains("Europe/Berlin has no hour 2024-03-31T02:00")
            && message.contains("skip the local times from 2024-03-31T02:00 to 2024-03-31T03:00"),
        "{message}"
    );
    // The day of that night is there, named by any of its times.
    assert_eq!(
        p("2024-03-31T02:30", Granularity::Day, Berlin).label(),
        "2024-03-31"
    );
}

/// Lord Howe Island moves its clocks by 30 minutes: back from 02:00+11:00
/// to 01:30+10:30 on 2024-04-07, forward from 02:00+10:30 to 02:30+11:00 on
/// 2024-10-06. Backfill once stepped one absolute hour from the shift on,
/// so every later hour started at :30 while `run --period` named :00 hours.
#[test]
fn lord_howe_hours_keep_to_the_local_clock_across_half_hour_shifts() {
    let h = |text: &str| p(text, Granularity::Hour, Lord_Howe);
    assert_eq!(
        starts(h("2024-04-07T00:00"), h("2024-04-07T04:00")),
        [
            "2024-04-07T00:00:00+11:00",
            "2024-04-07T01:00:00+11:00",
            "2024-04-07T01:30:00+10:30",
            "2024-04-07T02:00:00+10:30",
            "2024-04-07T03:00:00+10:30",
            "2024-04-07T04:00:00+10:30",
        ]
    );
    // The hour `run --period 2024-04-07T03` names is one that backfill runs.
    let backfilled: Vec<Period> =
        Period::range_inclusive(h("2024-04-06T20:00"), h("2024-04-08T00:00")).collect();
    assert!(backfilled.contains(&h("2024-04-07T03")));
    assert!(backfilled
        .iter()
        .skip(8)
        .all(|p| p.label().ends_with(":00") || p.label() == "2024-04-07T01:30"));
    assert_eq!(
        (h("2024-04-07T01:00").end() - h("2024-04-07T01:00").start()).num_minutes(),
        60
    );
    assert_eq!(
        (h("2024-04-07T02:00").start() - h("2024-04-07T01:00").end()).num_minutes(),
        30
    );
    // Spring: the local hour 02 starts at 02:30 and lasts 30 minutes.
    assert_eq!(
        starts(h("2024-10-06T01:00"), h("2024-10-06T03:00")),
        [
            "2024-10-06T01:00:00+10:30",
            "2024-10-06T02:30:00+11:00",
            "2024-10-06T03:00:00+11:00",
        ]
    );
    assert_eq!(h("2024-10-06T02:00"), h("2024-10-06T02:45"));
    // Days stay whole: 24.5 and 23.5 hours.
    let d = |text: &str| p(text, Granularity::Day, Lord_Howe);
    assert_eq!(
        (d("2024-04-07").end() - d("2024-04-07").start()).num_minutes(),
        24 * 60 + 30
    );
    assert_eq!(
        (d("2024-10-06").end() - d("2024-10-06").start()).num_minutes(),
        24 * 60 - 30
    );
}

/// Samoa moved across the date line: 2011-12-29 24:00-10:00 was followed
/// by 2011-12-31 00:00+14:00. The 30th is no period (a backfill over it
/// once never ended), and the 29th is a whole day, not 14 hours.
#[test]
fn apia_skipped_2011_12_30() {
    let d = |text: &str| p(text, Granularity::Day, Apia);
    let days: Vec<String> = Period::range_inclusive(d("2011-12-28"), d("2011-12-31"))
        .map(|p| p.label())
        .collect();
    assert_eq!(days, ["2011-12-28", "2011-12-29", "2011-12-31"]);
    assert_eq!(hours(d("2011-12-29")), 24);
    assert_eq!(d("2011-12-29").end(), d("2011-12-31").start());
    let err = Period::parse("2011-12-30", Granularity::Day, Apia).unwrap_err();
    let message = err.to_string();
    assert!(
        message.contains("Pacific/Apia has no day 2011-12-30")
            && message.contains("from 2011-12-30T00:00 to 2011-12-31T00:00"),
        "{message}"
    );
    // Its week is six days long and its month thirty.
    let week = p("2011-12-28", Granularity::Week, Apia);
    assert_eq!(week.label(), "2011-W52");
    assert_eq!(hours(week), 6 * 24);
    assert_eq!(week, p("2011-12-31", Granularity::Week, Apia));
    assert_eq!(hours(p("2011-12", Granularity::Month, Apia)), 30 * 24);
    // Its hours run straight from 23:00-10:00 to 00:00+14:00.
    let hour = p("2011-12-29T23:00", Granularity::Hour, Apia);
    assert_eq!(hour.next().start_rfc3339(), "2011-12-31T00:00:00+14:00");
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

/// Africa/Monrovia kept -00:44:30 until 1972; RFC 3339 has no offset
/// seconds, so such a start is written in UTC rather than as another instant.
#[test]
fn starts_at_offsets_with_seconds_are_written_in_utc() {
    let monrovia: Tz = "Africa/Monrovia".parse().expect("zone");
    let day = p("1971-06-01", Granularity::Day, monrovia);
    assert_eq!(day.start_rfc3339(), "1971-06-01T00:44:30Z");
    assert_eq!(p(&day.start_rfc3339(), Granularity::Day, monrovia), day);
}

#[test]
fn periods_outside_years_1_to_9999_are_refused() {
    for (text, g, tz) in [
        ("0000-01", Granularity::Month, UTC),
        ("0000-12-31T23:00", Granularity::Hour, UTC),
        ("+10000-01-01", Granularity::Day, UTC),
        // Ends at 10000-01-01T00:00.
        ("9999-12", Granularity::Month, UTC),
        ("9999-12-31", Granularity::Day, UTC),
        ("9999-12-31T23", Granularity::Hour, UTC),
        ("9999-12-27", Granularity::Week, UTC),
        // Starts in 0001 locally but in the year 0 in UTC.
        ("0001-01-01", Granularity::Day, Berlin),
        // Ends in 9999 locally but in 10000 in UTC.
        ("9999-12-31", Granularity::Day, New_York),
        ("0000-12-31T23:00:00Z", Granularity::Day, UTC),
        ("-0001-06-01", Granularity::Day, UTC),
    ] {
        match Period::parse(text, g, tz) {
            Err(PeriodParseError::OutOfRange { .. }) => {}
            other => panic!("{text} {g} {tz}: {other:?}"),
        }
    }
    let err = Period::parse("9999-12", Granularity::Month, UTC).unwrap_err();
    assert!(err.to_string().contains("ends at"), "{err}");
    assert!(Period::parse("0001-01-01", Granularity::Day, UTC).is_ok());
    assert!(Period::parse("9999-12-30", Granularity::Day, UTC).is_ok());
    assert!(Period::parse("9999-12-31T22", Granularity::Hour, UTC).is_ok());
    assert!(Period::parse("9999-11", Granularity::Month, UTC).is_ok());
}

// ---------------------------------------------------------------------------
// The model: which period an instant belongs to, from the rules alone
// ---------------------------------------------------------------------------

fn at(second: i64) -> DateTime<Utc> {
    DateTime::from_timestamp(second, 0).expect("instant in range")
}

fn local(tz: Tz, t: DateTime<Utc>) -> NaiveDateTime {
    t.with_timezone(&tz).naive_local()
}

/// The instant of the one offset change in `(from, to]`, if any (changes
/// are days apart: `transitions_are_days_apart` checks it).
fn change_in(tz: Tz, from: i64, to: i64) -> Option<i64> {
    let before = offset_at(tz, at(from));
    if offset_at(tz, at(to)) == before {
        return None;
    }
    let (mut lo, mut hi) = (from, to);
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if offset_at(tz, at(mid)) == before {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    Some(hi)
}

/// The latest local time the clock has shown up to `t`: after clocks go
/// back, the time they had already reached.
fn reached(tz: Tz, t: DateTime<Utc>) -> NaiveDateTime {
    let now = local(tz, t);
    let s = t.timestamp();
    match change_in(tz, s - 26 * 3600, s) {
        Some(change) if offset_at(tz, at(change)) < offset_at(tz, at(change - 1)) => {
            now.max(local(tz, at(change - 1)))
        }
        _ => now,
    }
}

/// What the rules say an instant belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Label {
    /// A local date and hour at one offset.
    Hour(NaiveDate, u32, i32),
    /// The first local date of a day, week or month.
    Calendar(NaiveDate),
}

fn model(g: Granularity, tz: Tz, t: DateTime<Utc>) -> Label {
    if g == Granularity::Hour {
        let l = local(tz, t);
        return Label::Hour(l.date(), l.hour(), offset_at(tz, t));
    }
    let date = reached(tz, t).date();
    Label::Calendar(match g {
        Granularity::Day => date,
        Granularity::Week => {
            date - Duration::days(i64::from(date.weekday().num_days_from_monday()))
        }
        _ => NaiveDate::from_ymd_opt(date.year(), date.month(), 1).expect("first of month"),
    })
}

/// Checks the period holding `t` against the model: it holds `t`, has one
/// label throughout, begins and ends where the label changes, agrees with
/// `next()`, starts on a local boundary or an offset change, and is named
/// by its stored start and by its label.
fn check(g: Granularity, tz: Tz, t: DateTime<Utc>) -> Result<(), String> {
    let period = Period::containing_instant(g, tz, t);
    let start = period.start().with_timezone(&Utc);
    let end = period.end().with_timezone(&Utc);
    let second = Duration::seconds(1);
    let label = model(g, tz, t);
    let ensure = |ok: bool, what: &str| {
        if ok {
            Ok(())
        } else {
            Err(format!(
                "{g} in {tz} at {t}: {what}: period {} to {}, label {label:?}",
                period.start_rfc3339(),
                period.end_rfc3339()
            ))
        }
    };
    ensure(start <= t && t < end, "holds the instant")?;
    ensure(model(g, tz, start) == label, "its start has the label")?;
    ensure(
        model(g, tz, end - second) == label,
        "its last second has the label",
    )?;
    ensure(
        model(g, tz, start - second) != label,
        "it starts where the label does",
    )?;
    ensure(model(g, tz, end) != label, "it ends where the label does")?;
    if g != Granularity::Hour {
        ensure(model(g, tz, end) > label, "calendar labels only go forward")?;
    }
    ensure(period.next().start() > period.start(), "next() is later")?;
    ensure(
        Period::containing_instant(g, tz, start) == period,
        "holds its start",
    )?;
    ensure(
        Period::containing_instant(g, tz, end - second) == period,
        "holds its last second",
    )?;
    ensure(
        Period::containing_instant(g, tz, end) == period.next(),
        "next() holds its end",
    )?;
    let shown = local(tz, start);
    let on_boundary = shown.minute() == 0
        && shown.second() == 0
        && (g == Granularity::Hour || shown == boundary_of(g, shown));
    let at_change = offset_at(tz, start - second) != offset_at(tz, start);
    ensure(on_boundary || at_change, "starts on a local boundary")?;
    ensure(
        Period::parse(&period.start_rfc3339(), g, tz) == Ok(period),
        "named by its stored start",
    )?;
    let named = Period::parse(&shown.format("%Y-%m-%dT%H:%M").to_string(), g, tz);
    match g {
        Granularity::Hour => ensure(
            named.is_ok_and(|n| {
                n.start() <= period.start() && n.label()[..13] == period.label()[..13]
            }),
            "its local hour names it or the same hour shown earlier",
        ),
        _ => ensure(named == Ok(period), "its local start names it"),
    }
}

fn all_zones() -> impl Iterator<Item = Tz> {
    TZ_VARIANTS.iter().copied()
}

fn year_start(year: i32) -> i64 {
    NaiveDate::from_ymd_opt(year, 1, 1)
        .and_then(|d| d.and_hms_opt(0, 0, 0))
        .expect("date")
        .and_utc()
        .timestamp()
}

/// Every offset change of `tz` from `from` to `to`, found by sampling each
/// week and bisecting (a scan by the hour over 1900-2100 finds the same
/// 64,864 changes in all zones: no two are closer than a week apart).
fn transitions(tz: Tz, from: i64, to: i64) -> Vec<i64> {
    const WEEK: i64 = 7 * 86_400;
    let mut found = Vec::new();
    let (mut t, mut offset) = (from, offset_at(tz, at(from)));
    while t < to {
        let later = offset_at(tz, at(t + WEEK));
        if later != offset {
            found.extend(change_in(tz, t, t + WEEK));
        }
        (t, offset) = (t + WEEK, later);
    }
    found
}

/// The first offset change of `tz` after `from`, within about a year.
fn next_change(tz: Tz, from: i64) -> Option<i64> {
    const WEEK: i64 = 7 * 86_400;
    (0..60).find_map(|week| change_in(tz, from + week * WEEK, from + (week + 1) * WEEK))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(10_000))]

    /// Any zone, any granularity, any second of 1970-2040; half of the
    /// cases within two days of an offset change (where uniform sampling
    /// almost never lands).
    #[test]
    fn next_and_containing_agree_everywhere(
        zone in 0..TZ_VARIANTS.len(),
        g in 0..ALL.len(),
        second in year_start(1970)..year_start(2041),
        near_change in any::<bool>(),
        delta in -2 * 86_400_i64..2 * 86_400,
    ) {
        let tz = TZ_VARIANTS[zone];
        let second = match next_change(tz, second) {
            Some(change) if near_change => change + delta,
            _ => second,
        };
        let checked = check(ALL[g], tz, at(second));
        prop_assert!(checked.is_ok(), "{}", checked.unwrap_err());
    }
}

/// Sampling rarely lands near an offset change, where periods break: so
/// every change of every zone from 1970 to 2040 is checked, each
/// granularity, just before, at and after it, and the hours and days
/// after it. Zones that are aliases of another (same changes) are checked
/// once.
#[test]
fn every_offset_change_1970_to_2040_in_every_zone() {
    let (from, to) = (year_start(1970), year_start(2041));
    let mut seen = HashSet::new();
    let mut checked = 0;
    for tz in all_zones() {
        let changes = transitions(tz, from, to);
        let offsets: Vec<i32> = changes.iter().map(|&c| offset_at(tz, at(c))).collect();
        if !seen.insert((offset_at(tz, at(from)), changes.clone(), offsets)) {
            continue;
        }
        for &change in &changes {
            // The periods before and at the change, and (hours) the one
            // after it: each check also covers its period's neighbours.
            for (g, deltas) in [
                (Granularity::Hour, &[-1, 0, 3_600][..]),
                (Granularity::Day, &[-1, 0][..]),
                (Granularity::Week, &[-1, 0][..]),
                (Granularity::Month, &[-1, 0][..]),
            ] {
                for delta in deltas {
                    check(g, tz, at(change + delta)).unwrap_or_else(|e| panic!("{e}"));
                    checked += 1;
                }
            }
        }
    }
    eprintln!("{checked} checks, {} zones", seen.len());
    assert!(checked > 100_000, "only {checked} checks");
}

#[test]
fn transitions_are_days_apart() {
    for tz in all_zones() {
        let changes = transitions(tz, year_start(1970), year_start(2041));
        for pair in changes.windows(2) {
            assert!(
                pair[1] - pair[0] >= 2 * 86_400,
                "{tz}: offset changes at {} and {}",
                at(pair[0]),
                at(pair[1])
            );
        }
    }
}

/// Every change in the tz database (1800-2100, all zones) by which the
/// clocks skip a whole day or go back by half a day or more: Samoa and
/// Tokelau 2011, Kiribati 1994, Kwajalein 1969 and 1993, Alaska 1867,
/// the Philippines 1844 and others. A skipped day is no period, a
/// repeated stretch stays in the period already reached, weeks and
/// months around it are whole, and iteration over it always ends.
#[test]
fn every_day_skipping_or_repeating_change() {
    let mut jumps = Vec::new();
    for tz in all_zones() {
        for change in transitions(tz, year_start(1800), year_start(2100)) {
            let jump = offset_at(tz, at(change)) - offset_at(tz, at(change - 1));
            if jump.abs() >= 12 * 3600 {
                jumps.push((tz, change, jump));
            }
        }
    }
    let names: HashSet<&str> = jumps.iter().map(|(tz, ..)| tz.name()).collect();
    for zone in [
        "Pacific/Apia",
        "Pacific/Fakaofo",
        "Pacific/Kiritimati",
        "Pacific/Kwajalein",
        "America/Juneau",
        "Asia/Manila",
    ] {
        assert!(names.contains(zone), "{zone} not found among {names:?}");
    }
    for (tz, change, jump) in jumps {
        for delta in [-86_400, -3_600, -1, 0, 1, 3_600, 86_400, 2 * 86_400] {
            for g in ALL {
                check(g, tz, at(change + delta)).unwrap_or_else(|e| panic!("{e}"));
            }
        }
        let before = local(tz, at(change - 1)).date();
        let after = local(tz, at(change)).date();
        let day = |t: i64| Period::containing_instant(Granularity::Day, tz, at(t));
        if jump > 0 {
            // Every date strictly between is no period; the day before
            // ends where the day after the gap starts.
            let mut date = before + Duration::days(1);
            while date < after {
                let err = Period::parse(&date.to_string(), Granularity::Day, tz);
                assert!(
                    matches!(err, Err(PeriodParseError::Skipped { .. })),
                    "{tz} {date}: {err:?}"
                );
                date += Duration::days(1);
            }
            assert_eq!(
                day(change - 1).end(),
                day(change).start(),
                "{tz} at {}",
                at(change)
            );
        }
        let range = Period::range_inclusive(day(change - 3 * 86_400), day(change + 3 * 86_400));
        let count = range.take(100).count();
        assert!(
            (5..=8).contains(&count),
            "{tz}: {count} days around {}",
            at(change)
        );
    }
}
