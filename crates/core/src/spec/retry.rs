//! `[retry]`: how often, and after how long a pause, a transient failure
//! is tried again.
//!
//! Separate because the policy is more than the spec (it computes each
//! delay) and is shared by everything that talks to the outside: the HTTP
//! extractor, the loader and the engine all retry through [`RetryPolicy`].

use std::time::Duration;

use schemars::JsonSchema;
use serde::Deserialize;

use super::check::{Checker, DELAY, MAX_ATTEMPTS};
use crate::error::Error;

/// `[retry]`.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RetrySpec {
    /// Tries of one operation, the first included.
    #[serde(default = "default_max_attempts")]
    #[schemars(range(min = MAX_ATTEMPTS.min.0, max = MAX_ATTEMPTS.max.0))]
    pub max_attempts: u32,
    /// First backoff ceiling.
    #[serde(default = "default_base_delay")]
    pub base_delay: String,
    /// Largest backoff (also caps `Retry-After`).
    #[serde(default = "default_max_delay")]
    pub max_delay: String,
}

impl Default for RetrySpec {
    fn default() -> Self {
        RetrySpec {
            max_attempts: default_max_attempts(),
            base_delay: default_base_delay(),
            max_delay: default_max_delay(),
        }
    }
}

const fn default_max_attempts() -> u32 {
    5
}
fn default_base_delay() -> String {
    "500ms".to_string()
}
fn default_max_delay() -> String {
    "60s".to_string()
}

/// Bounded exponential backoff with full jitter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Tries of one operation, the first included.
    pub max_attempts: u32,
    /// First backoff ceiling.
    pub base_delay: Duration,
    /// Largest delay.
    pub max_delay: Duration,
}

impl RetryPolicy {
    /// The delay before try `attempt + 1` after try `attempt` (1-based)
    /// failed: uniformly random in `[0, min(max, base * 2^(attempt-1))]`
    /// ("full jitter"), or the server's `Retry-After` capped at `max_delay`.
    /// `unit` is a random number in `[0, 1)`.
    pub fn delay(&self, attempt: u32, retry_after: Option<Duration>, unit: f64) -> Duration {
        if let Some(after) = retry_after {
            return after.min(self.max_delay);
        }
        let exp = attempt.saturating_sub(1).min(30);
        let ceiling = self
            .base_delay
            .saturating_mul(1u32 << exp)
            .min(self.max_delay);
        ceiling.mul_f64(unit.clamp(0.0, 1.0))
    }
}

impl Checker<'_> {
    /// `[retry]`: each bound, and the first backoff no longer than the
    /// largest.
    pub(super) fn retry(&self, retry: &RetrySpec) -> Result<RetryPolicy, Error> {
        self.count("retry.max_attempts", retry.max_attempts, &MAX_ATTEMPTS)?;
        let base_delay = self.limited("retry.base_delay", &retry.base_delay, &DELAY)?;
        let max_delay = self.limited("retry.max_delay", &retry.max_delay, &DELAY)?;
        if base_delay > max_delay {
            return Err(self.err(
                "retry.base_delay",
                format!(
                    "{:?} cannot work with retry.max_delay = {:?}: the first backoff cannot be longer than the largest; give a base_delay up to {:?}, or raise max_delay",
                    retry.base_delay, retry.max_delay, retry.max_delay
                ),
            ));
        }
        Ok(RetryPolicy {
            max_attempts: retry.max_attempts,
            base_delay,
            max_delay,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_delay_is_bounded_full_jitter() {
        let policy = RetryPolicy {
            max_attempts: 5,
            base_delay: Duration::from_millis(500),
            max_delay: Duration::from_secs(4),
        };
        assert_eq!(policy.delay(1, None, 0.0), Duration::ZERO);
        assert_eq!(policy.delay(1, None, 0.999_999).as_millis(), 499);
        assert_eq!(policy.delay(3, None, 0.5), Duration::from_secs(1));
        assert_eq!(policy.delay(10, None, 0.999_999).as_millis(), 3999);
        assert_eq!(
            policy.delay(1, Some(Duration::from_secs(2)), 0.1),
            Duration::from_secs(2)
        );
        assert_eq!(
            policy.delay(1, Some(Duration::from_secs(600)), 0.1),
            Duration::from_secs(4)
        );
    }
}
