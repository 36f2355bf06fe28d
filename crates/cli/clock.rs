//! The clock that decides what is due: one place, so that `run`,
//! `backfill`, `sync`, their dry runs and `serve`'s scheduler all agree on
//! "now" (which periods are closed, when a failed key may run again).
//!
//! `TIDEMARK_NOW` (an RFC 3339 time), when set, is the instant the process
//! starts at; the clock then runs on from it in real time, so a `serve`
//! started with it still sees its schedules fire. Tests and dry runs use it
//! to ask what tidemark would do at another moment (is the period open,
//! what would `sync` run tomorrow at 03:00), for every command and for
//! `serve`'s workers (which claim only due keys, or keys continuing a
//! provisional attempt). It moves nothing else: leases, lease expiry,
//! failure back-offs and every time stored in the ledger come from the
//! database's clock, which no variable can fake (ADR 0012).

use std::sync::OnceLock;
use std::time::Instant;

use chrono::{DateTime, Utc};
use tidemark_core::Error;

/// The environment variable that overrides [`now`].
pub const NOW_VARIABLE: &str = "TIDEMARK_NOW";

/// `TIDEMARK_NOW` and when the process read it; read once.
type Start = Option<(DateTime<Utc>, Instant)>;

static START: OnceLock<Result<Start, Error>> = OnceLock::new();

/// The current time, or the time `TIDEMARK_NOW` sets, run on since the
/// process read it. A value that is not an RFC 3339 time is a
/// configuration error naming the variable, never a silent fallback to the
/// real clock.
pub fn now() -> Result<DateTime<Utc>, Error> {
    let start = START.get_or_init(|| match std::env::var(NOW_VARIABLE) {
        Err(std::env::VarError::NotPresent) => Ok(None),
        Err(std::env::VarError::NotUnicode(_)) => Err(bad_value("a value that is not UTF-8")),
        Ok(text) => parse(&text).map(|at| Some((at, Instant::now()))),
    });
    match start {
        Ok(None) => Ok(Utc::now()),
        Ok(Some((at, read))) => {
            Ok(*at + chrono::Duration::from_std(read.elapsed()).unwrap_or_default())
        }
        Err(error) => Err(error.clone()),
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
