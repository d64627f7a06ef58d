//! Each pod's use of the devices it holds over a window of readings: what the agent writes in
//! `DeviceTopology` status (`pods`), so `kubectl fumarole top` and `/ui` can show the pods that
//! hold devices and use little of them, and since when.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fumarole_topology::crd::PodDeviceUsage;

use super::{DeviceSample, Figure, Holder, Snapshot};

/// A pod whose devices' mean utilisation is under this is held but idle.
pub const IDLE_BELOW: f64 = 0.05;

/// The readings of the window and since when each idle pod has been so.
#[derive(Debug)]
pub struct UsageTracker {
    window: Duration,
    /// Per device id: its utilisation readings, oldest first, none older than the window.
    readings: HashMap<String, VecDeque<(SystemTime, f64)>>,
    /// Per pod (namespace, name): since when it has been idle.
    idle_since: HashMap<(String, String), SystemTime>,
    /// Per pod: the utilisation last reported, in steps of 10 %.
    reported: HashMap<(String, String), u32>,
}

/// The reported utilisation moves to a new step of 10 % only once the mean is this far (in
/// percent) from the one reported: a mean that wavers around a step's edge does not rewrite
/// the object at every reading.
const HYSTERESIS: f64 = 7.5;

impl UsageTracker {
    pub fn new(window: Duration) -> Self {
        UsageTracker {
            window,
            readings: HashMap::new(),
            idle_since: HashMap::new(),
            reported: HashMap::new(),
        }
    }

    /// Takes in one library's reading and returns every holding pod's use; `held` is every
    /// device of the node's latest readings (this one's included) with its holders.
    pub fn update(
        &mut self,
        reading: &Snapshot,
        held: &[(&DeviceSample, Vec<Holder>)],
    ) -> Vec<PodDeviceUsage> {
        let now = reading.taken;
        let horizon = now.checked_sub(self.window).unwrap_or(UNIX_EPOCH);
        self.readings
            .retain(|id, _| held.iter().any(|(d, _)| d.id == *id));
        for device in &reading.devices {
            let readings = self.readings.entry(device.id.clone()).or_default();
            if let Some(u) = device.values.get(&Figure::Utilization) {
                readings.push_back((now, *u));
            }
            while readings.front().is_some_and(|(t, _)| *t < horizon) {
                readings.pop_front();
            }
        }
        // Per pod: the window means of the devices it holds (each device once).
        let mut pods: BTreeMap<(String, String), Vec<f64>> = BTreeMap::new();
        for (device, holders) in held {
            let Some(mean) = self.readings.get(&device.id).and_then(mean) else {
                continue;
            };
            let mut seen: Vec<(&str, &str)> = Vec::new();
            for h in holders.iter().filter(|h| !h.pod.is_empty()) {
                if !seen.contains(&(h.namespace.as_str(), h.pod.as_str())) {
                    seen.push((&h.namespace, &h.pod));
                    pods.entry((h.namespace.clone(), h.pod.clone()))
                        .or_default()
                        .push(mean);
                }
            }
        }
        self.idle_since.retain(|pod, _| pods.contains_key(pod));
        self.reported.retain(|pod, _| pods.contains_key(pod));
        pods.into_iter()
            .map(|(key, means)| {
                let mean = means.iter().sum::<f64>() / means.len() as f64;
                let idle_since = if mean < IDLE_BELOW {
                    Some(*self.idle_since.entry(key.clone()).or_insert(now))
                } else {
                    self.idle_since.remove(&key);
                    None
                };
                let percent = mean * 100.0;
                // An idle pod is at 0 % (its mean rounds to it); otherwise the step moves only
                // past the hysteresis.
                let reported = match self.reported.get(&key) {
                    Some(&last)
                        if idle_since.is_none()
                            && (percent - f64::from(last)).abs() < HYSTERESIS =>
                    {
                        last
                    }
                    _ => ((percent / 10.0).round() * 10.0).clamp(0.0, 100.0) as u32,
                };
                self.reported.insert(key.clone(), reported);
                PodDeviceUsage {
                    namespace: key.0,
                    pod: key.1,
                    devices: u32::try_from(means.len()).unwrap_or(u32::MAX),
                    utilization_percent: reported,
                    idle_since: idle_since.map(rfc3339),
                }
            })
            .collect()
    }
}

fn mean(readings: &VecDeque<(SystemTime, f64)>) -> Option<f64> {
    (!readings.is_empty())
        .then(|| readings.iter().map(|(_, u)| u).sum::<f64>() / readings.len() as f64)
}

/// `t` to the second, as RFC 3339.
fn rfc3339(t: SystemTime) -> String {
    let secs = t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    k8s_openapi::jiff::Timestamp::from_second(i64::try_from(secs).unwrap_or(0))
        .map(|ts| ts.to_string())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::device_metrics::{DeviceSample, Library};

    fn reading(at: u64, utils: &[f64]) -> Snapshot {
        Snapshot {
            library: Library::Nvml,
            taken: UNIX_EPOCH + Duration::from_secs(1_800_000_000 + at),
            driver_version: String::new(),
            devices: utils
                .iter()
                .enumerate()
                .map(|(i, u)| DeviceSample {
                    index: i as u32,
                    id: format!("GPU-{i}"),
                    uuid: format!("GPU-{i}"),
                    values: [(Figure::Utilization, *u)].into(),
                    ..Default::default()
                })
                .collect(),
        }
    }

    /// `reading` as the only library's, its devices held by `holders` in order.
    fn feed(
        t: &mut UsageTracker,
        reading: &Snapshot,
        holders: &[Vec<Holder>],
    ) -> Vec<PodDeviceUsage> {
        let held: Vec<_> = reading
            .devices
            .iter()
            .zip(holders)
            .map(|(d, h)| (d, h.clone()))
            .collect();
        t.update(reading, &held)
    }

    fn holder(pod: &str) -> Holder {
        Holder {
            namespace: "ml".into(),
            pod: pod.into(),
            container: "main".into(),
        }
    }

    #[test]
    fn a_pod_is_idle_from_the_reading_its_window_mean_fell_under_5_percent() {
        let mut t = UsageTracker::new(Duration::from_secs(60));
        // train holds GPUs 0 and 1 (twice: two containers), infer a share of GPU 2, GPU 3 free.
        let holders = vec![
            vec![holder("train")],
            vec![holder("train"), holder("train")],
            vec![holder("infer")],
            vec![],
        ];
        let pods = feed(&mut t, &reading(0, &[0.5, 0.3, 0.02, 0.9]), &holders);
        assert_eq!(pods.len(), 2, "{pods:?}");
        assert_eq!(pods[1].pod, "train");
        assert_eq!((pods[1].devices, pods[1].utilization_percent), (2, 40));
        assert_eq!(pods[1].idle_since, None);
        assert_eq!(pods[0].idle_since.as_deref(), Some("2027-01-15T08:00:00Z"));
        // train goes quiet: the window mean falls slowly, and idle_since is the reading it
        // fell under 5 % at; infer stays idle since its first reading.
        let mut at = 0;
        let mut idle_at = None;
        let mut percent = None;
        while idle_at.is_none() {
            at += 10;
            let pods = feed(&mut t, &reading(at, &[0.0, 0.0, 0.0, 0.9]), &holders);
            assert_eq!(pods[0].idle_since.as_deref(), Some("2027-01-15T08:00:00Z"));
            idle_at = pods[1].idle_since.clone();
            percent = Some(pods[1].utilization_percent);
        }
        // The readings older than 60 s are gone: at 70 s train's window holds only zeros, and
        // an idle pod is reported at 0 % (whatever step it was at).
        assert_eq!(at, 70);
        assert_eq!(idle_at.as_deref(), Some("2027-01-15T08:01:10Z"));
        assert_eq!(percent, Some(0));
        // A mean wavering around a step's edge keeps the step reported; a move past the
        // hysteresis changes it.
        let mut t = UsageTracker::new(Duration::from_secs(1));
        let one = &holders[..1];
        let steps: Vec<u32> = [0.44, 0.46, 0.44, 0.47, 0.53, 0.56, 0.41, 0.12, 0.04]
            .iter()
            .enumerate()
            .map(|(i, u)| feed(&mut t, &reading(10 * i as u64, &[*u]), one)[0].utilization_percent)
            .collect();
        assert_eq!(
            steps,
            [40, 40, 40, 40, 50, 50, 40, 10, 0],
            "an idle pod is at 0 %"
        );
        let mut t = UsageTracker::new(Duration::from_secs(60));
        feed(&mut t, &reading(0, &[0.5, 0.3, 0.02, 0.9]), &holders);
        // A pod gone is forgotten; back in use, it is not idle.
        let pods = feed(&mut t, &reading(80, &[0.9, 0.9, 0.0, 0.9]), &holders[..2]);
        assert_eq!(pods.len(), 1);
        assert_eq!(pods[0].idle_since, None, "{pods:?}");
    }
}
