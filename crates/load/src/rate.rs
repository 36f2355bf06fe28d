//! How a process leases tokens from a source's shared bucket (PostgreSQL)
//! without letting the leased-but-unused ones break the limit.
//!
//! The limit a user writes, `{ per_second = R, burst = B }`, promises that
//! no one-second window sees more than `R + B` requests, across every
//! process. A bucket of capacity `C` refilled at `R` hands out at most
//! `C + R·T − 1` tokens in any window of `T` seconds (`R·T` whole). A
//! process that takes `k` tokens in one round trip keeps `k − 1` of them
//! for later, so a request in the window `[t, t+1)` may spend a token
//! granted up to `hold` earlier: the window then draws on grants made in
//! `1 + hold` seconds. With `hold = (k − 1)/R` and `C = B + 2 − k`, that is
//! `(B + 2 − k) + R + (k − 1) − 1 = R + B`: the promise holds exactly. A
//! token not spent within `hold` of the round trip's start is dropped.
//! (ADR 0010 has the whole argument.)
//!
//! The lease therefore grows with the burst: `k ≤ (B + 2)/2` keeps
//! `C ≥ k`, and `k ≤ R/4` keeps the hold at most a quarter second. A
//! small burst leases one token at a time, at the full capacity `B + 1`.

use std::time::Duration;

use tidemark_core::spec::RateLimit;

/// The lease a process takes from a shared bucket, and the bucket's size.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct LeasePlan {
    /// Requests per second (the refill rate).
    pub(crate) per_second: u32,
    /// The configured burst (kept in the bucket row for operators).
    pub(crate) burst: u32,
    /// Tokens asked for per round trip, at most.
    pub(crate) lease: u32,
    /// The shared bucket's capacity: `burst + 2 − lease`.
    pub(crate) capacity: u32,
    /// How long a leased token may wait to be spent: `(lease − 1)/per_second`.
    pub(crate) hold: Duration,
}

impl LeasePlan {
    /// The plan for `limit`; `None` when `per_second` is zero (refused by
    /// the config check).
    pub(crate) fn new(limit: RateLimit) -> Option<LeasePlan> {
        let per_second = limit.per_second;
        if per_second == 0 {
            return None;
        }
        let burst = limit.burst.unwrap_or(0);
        let lease = (burst.saturating_add(2) / 2).min(per_second / 4).max(1);
        let capacity = burst.saturating_add(2) - lease;
        Some(LeasePlan {
            per_second,
            burst,
            lease,
            capacity,
            hold: Duration::from_secs(u64::from(lease - 1)) / per_second,
        })
    }

    /// Tokens to ask for when `waiting` requests of this process want one:
    /// never more than they can spend, never more than the lease.
    pub(crate) fn want(&self, waiting: usize) -> u32 {
        u32::try_from(waiting)
            .unwrap_or(u32::MAX)
            .clamp(1, self.lease)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(per_second: u32, burst: u32) -> LeasePlan {
        LeasePlan::new(RateLimit {
            per_second,
            burst: Some(burst),
        })
        .unwrap()
    }

    #[test]
    fn a_small_burst_leases_one_token_at_full_capacity() {
        let p = plan(4, 1);
        assert_eq!((p.lease, p.capacity, p.hold), (1, 2, Duration::ZERO));
        let p = plan(100, 0);
        assert_eq!((p.lease, p.capacity), (1, 1));
    }

    #[test]
    fn a_larger_burst_leases_more_and_shrinks_the_bucket_by_as_much() {
        let p = plan(10, 5);
        assert_eq!((p.lease, p.capacity), (2, 5));
        assert_eq!(p.hold, Duration::from_millis(100));
        let p = plan(100, 20);
        assert_eq!((p.lease, p.capacity), (11, 11));
        assert_eq!(p.hold, Duration::from_millis(100));
        assert_eq!(p.want(1), 1);
        assert_eq!(p.want(3), 3);
        assert_eq!(p.want(50), 11);
        assert!(LeasePlan::new(RateLimit {
            per_second: 0,
            burst: None
        })
        .is_none());
    }

    /// A model of the SQL bucket, spent by the worst possible processes:
    /// each takes a full lease whenever it can and spends every token as
    /// late as the hold allows, the first one at once. No one-second
    /// window may see more than `per_second + burst` requests.
    #[test]
    fn leases_spent_as_late_as_allowed_never_exceed_the_limit() {
        for (per_second, burst) in [(4, 1), (10, 5), (20, 9), (100, 20), (8, 0), (40, 40)] {
            let p = plan(per_second, burst);
            let rate = f64::from(per_second);
            let capacity = f64::from(p.capacity);
            let (mut tokens, mut at, step) = (capacity, 0.0_f64, 0.001);
            let mut uses: Vec<f64> = Vec::new();
            let mut now = 0.0;
            while now < 10.0 {
                tokens = (tokens + (now - at) * rate).min(capacity);
                at = now;
                let granted = (1..=p.lease)
                    .take_while(|i| f64::from(*i) <= tokens)
                    .count();
                for i in 0..granted {
                    tokens -= 1.0;
                    uses.push(if i == 0 {
                        now
                    } else {
                        now + p.hold.as_secs_f64()
                    });
                }
                now += step;
            }
            uses.sort_by(f64::total_cmp);
            let busiest = uses
                .iter()
                .map(|start| {
                    uses.iter()
                        .filter(|u| **u >= *start && **u < *start + 1.0 - step / 2.0)
                        .count()
                })
                .max()
                .unwrap();
            let allowed = (per_second + burst) as usize;
            assert!(
                busiest <= allowed,
                "{per_second}/s burst {burst} (lease {}): {busiest} in one second",
                p.lease
            );
            // And the bucket is not wasted: the sustained rate is reached.
            assert!(
                uses.len() as f64 >= 9.0 * rate,
                "{per_second}/s: {}",
                uses.len()
            );
        }
    }
}
