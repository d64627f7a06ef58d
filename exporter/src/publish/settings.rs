//! Publishing's settings in one place: the flags ([`PublishArgs`], flattened into
//! `fumarole-agent run`), the typed settings they become ([`PublishSettings`]) and the part of
//! them that decides what is built ([`PublishOptions`], read by [`super::desired::desired`]
//! and [`super::Publisher`]).
//!
//! A new publishing option is a flag here, a field of [`PublishOptions`] (set in
//! [`PublishArgs::settings`]) and its use in [`super::desired`] (or the [`super::Publisher`],
//! for a new kind of object).

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::time::Duration;

use fumarole_topology::crd::SharingInfo;

/// What the agent publishes and how often it checks.
#[derive(clap::Args, Clone, Debug)]
pub struct PublishArgs {
    /// How often to re-check that the published objects are current.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = humantime::parse_duration)]
    recheck_interval: Duration,
    /// Node label whose value is this node's super-node id (read from the Node at start; the
    /// `--super-node` flag wins over it, it wins over the override file and the hardware: the
    /// NVLink fabric, an Ascend A3 chip's super-pod id from DCMI).
    #[arg(long, value_name = "KEY")]
    super_node_label: Option<String>,
    /// Also label the Node with the keys other projects' tools select nodes by: NVIDIA
    /// gpu-feature-discovery's `nvidia.com/gpu.*`, `nvidia.com/cuda.*`, `nvidia.com/mig.capable`
    /// (same keys and value formats) and Ascend's `accelerator` (docs/labels.md). Off by
    /// default: with GFD installed too, both would write the same keys.
    #[arg(long)]
    compat_labels: bool,
    /// Also publish what Huawei's Ascend scheduler plugin (ascend-for-volcano, per-node mode)
    /// reads, on nodes with Ascend NPUs: the ConfigMap `kube-system/mindx-dl-deviceinfo-<node>`
    /// (device lists by health, super-pod id and server index) and the labels `accelerator`
    /// and `accelerator-type` (docs/labels.md). Off by default: do not turn it on where
    /// Huawei's device plugin runs too (both would write the ConfigMap).
    #[arg(long)]
    ascend_device_info: bool,
    /// Address of `/metrics` and `/healthz`.
    #[arg(long, value_name = "ADDR", default_value = "0.0.0.0:9400")]
    metrics_addr: SocketAddr,
}

/// Publishing's typed settings.
#[derive(Clone, Debug)]
pub struct PublishSettings {
    /// How often the objects are re-checked (changes wake the loop sooner).
    pub recheck: Duration,
    /// Where `/metrics` and `/healthz` are served.
    pub metrics_addr: SocketAddr,
    /// The Node label that names the node's super-node, if any.
    pub super_node_label: Option<String>,
    /// What is built.
    pub options: PublishOptions,
}

/// What to publish beside the node's own objects.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PublishOptions {
    /// Also the labels other projects' tools select nodes by ([`super::compat::labels`]):
    /// NVIDIA gpu-feature-discovery's and Ascend's `accelerator`.
    pub compat_labels: bool,
    /// Also what Huawei's Ascend scheduler plugin reads: the device-info ConfigMap and the
    /// Ascend labels ([`super::ascend`]).
    pub ascend_device_info: bool,
    /// ResourceSlices for the devices the DRA kubelet plugin serves; `None`: no DRA (set by
    /// the agent once the DRA plugin runs, not by a flag).
    pub dra: Option<DraSlices>,
    /// Devices the device plugin offers in replicas, by id (set by the agent from its
    /// device-plugin configuration): `DeviceTopology` says so, for the schedulers.
    pub sharing: BTreeMap<String, SharingInfo>,
}

/// The devices the DRA kubelet plugin serves, listed in the node's ResourceSlices.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DraSlices {
    /// The node the slices are for.
    pub node: String,
    /// The ids of the devices served through DRA.
    pub devices: BTreeSet<String>,
    /// Of those, the ones several claims may hold at once, with how many.
    pub shares: BTreeMap<String, u32>,
    /// Of those, the ones published as partitionable devices ([`fumarole_topology::dra::partitions`]).
    pub partitioned: BTreeSet<String>,
}

impl PublishArgs {
    /// The typed settings (no DRA yet: see [`PublishOptions::dra`]).
    pub fn settings(&self) -> PublishSettings {
        PublishSettings {
            recheck: self.recheck_interval,
            metrics_addr: self.metrics_addr,
            super_node_label: self.super_node_label.clone(),
            options: PublishOptions {
                compat_labels: self.compat_labels,
                ascend_device_info: self.ascend_device_info,
                dra: None,
                sharing: BTreeMap::new(),
            },
        }
    }
}
