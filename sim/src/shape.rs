//! The simulated cluster: `N` nodes of one fixture shape, cut into super-nodes, as the
//! `DeviceTopology` objects the agent would publish, read into a [`ClusterView`] by the same
//! [`ClusterView::build`] the service uses.
//!
//! A shape is written `NxFIXTURE[:S]`: `64xdgx-h100:8` is 64 `dgx-h100` nodes in 8 super-nodes
//! of 8, `32xatlas-800-910:4` 32 `atlas-800-910` nodes in 4 super-nodes. Without `:S` the whole
//! cluster is one super-node. Node `i` (named `node-NNN`) is in super-node `sn-⌊i·S/N⌋`. The
//! fixture names and their link matrices are [`fumarole_topology::shapes`].

use std::fmt;
use std::str::FromStr;

use fumarole_topology::crd::{DeviceTopology, SharingInfo};
use fumarole_topology::{baseline, shapes};

use scheduler_ext::core::view::{ClusterView, ViewError, resource_of};

use crate::trace::shared_resource;

/// Why a cluster shape cannot be used.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ShapeError {
    /// Not `NxFIXTURE[:S]`.
    #[error("cluster shape {0:?}: expected NODESxFIXTURE[:SUPER_NODES], e.g. 64xdgx-h100:8")]
    Syntax(String),
    /// A count that is not a positive integer.
    #[error("cluster shape {shape:?}: {what} {value:?} is not a positive integer")]
    Count {
        shape: String,
        what: &'static str,
        value: String,
    },
    /// More super-nodes than nodes.
    #[error("cluster shape {shape:?}: {super_nodes} super-nodes for {nodes} nodes")]
    TooManySuperNodes {
        shape: String,
        nodes: usize,
        super_nodes: usize,
    },
    /// A fixture name the simulator does not know.
    #[error("cluster shape {shape:?}: unknown node fixture {fixture:?} (known: {known})")]
    UnknownFixture {
        shape: String,
        fixture: String,
        known: String,
    },
    /// Shared nodes the shape cannot have.
    #[error(
        "cluster shape {shape:?}: {shared_nodes} nodes offering {replicas} replicas per device: \
         replicas need an NVIDIA fixture, at least 2 replicas and no more shared nodes than nodes"
    )]
    Sharing {
        shape: String,
        shared_nodes: usize,
        replicas: u32,
    },
    /// The view refused the nodes (cannot happen with the built-in fixtures).
    #[error("cluster shape {shape:?}: {source}")]
    View {
        shape: String,
        #[source]
        source: ViewError,
    },
}

/// `NxFIXTURE[:S]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterShape {
    pub nodes: usize,
    pub fixture: String,
    pub super_nodes: usize,
}

impl fmt::Display for ClusterShape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}x{}:{}", self.nodes, self.fixture, self.super_nodes)
    }
}

impl FromStr for ClusterShape {
    type Err = ShapeError;

    fn from_str(s: &str) -> Result<Self, ShapeError> {
        let shape = s.trim();
        let (body, sn) = match shape.split_once(':') {
            Some((b, sn)) => (b, Some(sn)),
            None => (shape, None),
        };
        let digits = body
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(body.len());
        let (n, rest) = body.split_at(digits);
        let Some(fixture) = rest.strip_prefix('x').filter(|_| !n.is_empty()) else {
            return Err(ShapeError::Syntax(s.to_string()));
        };
        let count = |what: &'static str, v: &str| match v.trim().parse::<usize>() {
            Ok(n) if n > 0 => Ok(n),
            _ => Err(ShapeError::Count {
                shape: s.to_string(),
                what,
                value: v.to_string(),
            }),
        };
        let nodes = count("node count", n)?;
        let super_nodes = match sn {
            Some(v) => count("super-node count", v)?,
            None => 1,
        };
        if super_nodes > nodes {
            return Err(ShapeError::TooManySuperNodes {
                shape: s.to_string(),
                nodes,
                super_nodes,
            });
        }
        let fixture = fixture.trim().to_string();
        if shapes::by_name(&fixture).is_none() {
            return Err(ShapeError::UnknownFixture {
                shape: s.to_string(),
                fixture,
                known: shapes::names().join(", "),
            });
        }
        Ok(ClusterShape {
            nodes,
            fixture,
            super_nodes,
        })
    }
}

/// A built cluster: the view, and what the baselines need besides it.
#[derive(Clone, Debug)]
pub struct SimCluster {
    pub shape: ClusterShape,
    pub view: ClusterView,
    /// The one accelerator resource every node offers.
    pub resource: String,
    /// Devices per node.
    pub devices_per_node: usize,
    /// The first this many nodes offer their devices in replicas (`<resource>.shared`), not
    /// whole ([`ClusterShape::build_shared`]).
    pub shared_nodes: usize,
    /// Replicas per device on those nodes.
    pub replicas: u32,
    /// NVIDIA's pair scores of the fixture ([`baseline::nvidia_scores`]).
    pub nvidia_scores: Vec<Vec<u32>>,
}

impl SimCluster {
    /// Devices offered whole in the cluster.
    pub fn capacity(&self) -> usize {
        self.shape.nodes.saturating_sub(self.shared_nodes) * self.devices_per_node
    }

    /// Nodes per super-node (the largest, when they differ).
    pub fn super_node_size(&self) -> usize {
        self.shape.nodes.div_ceil(self.shape.super_nodes)
    }
}

impl ClusterShape {
    /// The nodes as `DeviceTopology` objects and the view built from them.
    pub fn build(&self) -> Result<SimCluster, ShapeError> {
        self.build_shared(0, 0)
    }

    /// [`Self::build`], the first `shared_nodes` nodes offering each device as `replicas`
    /// time-sliced replicas of `<resource>.shared` (NVIDIA's device plugin with
    /// `renameByDefault`; NVIDIA fixtures only).
    pub fn build_shared(
        &self,
        shared_nodes: usize,
        replicas: u32,
    ) -> Result<SimCluster, ShapeError> {
        let links = shapes::by_name(&self.fixture).ok_or_else(|| ShapeError::UnknownFixture {
            shape: self.to_string(),
            fixture: self.fixture.clone(),
            known: shapes::names().join(", "),
        })?;
        let mut dts: Vec<DeviceTopology> = (0..self.nodes)
            .map(|i| {
                let sn = i * self.super_nodes / self.nodes;
                shapes::device_topology(
                    &format!("node-{i:03}"),
                    &self.fixture,
                    &links,
                    &format!("sn-{sn}"),
                )
            })
            .collect();
        if shared_nodes > 0 {
            let nvidia = dts
                .first()
                .and_then(|dt| dt.spec.devices.first())
                .is_some_and(|d| d.vendor == "nvidia");
            if !nvidia || replicas < 2 || shared_nodes > self.nodes {
                return Err(ShapeError::Sharing {
                    shape: self.to_string(),
                    shared_nodes,
                    replicas,
                });
            }
            for dt in dts.iter_mut().take(shared_nodes) {
                for d in &mut dt.spec.devices {
                    d.sharing = Some(SharingInfo {
                        resource: shared_resource(&resource_of(d)),
                        mechanism: "timeSlicing".into(),
                        replicas,
                    });
                }
            }
        }
        let view_err = |source| ShapeError::View {
            shape: self.to_string(),
            source,
        };
        let view = ClusterView::build(&dts, &[], &[], &[]).map_err(view_err)?;
        if let Some(e) = view.skipped.first() {
            return Err(view_err(e.clone()));
        }
        let resource = dts
            .first()
            .and_then(|dt| dt.spec.devices.first())
            .map(resource_of)
            .unwrap_or_default();
        Ok(SimCluster {
            shape: self.clone(),
            view,
            resource,
            devices_per_node: links.len(),
            shared_nodes,
            replicas,
            nvidia_scores: baseline::nvidia_scores(&links),
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;

    #[test]
    fn shapes_parse_and_build() {
        let s: ClusterShape = "64xdgx-h100:8".parse().unwrap();
        assert_eq!(
            (s.nodes, s.fixture.as_str(), s.super_nodes),
            (64, "dgx-h100", 8)
        );
        let c = s.build().unwrap();
        assert_eq!(c.view.len(), 64);
        assert_eq!(c.view.super_nodes().len(), 8);
        assert!(c.view.super_nodes().values().all(|n| n.len() == 8));
        assert_eq!(c.resource, "nvidia.com/gpu");
        assert_eq!(c.capacity(), 512);
        let a: ClusterShape = "4xatlas-800-910".parse().unwrap();
        let c = a.build().unwrap();
        assert_eq!(c.resource, "huawei.com/Ascend910");
        assert_eq!(c.view.super_nodes().len(), 1);
        // The HCCS groups survive the trip through DeviceTopology.
        let nv = c.view.node("node-000").unwrap();
        assert_eq!(nv.select.context.class_count(), 2);
    }

    /// The simulated dgx-h100 node has the links the agent publishes for the fixture (the
    /// two-dgx snapshot is real `fumarole-agent discover` output).
    #[test]
    fn dgx_h100_matches_the_agents_published_links() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../scheduler-ext/tests/snapshots/two-dgx");
        let real = scheduler_ext::snapshot::load(&dir).unwrap();
        let real = &real.node("dgx-a").unwrap().select.context;
        let sim = "1xdgx-h100"
            .parse::<ClusterShape>()
            .unwrap()
            .build()
            .unwrap();
        let ours = &sim.view.node("node-000").unwrap().select.context;
        assert_eq!(real.len(), ours.len());
        for a in 0..ours.len() {
            for b in 0..ours.len() {
                assert_eq!(real.weight(a, b), ours.weight(a, b), "{a}-{b}");
            }
        }
    }

    #[test]
    fn bad_shapes_name_the_value() {
        let e = "64xdgx-a100:8".parse::<ClusterShape>().unwrap_err();
        assert!(
            e.to_string().contains("unknown node fixture \"dgx-a100\""),
            "{e}"
        );
        let e = "0xdgx-h100"
            .parse::<ClusterShape>()
            .unwrap_err()
            .to_string();
        assert!(e.contains("node count \"0\""), "{e}");
        let e = "8xdgx-h100:two"
            .parse::<ClusterShape>()
            .unwrap_err()
            .to_string();
        assert!(e.contains("super-node count \"two\""), "{e}");
        let e = "dgx-h100".parse::<ClusterShape>().unwrap_err().to_string();
        assert!(e.contains("expected NODESxFIXTURE"), "{e}");
        let e = "2xdgx-h100:3"
            .parse::<ClusterShape>()
            .unwrap_err()
            .to_string();
        assert!(e.contains("3 super-nodes for 2 nodes"), "{e}");
    }
}
