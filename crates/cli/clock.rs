//! `TIDEMARK_NOW`: the binary's way to set the engine's clock (an RFC 3339
//! time the process starts at; the clock then runs on from it in real
//! time, so a `serve` started with it still sees its schedules fire).
//! Tests and dry runs use it to ask what tidemark would do at another
//! moment. The engine itself never reads the environment: it is given a
//! [`Clock`].

use std::sync::Arc;

use chrono::{DateTime, Utc};
use tidemark_core::Error;
use tidemark_engine::{Clock, ShiftedClock, SystemClock};

/// The environment variable that sets the clock.
pub const NOW_VARIABLE: &str = "TIDEMARK_NOW";

/// The system clock, or the one `TIDEMARK_NOW` sets. A value that is not
/// an RFC 3339 time is a configuration error naming the variable, never a
/// silent fallback to the real clock.
pub fn from_env() -> Result<Arc<dyn Clock>, Error> {
    match std::env::var(NOW_VARIABLE) {
        Err(std::env::VarError::NotPresent) => Ok(Arc::new(SystemClock)),
        Err(std::env::VarError::NotUnicode(_)) => Err(bad_value("a value that is not UTF-8")),
        Ok(text) => Ok(Arc::new(ShiftedClock::starting_at(parse(&text)?))),
    }
}

fn parse(text: &str) -> Result<DateTime<Utc>, Error> {
    DateTime::parse_from_rfc3339(text.trim())
        .map(|at| at.with_timezone(&Utc))
        .map_err(|e| bad_value(&format!("{text:?} ({e})")))
}

fn bad_value(shown: &str) -> Error {
    Error::config(
        "environment",
        NOW_VARIABLE,
        format!(
            "{shown} is not an RFC 3339 time; give one such as 2024-03-08T02:00:00Z, or unset it to use the real clock"
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_rfc3339_with_any_offset_as_utc() {
        assert_eq!(
            parse("2024-03-08T03:00:00+01:00").unwrap().to_rfc3339(),
            "2024-03-08T02:00:00+00:00"
        );
        assert_eq!(
            parse(" 2024-03-08T02:00:00Z\n").unwrap().to_rfc3339(),
            "2024-03-08T02:00:00+00:00"
        );
    }

    #[test]
    fn a_bad_value_is_a_config_error_naming_the_variable() {
        for text in ["tomorrow", "2024-03-08", "2024-03-08 02:00"] {
            let error = parse(text).unwrap_err();
            assert_eq!(error.class(), tidemark_core::ErrorClass::Config);
            let shown = error.to_string();
            assert!(
                shown.contains("TIDEMARK_NOW") && shown.contains(text),
                "{shown}"
            );
        }
    }
}
