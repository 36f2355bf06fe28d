//! The clock that decides what is due, passed in (never read from a
//! global): `run`, `backfill`, `sync`, their dry runs, `status` and the
//! service's scheduler and workers all ask the [`Clock`] they were given,
//! so they agree on "now" (which periods are closed, which keys a worker
//! may claim, when a schedule fires), and a test can set it.
//!
//! It moves nothing else: leases, lease expiry, failure back-offs and every
//! time stored in the ledger come from the database's clock, which no
//! [`Clock`] can fake (ADR 0012).

use std::fmt::Debug;
use std::sync::Mutex;
use std::time::Instant;

use chrono::{DateTime, Utc};

/// "Now", as the engine decides what is due.
pub trait Clock: Debug + Send + Sync {
    /// The current instant.
    fn now(&self) -> DateTime<Utc>;
}

/// The system's clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> DateTime<Utc> {
        Utc::now()
    }
}

/// A clock that starts at a given instant and runs on in real time from
/// there: what the binary's `TIDEMARK_NOW` sets, so a `serve` started "at"
/// another moment still sees its schedules fire.
#[derive(Debug, Clone, Copy)]
pub struct ShiftedClock {
    start: DateTime<Utc>,
    since: Instant,
}

impl ShiftedClock {
    /// A clock reading `start` now.
    pub fn starting_at(start: DateTime<Utc>) -> ShiftedClock {
        ShiftedClock {
            start,
            since: Instant::now(),
        }
    }
}

impl Clock for ShiftedClock {
    fn now(&self) -> DateTime<Utc> {
        self.start + chrono::Duration::from_std(self.since.elapsed()).unwrap_or_default()
    }
}

/// A clock that stands still until told otherwise: for tests and
/// simulations that drive the engine's steps one at a time.
#[derive(Debug)]
pub struct ManualClock {
    now: Mutex<DateTime<Utc>>,
}

impl ManualClock {
    /// A clock reading `now` until [`ManualClock::set`] or
    /// [`ManualClock::advance`].
    pub fn new(now: DateTime<Utc>) -> ManualClock {
        ManualClock {
            now: Mutex::new(now),
        }
    }

    /// Sets the time.
    pub fn set(&self, now: DateTime<Utc>) {
        match self.now.lock() {
            Ok(mut at) => *at = now,
            Err(poisoned) => *poisoned.into_inner() = now,
        }
    }

    /// Moves the time forward by `by`.
    pub fn advance(&self, by: chrono::Duration) {
        self.set(self.now() + by);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> DateTime<Utc> {
        match self.now.lock() {
            Ok(at) => *at,
            Err(poisoned) => *poisoned.into_inner(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shifted_clock_runs_on_from_its_start() {
        let start = DateTime::parse_from_rfc3339("2024-03-08T02:00:00Z")
            .unwrap()
            .with_timezone(&Utc);
        let clock = ShiftedClock::starting_at(start);
        let first = clock.now();
        assert!(first >= start && first - start < chrono::Duration::seconds(5));
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert!(clock.now() > first);
    }

    #[test]
    fn a_manual_clock_moves_only_when_told() {
        let start = Utc::now();
        let clock = ManualClock::new(start);
        assert_eq!(clock.now(), start);
        clock.advance(chrono::Duration::hours(2));
        assert_eq!(clock.now(), start + chrono::Duration::hours(2));
    }
}
