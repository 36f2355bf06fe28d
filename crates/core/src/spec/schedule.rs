//! `[schedule]`: when `serve` runs a pipeline's `sync`, as a fixed
//! interval or a cron expression, and the check that a cron can fire.
//!
//! Separate because only `serve` acts on it, and because whether a cron
//! can fire depends on the clock (a check made at every load against
//! "now"), unlike every other check of the file.

use std::time::Duration;

use schemars::JsonSchema;
use serde::Deserialize;

use super::Pipeline;
use crate::error::Error;

/// `[schedule]`: exactly one of `every` or `cron`.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(extend("oneOf" = [{ "required": ["every"] }, { "required": ["cron"] }]))]
pub struct ScheduleSpec {
    /// Interval between checks (`15m`).
    #[serde(default)]
    pub every: Option<String>,
    /// Cron expression.
    #[serde(default)]
    pub cron: Option<String>,
}

/// When `serve` runs a pipeline's `sync`.
#[derive(Debug, Clone)]
pub enum Schedule {
    /// A fixed interval.
    Every(Duration),
    /// A cron expression (5 fields as in crontab, or 6 with seconds), in UTC.
    Cron(Box<cron::Schedule>),
}

impl Schedule {
    /// The first time after `after` that the schedule fires.
    pub fn next_after(
        &self,
        after: chrono::DateTime<chrono::Utc>,
    ) -> Option<chrono::DateTime<chrono::Utc>> {
        match self {
            Schedule::Every(every) => Some(after + chrono::Duration::from_std(*every).ok()?),
            Schedule::Cron(cron) => cron.after(&after).next(),
        }
    }
}

/// How far ahead a schedule must fire at least once: a cron that does not
/// fire within it (`0 0 30 2 *`, the 31st of a 30-day month) never will,
/// and one that fires this rarely cannot be what was meant. Eight years
/// take in every 29 February, even across a century that skips one.
pub const SCHEDULE_HORIZON_YEARS: i32 = 8;

pub(super) fn parse_cron(expression: &str) -> Result<cron::Schedule, String> {
    use cron::TimeUnitSpec;
    use std::str::FromStr;
    let fields = expression.split_whitespace().count();
    let full = if fields == 5 {
        format!("0 {expression}")
    } else {
        expression.to_string()
    };
    let cron = cron::Schedule::from_str(&full)
        .map_err(|e| format!("invalid cron expression {expression:?}: {e}"))?;
    if !cron.years().is_all() {
        return Err(format!(
            "{expression:?} names years: a schedule that stops firing in some year leaves the service nothing to do after it; give five fields (or six with seconds), without a year"
        ));
    }
    Ok(cron)
}

impl Pipeline {
    /// A schedule that does not fire within [`SCHEDULE_HORIZON_YEARS`]
    /// after `now` is a configuration error naming `schedule.cron`: every
    /// command that loads the pipeline checks it against the clock that
    /// decides what is due, so `serve` never starts (or reloads) a
    /// schedule that cannot fire.
    pub fn check_schedule(&self, now: chrono::DateTime<chrono::Utc>) -> Result<(), Error> {
        let Some(Schedule::Cron(cron)) = &self.schedule else {
            return Ok(());
        };
        let horizon = now
            .checked_add_months(chrono::Months::new(
                12 * SCHEDULE_HORIZON_YEARS.unsigned_abs(),
            ))
            .unwrap_or(now);
        match cron.after(&now).next() {
            Some(at) if at <= horizon => Ok(()),
            next => Err(Error::config(
                self.file_name(),
                "schedule.cron",
                format!(
                    "{:?} does not fire in the {SCHEDULE_HORIZON_YEARS} years after {} ({}): such a schedule would never queue anything; give one that fires",
                    self.spec
                        .schedule
                        .as_ref()
                        .and_then(|s| s.cron.as_deref())
                        .unwrap_or_default(),
                    now.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
                    match next {
                        Some(at) => format!("its next fire is {}", at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)),
                        None => "it names no time after that".to_string(),
                    }
                ),
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::spec::tests::{config_err, parse, GOOD};

    #[test]
    fn schedules_every_and_cron() {
        let every = parse(&format!("{GOOD}\n[schedule]\nevery = \"15m\"\n")).unwrap();
        let at = chrono::DateTime::parse_from_rfc3339("2024-01-01T10:07:00Z")
            .unwrap()
            .with_timezone(&chrono::Utc);
        assert_eq!(
            every.schedule.unwrap().next_after(at).unwrap().to_rfc3339(),
            "2024-01-01T10:22:00+00:00"
        );
        let cron = parse(&format!("{GOOD}\n[schedule]\ncron = \"*/15 * * * *\"\n")).unwrap();
        assert_eq!(
            cron.schedule.unwrap().next_after(at).unwrap().to_rfc3339(),
            "2024-01-01T10:15:00+00:00"
        );
        let (key, _) = config_err(&format!("{GOOD}\n[schedule]\ncron = \"every tuesday\"\n"));
        assert_eq!(key, "schedule.cron");
    }

    /// Schedules that parse but cannot fire: no first period to queue
    /// from, a year field that runs out, a date that never comes.
    #[test]
    fn schedules_that_cannot_fire_are_refused() {
        let no_start = GOOD.replace("start = \"2024-01-01\"\n", "");
        let (key, message) = config_err(&format!("{no_start}\n[schedule]\nevery = \"1h\"\n"));
        assert_eq!(key, "schedule");
        assert!(message.contains("period.start"), "{message}");
        let (key, message) = config_err(&format!(
            "{GOOD}\n[schedule]\ncron = \"0 0 0 1 1 * 2030\"\n"
        ));
        assert_eq!(key, "schedule.cron");
        assert!(message.contains("year"), "{message}");
        let now = chrono::DateTime::parse_from_rfc3339("2024-03-01T00:00:00Z")
            .unwrap()
            .with_timezone(&chrono::Utc);
        for never in ["0 0 30 2 *", "0 0 31 4 *", "0 0 0 31 11 * *"] {
            let p = parse(&format!("{GOOD}\n[schedule]\ncron = \"{never}\"\n")).unwrap();
            let error = p.check_schedule(now).unwrap_err();
            assert!(
                error.to_string().contains("schedule.cron") && error.to_string().contains(never),
                "{error}"
            );
        }
        for fires in ["0 0 29 2 *", "*/15 * * * *", "0 0 31 12 *"] {
            let p = parse(&format!("{GOOD}\n[schedule]\ncron = \"{fires}\"\n")).unwrap();
            p.check_schedule(now).unwrap();
        }
    }
}
