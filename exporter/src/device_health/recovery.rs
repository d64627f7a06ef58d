//! When a device is given back: the recovery rule, as a pure state machine over observations
//! and a clock passed in.
//!
//! A source feeds [`Recovery`] two kinds of observation per device:
//! - **events** ([`Recovery::event`]): a critical report the library pushes once (an XID, a
//!   double-bit ECC error). The fault holds until *both* a quiet period has passed since the
//!   last such event of the device *and* a periodic check made after that event found the
//!   device healthy (it answered, with no disabling condition).
//! - **checks** ([`Recovery::check`]): what a periodic check reads now. Its conditions (the GPU
//!   fell off the bus, row remapping pending or failed, retired pages pending, a lane down)
//!   hold exactly as long as the checks report them: a check that answers without them clears
//!   them. A check that could not be read ([`Check::Unknown`]) changes nothing: the last good
//!   state stays.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use fumarole_topology::{Fault, FaultKind, NodeHealth};

/// What one periodic check of one device found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Check {
    /// The device answered; these conditions hold now (empty: none).
    Answered(Vec<Fault>),
    /// Nothing could be read (errors, garbage, a call that did not return): keep what was.
    Unknown,
}

#[derive(Clone, Debug, Default)]
struct DeviceState {
    /// Event-born faults by kind: the fault and when its last event came.
    events: BTreeMap<FaultKind, (Fault, Instant)>,
    /// The conditions of the last check that answered.
    conditions: Vec<Fault>,
    /// When a check last answered with no disabling condition.
    last_clean: Option<Instant>,
}

/// The faults of a source's devices under the recovery rule (see the module doc).
#[derive(Clone, Debug)]
pub struct Recovery {
    quiet: Duration,
    devices: BTreeMap<String, DeviceState>,
}

impl Recovery {
    /// `quiet`: how long after its last event a device must stay quiet before it is given back.
    pub fn new(quiet: Duration) -> Self {
        Self {
            quiet,
            devices: BTreeMap::new(),
        }
    }

    /// A critical event for device `id` at `now`: the fault holds, and its quiet period
    /// starts again.
    pub fn event(&mut self, id: &str, fault: Fault, now: Instant) {
        let d = self.devices.entry(id.to_string()).or_default();
        d.events.insert(fault.kind, (fault, now));
    }

    /// The result of a periodic check of device `id` at `now`.
    pub fn check(&mut self, id: &str, check: Check, now: Instant) {
        let d = self.devices.entry(id.to_string()).or_default();
        if let Check::Answered(conditions) = check {
            if !conditions.iter().any(|f| f.kind.disables()) {
                d.last_clean = Some(now);
            }
            d.conditions = conditions;
        }
    }

    /// Drops the event-born faults whose device has recovered by `now`.
    fn expire(&mut self, now: Instant) {
        let quiet = self.quiet;
        for d in self.devices.values_mut() {
            let last_clean = d.last_clean;
            d.events.retain(|_, (_, at)| {
                let quiet_passed = now.saturating_duration_since(*at) >= quiet;
                let checked_clean = last_clean.is_some_and(|c| c >= *at);
                !(quiet_passed && checked_clean)
            });
        }
    }

    /// Every device's faults at `now`, as a source reports them.
    pub fn health(&mut self, now: Instant) -> NodeHealth {
        self.expire(now);
        let mut h = NodeHealth::default();
        for (id, d) in &self.devices {
            for (fault, _) in d.events.values() {
                h.add(id, fault.clone());
            }
            for fault in &d.conditions {
                h.add(id, fault.clone());
            }
        }
        h
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const QUIET: Duration = Duration::from_secs(60);

    fn xid() -> Fault {
        Fault::new(FaultKind::Xid, "XID 79")
    }

    #[test]
    fn an_event_clears_after_the_quiet_period_and_a_clean_check() {
        let t0 = Instant::now();
        let mut r = Recovery::new(QUIET);
        r.event("g", xid(), t0);
        assert!(!r.health(t0).is_healthy("g"));
        // A clean check alone is not enough inside the quiet period.
        r.check("g", Check::Answered(vec![]), t0 + Duration::from_secs(1));
        assert!(!r.health(t0 + Duration::from_secs(30)).is_healthy("g"));
        // Quiet period over and a clean check after the event: given back.
        assert!(r.health(t0 + QUIET).is_healthy("g"));
    }

    #[test]
    fn the_quiet_period_alone_is_not_enough() {
        let t0 = Instant::now();
        let mut r = Recovery::new(QUIET);
        r.check("g", Check::Answered(vec![]), t0);
        r.event("g", xid(), t0 + Duration::from_secs(1));
        // No check since the event: still faulty however long it is quiet.
        assert!(!r.health(t0 + QUIET * 3).is_healthy("g"));
        // The library cannot be read: nothing changes.
        r.check("g", Check::Unknown, t0 + QUIET * 3);
        assert!(!r.health(t0 + QUIET * 3).is_healthy("g"));
        // A check that finds the GPU lost is not clean either.
        let lost = Fault::new(FaultKind::FellOffBus, "GPU is lost");
        r.check("g", Check::Answered(vec![lost]), t0 + QUIET * 3);
        let h = r.health(t0 + QUIET * 4);
        assert_eq!(h.faults("g").len(), 2);
        r.check("g", Check::Answered(vec![]), t0 + QUIET * 4);
        assert!(r.health(t0 + QUIET * 4).is_healthy("g"));
    }

    #[test]
    fn a_new_event_restarts_the_quiet_period() {
        let t0 = Instant::now();
        let mut r = Recovery::new(QUIET);
        r.event("g", xid(), t0);
        r.event("g", xid(), t0 + Duration::from_secs(50));
        r.check("g", Check::Answered(vec![]), t0 + Duration::from_secs(70));
        assert!(!r.health(t0 + Duration::from_secs(70)).is_healthy("g"));
        assert!(r.health(t0 + Duration::from_secs(110)).is_healthy("g"));
    }

    #[test]
    fn conditions_hold_while_checks_report_them() {
        let t0 = Instant::now();
        let mut r = Recovery::new(QUIET);
        let remap = Fault::new(FaultKind::RowRemap, "row remapping failed");
        let lane = Fault::new(FaultKind::NvlinkDown, "NVLink lane 3 down");
        r.check("g", Check::Answered(vec![remap.clone(), lane.clone()]), t0);
        let h = r.health(t0);
        assert!(!h.is_healthy("g"));
        assert_eq!(h.faults("g").len(), 2);
        r.check("g", Check::Unknown, t0 + Duration::from_secs(1));
        assert_eq!(r.health(t0 + Duration::from_secs(1)).faults("g").len(), 2);
        r.check(
            "g",
            Check::Answered(vec![lane]),
            t0 + Duration::from_secs(2),
        );
        let h = r.health(t0 + Duration::from_secs(2));
        assert!(h.is_healthy("g"));
        assert_eq!(h.faults("g")[0].kind, FaultKind::NvlinkDown);
        r.check("g", Check::Answered(vec![]), t0 + Duration::from_secs(3));
        assert_eq!(r.health(t0 + Duration::from_secs(3)), NodeHealth::default());
    }
}
