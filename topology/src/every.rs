//! [`Every`]: lets a repeated event through at most once per period, for warnings about
//! something that retries often (a failing watch every second should warn once in a while,
//! the rest at debug).

use std::time::{Duration, Instant};

#[derive(Debug, Clone, Copy)]
pub struct Every {
    period: Duration,
    last: Option<Instant>,
}

impl Every {
    pub const fn new(period: Duration) -> Self {
        Every { period, last: None }
    }

    /// True the first time and then once `period` has passed since the last true.
    pub fn due(&mut self, now: Instant) -> bool {
        let due = self
            .last
            .is_none_or(|t| now.duration_since(t) >= self.period);
        if due {
            self.last = Some(now);
        }
        due
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn once_per_period() {
        let mut e = Every::new(Duration::from_secs(30));
        let t0 = Instant::now();
        assert!(e.due(t0));
        assert!(!e.due(t0 + Duration::from_secs(29)));
        assert!(e.due(t0 + Duration::from_secs(30)));
        assert!(!e.due(t0 + Duration::from_secs(31)));
    }
}
