//! The calendar of a status over a range: one cell per period and source,
//! laid out in rows a person reads at a glance: a row per week (Monday to
//! Sunday) for daily periods, a row per day for hourly ones, a row per
//! month for weekly ones and a row per year for monthly ones. The cells
//! carry states; colours and glyphs are the printer's.

use std::collections::BTreeMap;

use chrono::{Datelike, Timelike};
use tidemark_core::period::Granularity;
use tidemark_core::{Period, Pipeline};

use super::{LineState, StatusItem};

/// The most periods a calendar shows per source: past it the range is
/// left to the table (a calendar of 100,000 hours reads no better than
/// the table, and would be held whole).
pub const CALENDAR_MAX_PERIODS: usize = 1_500;

/// One row of a calendar: its label (the week's Monday, the day, the
/// month or the year) and its cells from the row's first column; `None`
/// is a column with no period of the range (before its first period, or
/// an hour a clock change skipped).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CalendarRow {
    /// What the row spans.
    pub label: String,
    /// The cells, column by column.
    pub cells: Vec<Option<LineState>>,
}

/// One source's calendar.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Calendar {
    /// The source.
    pub source: String,
    /// What a column is: `Mon..Sun`, `hour 0..23`, `week of the month`,
    /// `Jan..Dec`.
    pub columns: Vec<String>,
    /// Its rows, in time order.
    pub rows: Vec<CalendarRow>,
}

/// Collects the lines of a status (every line read, whatever `--only`
/// gives) into calendars, one per source.
#[derive(Debug, Clone)]
pub struct CalendarBuilder {
    granularity: Granularity,
    tz: chrono_tz::Tz,
    cells: BTreeMap<String, Vec<(Period, LineState)>>,
    /// More than [`CALENDAR_MAX_PERIODS`] periods of one source were read.
    too_long: bool,
}

impl CalendarBuilder {
    /// A calendar of `pipeline`'s periods.
    pub fn new(pipeline: &Pipeline) -> CalendarBuilder {
        CalendarBuilder {
            granularity: pipeline.spec.period.granularity,
            tz: pipeline.spec.period.timezone,
            cells: BTreeMap::new(),
            too_long: false,
        }
    }

    /// Adds a line read.
    pub(super) fn read(&mut self, item: &StatusItem) {
        let period = match item {
            StatusItem::Missing { period, .. } => *period,
            StatusItem::Recorded { .. } => match item.instants() {
                Some((start, _)) => Period::from_start(self.granularity, self.tz, start),
                None => return,
            },
        };
        let cells = self.cells.entry(item.source().to_string()).or_default();
        if cells.len() >= CALENDAR_MAX_PERIODS {
            self.too_long = true;
            return;
        }
        cells.push((period, item.state()));
    }

    /// The calendars, one per source; none when a source had more than
    /// [`CALENDAR_MAX_PERIODS`] periods.
    pub fn finish(self) -> Option<Vec<Calendar>> {
        if self.too_long {
            return None;
        }
        let columns = columns(self.granularity);
        Some(
            self.cells
                .into_iter()
                .map(|(source, cells)| Calendar {
                    source,
                    columns: columns.clone(),
                    rows: rows(&cells),
                })
                .collect(),
        )
    }
}

/// The columns' names of a granularity's rows.
fn columns(granularity: Granularity) -> Vec<String> {
    let names: Vec<String> = match granularity {
        Granularity::Hour => (0..24).map(|h| format!("{h:02}")).collect(),
        Granularity::Day => ["Mo", "Tu", "We", "Th", "Fr", "Sa", "Su"]
            .map(String::from)
            .to_vec(),
        Granularity::Week => (1..=5).map(|w| format!("W{w}")).collect(),
        Granularity::Month => (1..=12).map(|m| format!("{m:02}")).collect(),
    };
    names
}

/// A period's row label and its natural column.
fn place(period: &Period) -> (String, usize) {
    let local = period.start().naive_local();
    let date = local.date();
    match period.granularity() {
        Granularity::Hour => (date.format("%Y-%m-%d").to_string(), local.hour() as usize),
        Granularity::Day => {
            let weekday = date.weekday().num_days_from_monday();
            let monday = date - chrono::Duration::days(i64::from(weekday));
            (monday.format("%Y-%m-%d").to_string(), weekday as usize)
        }
        Granularity::Week => (
            date.format("%Y-%m").to_string(),
            ((date.day() - 1) / 7) as usize,
        ),
        Granularity::Month => (date.format("%Y").to_string(), date.month0() as usize),
    }
}

/// The rows of one source's cells, in period order. A cell goes to its
/// natural column, or right after the previous cell when that is taken
/// (the second 02:00 of a day the clocks go back).
fn rows(cells: &[(Period, LineState)]) -> Vec<CalendarRow> {
    let mut rows: Vec<CalendarRow> = Vec::new();
    for (period, state) in cells {
        let (label, natural) = place(period);
        let row = match rows.last_mut() {
            Some(row) if row.label == label => row,
            _ => {
                rows.push(CalendarRow {
                    label,
                    cells: Vec::new(),
                });
                let Some(row) = rows.last_mut() else {
                    continue;
                };
                row
            }
        };
        let column = natural.max(row.cells.len());
        row.cells.resize(column, None);
        row.cells.push(Some(*state));
    }
    rows
}

#[cfg(test)]
mod tests {
    use super::*;

    fn days(from: &str, to: &str) -> Vec<(Period, LineState)> {
        let tz = chrono_tz::UTC;
        let from = Period::parse(from, Granularity::Day, tz).unwrap();
        let to = Period::parse(to, Granularity::Day, tz).unwrap();
        Period::range_inclusive(from, to)
            .map(|p| (p, LineState::Done))
            .collect()
    }

    #[test]
    fn daily_periods_go_a_week_to_a_row_from_monday() {
        // 2024-01-03 is a Wednesday.
        let rows = rows(&days("2024-01-03", "2024-01-09"));
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0].label, "2024-01-01");
        assert_eq!(rows[0].cells[..2], [None, None]);
        assert_eq!(rows[0].cells.len(), 7);
        assert_eq!(rows[1].label, "2024-01-08");
        assert_eq!(rows[1].cells, [Some(LineState::Done); 2]);
    }

    #[test]
    fn the_hour_a_clock_repeats_takes_the_next_column() {
        let tz: chrono_tz::Tz = "Europe/Berlin".parse().unwrap();
        let from = Period::parse("2024-10-27T00", Granularity::Hour, tz).unwrap();
        let to = Period::parse("2024-10-27T23", Granularity::Hour, tz).unwrap();
        let cells: Vec<_> = Period::range_inclusive(from, to)
            .map(|p| (p, LineState::Done))
            .collect();
        assert_eq!(cells.len(), 25);
        let rows = rows(&cells);
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0].cells.len(), 25);
        assert!(rows[0].cells.iter().all(Option::is_some));
    }
}
