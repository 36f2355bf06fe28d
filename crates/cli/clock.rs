//! The clock that decides what is due: one place, so that `run`,
//! `backfill`, `sync`, their dry runs and `serve`'s scheduler all agree on
//! "now".
//!
//! `TIDEMARK_NOW` (an RFC 3339 time), when set, is that clock: tests and
//! dry runs use it to ask what tidemark would do at another moment (is the
//! period open, what would `sync` run tomorrow at 03:00). It moves nothing
//! else: leases, lease expiry and the times stamped in the ledger and on
//! rows come from the database's clock, which no variable can fake.

use chrono::{DateTime, Utc};
use tidemark_core::Error;

/// The environment variable that overrides [`now`].
pub const NOW_VARIABLE: &str = "TIDEMARK_NOW";

/// The current time, or `TIDEMARK_NOW` when set. A value that is not an
/// RFC 3339 time is a configuration error naming the variable, never a
/// silent fallback to the real clock.
pub fn now() -> Result<DateTime<Utc>, Error> {
    match std::env::var(NOW_VARIABLE) {
        Err(std::env::VarError::NotPresent) => Ok(Utc::now()),
        Err(std::env::VarError::NotUnicode(_)) => Err(bad_value("a value that is not UTF-8")),
        Ok(text) => parse(&text),
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
