//! NVLink lanes that go down, and what that does to device pairs. Pure: the lane states come
//! from `nvmlDeviceGetNvLinkState`, read by the NVML source.
//!
//! A GPU's lanes are the ones NVML knows at start (answering enabled or disabled); a lane that
//! answers disabled later is down. Pair lane counts follow discovery's rule
//! ([`nvlink_counts`]): direct lanes count for their pair, NVSwitch lanes join every pair of
//! switch-attached GPUs with the smaller of their two counts. A pair whose count with only
//! the lanes up is below its count with all lanes is degraded to that many lanes
//! (`fumarole_topology::health::degraded_class` turns that into a class and a weight).

use std::collections::BTreeMap;

use fumarole_topology::{Fault, FaultKind, LinkFault, NodeHealth};

use crate::discover::nvml::{NvlinkLane, NvmlGpu, NvmlReport, RemoteKind, nvlink_counts};

/// One lane of a GPU as last read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LaneState {
    pub lane: u32,
    /// The far end's PCI bus id (NVML form), when NVML said.
    pub remote_bus: Option<String>,
    pub remote: RemoteKind,
    pub up: bool,
}

/// A GPU's lanes, by its normalised bus id and device id.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuLanes {
    pub id: String,
    pub bus_id: String,
    pub lanes: Vec<LaneState>,
}

fn report(gpus: &[GpuLanes], only_up: bool) -> NvmlReport {
    NvmlReport {
        driver_version: None,
        cuda_driver_version: None,
        gpus: gpus
            .iter()
            .map(|g| NvmlGpu {
                pci_bus_id: g.bus_id.clone(),
                uuid: g.id.clone(),
                nvlinks: g
                    .lanes
                    .iter()
                    .filter(|l| l.up || !only_up)
                    .filter_map(|l| {
                        Some(NvlinkLane {
                            remote_pci_bus_id: l.remote_bus.clone()?,
                            remote: l.remote,
                        })
                    })
                    .collect(),
                ..NvmlGpu::default()
            })
            .collect(),
    }
}

/// The faults lanes that are down give: each GPU with a lane down gets a degrading
/// [`FaultKind::NvlinkDown`] naming the lanes, and each pair with fewer lanes up than it has
/// a [`LinkFault`] with the lanes left.
pub fn faults(gpus: &[GpuLanes]) -> NodeHealth {
    let mut h = NodeHealth::default();
    for g in gpus {
        let down: Vec<String> = g
            .lanes
            .iter()
            .filter(|l| !l.up)
            .map(|l| l.lane.to_string())
            .collect();
        if !down.is_empty() {
            let what = if down.len() == 1 { "lane" } else { "lanes" };
            h.add(
                &g.id,
                Fault::new(
                    FaultKind::NvlinkDown,
                    format!("NVLink {what} {} down", down.join(", ")),
                ),
            );
        }
    }
    let id_of: BTreeMap<String, &str> = gpus
        .iter()
        .map(|g| {
            (
                crate::discover::nvml::normalize_bus_id(&g.bus_id),
                g.id.as_str(),
            )
        })
        .collect();
    let total = nvlink_counts(&report(gpus, false));
    let up = nvlink_counts(&report(gpus, true));
    for ((a, b), all) in total {
        let left = up.get(&(a.clone(), b.clone())).copied().unwrap_or(0);
        if left < all
            && let (Some(ida), Some(idb)) = (id_of.get(&a), id_of.get(&b))
        {
            h.add_link(
                ida,
                idb,
                LinkFault {
                    kind: FaultKind::NvlinkDown,
                    lanes_up: Some(left),
                },
            );
        }
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;
    use fumarole_topology::health::pair;

    fn switched(id: &str, bus: &str, down: &[u32]) -> GpuLanes {
        GpuLanes {
            id: id.into(),
            bus_id: bus.into(),
            lanes: (0..18)
                .map(|lane| LaneState {
                    lane,
                    remote_bus: Some(format!("00000000:{:02X}:00.0", 0xd2 + lane % 4)),
                    remote: RemoteKind::Switch,
                    up: !down.contains(&lane),
                })
                .collect(),
        }
    }

    #[test]
    fn all_lanes_up_is_no_fault() {
        let gpus = [
            switched("g0", "00000000:1B:00.0", &[]),
            switched("g1", "00000000:43:00.0", &[]),
        ];
        assert_eq!(faults(&gpus), NodeHealth::default());
    }

    #[test]
    fn a_switch_lane_down_lowers_every_pair_of_that_gpu() {
        let gpus = [
            switched("g0", "00000000:1B:00.0", &[]),
            switched("g1", "00000000:43:00.0", &[]),
            switched("g3", "00000000:52:00.0", &[5]),
        ];
        let h = faults(&gpus);
        assert!(
            h.is_healthy("g3"),
            "a lane down degrades, it does not disable"
        );
        assert_eq!(
            h.reason("g3").as_deref(),
            Some("nvlink-down: NVLink lane 5 down")
        );
        assert_eq!(h.links.len(), 2);
        assert_eq!(h.links[&pair("g0", "g3")].lanes_up, Some(17));
        assert_eq!(h.links[&pair("g1", "g3")].lanes_up, Some(17));
        assert!(!h.links.contains_key(&pair("g0", "g1")));
    }

    #[test]
    fn a_direct_pair_with_every_lane_down_has_none_left() {
        let direct = |id: &str, bus: &str, peer: &str, up: bool| GpuLanes {
            id: id.into(),
            bus_id: bus.into(),
            lanes: (0..2)
                .map(|lane| LaneState {
                    lane,
                    remote_bus: Some(peer.into()),
                    remote: RemoteKind::Gpu,
                    up,
                })
                .collect(),
        };
        let gpus = [
            direct("a", "0000:01:00.0", "0000:02:00.0", false),
            direct("b", "0000:02:00.0", "0000:01:00.0", false),
        ];
        let h = faults(&gpus);
        assert_eq!(h.links[&pair("a", "b")].lanes_up, Some(0));
        assert_eq!(
            h.reason("a").as_deref(),
            Some("nvlink-down: NVLink lanes 0, 1 down")
        );
    }
}
