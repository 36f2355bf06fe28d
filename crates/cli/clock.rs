//! The clock that decides what is due: which periods `sync` and the `serve`
//! scheduler consider closed, and when a failed key may run again.
//!
//! `TIDEMARK_NOW` (RFC 3339), when set, is the instant the process starts
//! at: the clock then runs on from it in real time. It is for tests and dry
//! runs ("what would run at midnight?"). Leases never use it: they are the
//! database's own clock, which every host shares.

use std::sync::OnceLock;
use std::time::Instant;

use chrono::{DateTime, Utc};
use tidemark_core::Error;

/// The environment variable that sets the clock.
pub const VARIABLE: &str = "TIDEMARK_NOW";

/// `TIDEMARK_NOW` and when the process read it.
type Start = Option<(DateTime<Utc>, Instant)>;

/// Read once; an unreadable value is kept as its error message.
static START: OnceLock<Result<Start, String>> = OnceLock::new();

/// The current time, as far as "due" is concerned. An unreadable
/// `TIDEMARK_NOW` is a configuration error naming the variable.
pub fn now() -> Result<DateTime<Utc>, Error> {
    let start = START.get_or_init(|| match std::env::var(VARIABLE) {
        Err(_) => Ok(None),
        Ok(text) => DateTime::parse_from_rfc3339(text.trim())
            .map(|at| Some((at.with_timezone(&Utc), Instant::now())))
            .map_err(|e| {
                format!("{text:?} is not an RFC 3339 time such as 2024-03-07T13:00:00Z: {e}")
            }),
    });
    match start {
        Ok(None) => Ok(Utc::now()),
        Ok(Some((at, read))) => {
            Ok(*at + chrono::Duration::from_std(read.elapsed()).unwrap_or_default())
        }
        Err(message) => Err(Error::config("environment", VARIABLE, message.clone())),
    }
}
