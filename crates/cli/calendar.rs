//! `status`'s calendar on a terminal: the engine's calendars
//! ([`tidemark_engine::status::Calendar`]) printed one cell per period, a
//! coloured chip with the state's letter, or the letter alone when colours
//! are off (not a terminal, `NO_COLOR`, `--color never`), so the picture
//! reads the same in a log or a screen reader.

use tidemark_engine::status::{Calendar, LineState};

/// The letter or symbol of a state; the legend names each.
pub fn glyph(state: LineState) -> char {
    match state {
        LineState::Done => '#',
        LineState::Marked => 'M',
        LineState::Provisional => '~',
        LineState::Stale => 'S',
        LineState::Failed => 'F',
        LineState::Retrying => 'f',
        LineState::Running => 'R',
        LineState::Pending => 'P',
        LineState::Cancelled => 'C',
        LineState::Missing => '?',
        LineState::NotDue => '.',
    }
}

/// The ANSI SGR parameters of a state's chip: a background and a
/// foreground that reads on it.
fn colour(state: LineState) -> &'static str {
    match state {
        LineState::Done => "30;42",
        LineState::Marked => "30;46",
        LineState::Provisional => "30;102",
        LineState::Stale => "30;43",
        LineState::Failed => "97;41",
        LineState::Retrying => "30;101",
        LineState::Running => "97;44",
        LineState::Pending => "30;104",
        LineState::Cancelled => "97;100",
        LineState::Missing => "31;107",
        LineState::NotDue => "90",
    }
}

/// What a legend says of a state.
fn meaning(state: LineState) -> &'static str {
    match state {
        LineState::Done => "done",
        LineState::Marked => "marked",
        LineState::Provisional => "provisional",
        LineState::Stale => "stale",
        LineState::Failed => "failed",
        LineState::Retrying => "failed, backing off",
        LineState::Running => "running",
        LineState::Pending => "pending",
        LineState::Cancelled => "cancelled",
        LineState::Missing => "missing",
        LineState::NotDue => "not due",
    }
}

/// One cell, two columns wide: the glyph right-aligned, in its chip when
/// `colour`; two blanks for a column with no period.
fn cell(state: Option<LineState>, colour_on: bool) -> String {
    match (state, colour_on) {
        (None, _) => "  ".to_string(),
        (Some(state), false) => format!(" {}", glyph(state)),
        (Some(state), true) => format!("\x1b[{}m {}\x1b[0m", colour(state), glyph(state)),
    }
}

/// Prints each source's calendar (its name, the columns, a row per line),
/// then one legend.
pub fn print(pipeline: &str, calendars: &[Calendar], colour_on: bool) {
    let width = calendars
        .iter()
        .flat_map(|c| c.rows.iter().map(|r| r.label.len()))
        .max()
        .unwrap_or(0);
    for calendar in calendars {
        say!("calendar of {pipeline}, source {}:", calendar.source);
        let columns: Vec<String> = calendar.columns.iter().map(|c| format!("{c:>2}")).collect();
        say!("  {:width$}  {}", "", columns.join(" "));
        for row in &calendar.rows {
            let cells: Vec<String> = row.cells.iter().map(|s| cell(*s, colour_on)).collect();
            say!("  {:width$}  {}", row.label, cells.join(" "));
        }
    }
    let legend: Vec<String> = LineState::ALL
        .iter()
        .map(|s| format!("{} {}", cell(Some(*s), colour_on).trim_start(), meaning(*s)))
        .collect();
    // Two lines, each within 80 columns.
    let (first, rest) = legend.split_at(LineState::ALL.len() / 2);
    say!("  legend: {}", first.join("  "));
    say!("          {}", rest.join("  "));
    say!("");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_state_has_its_own_glyph() {
        let mut glyphs: Vec<char> = LineState::ALL.iter().map(|s| glyph(*s)).collect();
        glyphs.sort_unstable();
        glyphs.dedup();
        assert_eq!(glyphs.len(), LineState::ALL.len());
    }
}
