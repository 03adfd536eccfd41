//! Per-token request limit, per process: a token bucket holding one minute's
//! allowance, refilled continuously. Over the limit the caller learns how many
//! seconds until the next request is allowed (`Retry-After`).
//!
//! In-memory on purpose: replicas each apply the limit, so N replicas allow N
//! times the rate. It guards a process, not a global quota.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use uuid::Uuid;

pub struct RateLimiter {
    per_minute: u32,
    buckets: Mutex<HashMap<Uuid, Bucket>>,
}

struct Bucket {
    tokens: f64,
    updated: Instant,
}

/// Forget idle buckets once the map grows past this many keys.
const PRUNE_ABOVE: usize = 10_000;

impl RateLimiter {
    pub fn new(per_minute: u32) -> Self {
        RateLimiter {
            per_minute,
            buckets: Mutex::new(HashMap::new()),
        }
    }

    pub fn per_minute(&self) -> u32 {
        self.per_minute
    }

    /// Take one request for `key`, or say how long until one is available.
    pub fn check(&self, key: Uuid) -> Result<(), Duration> {
        if self.per_minute == 0 {
            return Ok(());
        }
        let capacity = f64::from(self.per_minute);
        let per_second = capacity / 60.0;
        let now = Instant::now();
        let mut buckets = self.buckets.lock().expect("rate limiter lock");
        if buckets.len() > PRUNE_ABOVE {
            // A bucket that has refilled completely holds no information.
            buckets.retain(|_, b| {
                b.tokens + now.duration_since(b.updated).as_secs_f64() * per_second < capacity
            });
        }
        let bucket = buckets.entry(key).or_insert(Bucket {
            tokens: capacity,
            updated: now,
        });
        let elapsed = now.duration_since(bucket.updated).as_secs_f64();
        bucket.tokens = (bucket.tokens + elapsed * per_second).min(capacity);
        bucket.updated = now;
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            Ok(())
        } else {
            acs_metrics::record_refusal(acs_metrics::Refusal::RateLimit);
            Err(Duration::from_secs_f64((1.0 - bucket.tokens) / per_second))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_beyond_the_allowance_is_refused_with_a_wait() {
        let limiter = RateLimiter::new(3);
        let key = Uuid::new_v4();
        for _ in 0..3 {
            assert!(limiter.check(key).is_ok());
        }
        let wait = limiter.check(key).unwrap_err();
        assert!(
            wait > Duration::from_secs(15) && wait <= Duration::from_secs(20),
            "{wait:?}"
        );
        assert!(
            limiter.check(Uuid::new_v4()).is_ok(),
            "other tokens are not affected"
        );
        assert!(
            RateLimiter::new(0).check(key).is_ok(),
            "0 turns the limit off"
        );
    }
}
