//! The cluster view: every node the service knows, its devices and which of them are free.
//!
//! A node comes from its published `DeviceTopology` (devices, links, super-node, health and
//! allocations in status) and optionally its `Node` object (labels). Each node's
//! [`SelectContext`] is built once, when the node enters the view (one per distinct link
//! matrix, shared by the nodes that have it, with a memo of its answers: [`NodeContext`]), and
//! shared by every request.
//! A device is free when it is healthy, not allocated in the node's status and not assumed by
//! this service: named in the `fumarole.dev/devices` choice of a pod bound to the node, or of a
//! pod not bound yet whose `fumarole.dev/devices-node` is the node (a promise: Volcano binds
//! after `allocateFunc`). Promises make the view, not the memory of one process, the record of
//! what was handed out, so a restarted or newly elected extension starts from it.
//!
//! Devices held by allocated ResourceClaims of fumarole's DRA drivers (pool = node, device
//! `<vendor>-<index>`) are not free either ([`super::claims`]); and each node offers, beside
//! the extended resources, the DRA class of its devices (`gpu.fumarole.dev` for every GPU
//! vendor, `npu.fumarole.dev` for Ascend), the "resource" of a pod asking through claims.
//!
//! Shares: a device the node's device plugin offers in replicas (`spec.devices[].sharing`) is
//! not offered whole; nor is a GPU in MIG mode, whose MIG devices are offered per profile
//! (`nvidia.com/mig-<profile>`). Both are [`ShareRoom`]s: how many a device offers of the
//! resource and how many its status reports held ([`NodeView::share_rooms`]).
//!
//! A node's super-node is the `DeviceTopology`'s `spec.superNode.id`, else its
//! `fumarole.dev/super-node` label; a node with neither is a super-node of its own.
//! Free CPUs per NUMA node come from the node's Volcano `Numatopology` (for NUMA fit).
//! Pods bound with a gpu-group-size annotation, their own or their job's, are indexed by unit
//! ([`ClusterView::members`]), so group placement sees where each unit already runs; what every
//! job's pods say about the job is [`ClusterView::jobs`].
//!
//! The view is built by [`ClusterView::build`] from plain objects, so the snapshot loader and
//! the API server reflectors ([`crate::live`]) go through the same code.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::hash::BuildHasher;
use std::sync::{Arc, RwLock};

use fumarole_topology::CpuSet;
use fumarole_topology::annotation::{DEVICES_ANNOTATION, ascend};
use fumarole_topology::crd::device_topology::{
    DeviceInfo, DeviceStatus, ShareAllocation, shares_in_use,
};
use fumarole_topology::crd::{DeviceTopology, Numatopology, PodDeviceUsage};
use fumarole_topology::share::mig_resource;
use fumarole_topology::{SelectContext, SelectError, Selection};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::core::claims::Claims;
use crate::core::cow::CowMap;
use crate::core::pod_facts::PodFacts;
use crate::core::unit::{self, JobSources, Jobs, UnitKey};

mod incremental;
pub use incremental::{IncrementalView, NodeObjects, Update};

/// Most devices one node may have (free sets are 64-bit masks, so the hot path allocates
/// nothing).
pub const MAX_DEVICES: usize = 64;

/// Node label naming the node's super-node (what `fumarole-agent run --super-node` publishes).
pub const SUPER_NODE_LABEL: &str = "fumarole.dev/super-node";

/// Node label naming the scheduler pool a node's accelerators belong to: a scheduler places
/// accelerator pods only on the nodes of its own pool (`--node-pool`; none: the nodes without
/// the label), so two schedulers, each with its own ledger, never hand out one device twice.
pub const NODE_POOL_LABEL: &str = "fumarole.dev/node-pool";

/// Why a node's published objects cannot enter the view.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ViewError {
    /// The object has no `metadata.name`.
    #[error("a {kind} object has no metadata.name")]
    NoName { kind: &'static str },
    /// A link names a device index the spec does not have.
    #[error(
        "DeviceTopology {node}: link {a}-{b} names a device outside 0..{n} (spec.devices has {n})"
    )]
    LinkOutOfRange {
        node: String,
        a: u32,
        b: u32,
        n: usize,
    },
    /// The link list does not form a valid weight matrix.
    #[error("DeviceTopology {node}: links are not a valid weight matrix: {source}")]
    Links {
        node: String,
        #[source]
        source: SelectError,
    },
    /// Two devices of one node share an id.
    #[error("DeviceTopology {node}: device id {id:?} appears twice")]
    DuplicateDevice { node: String, id: String },
    /// More devices than a node view holds (device sets are 64-bit masks).
    #[error("DeviceTopology {node}: {n} devices; at most {MAX_DEVICES} per node are supported")]
    TooManyDevices { node: String, n: usize },
    /// Two DeviceTopology objects for one node.
    #[error("DeviceTopology {0} appears twice")]
    DuplicateNode(String),
}

/// The extended resource a device is advertised as, the same names the device plugin uses by
/// default (`fumarole_topology::Device::default_resource_name`).
pub fn resource_of(d: &DeviceInfo) -> String {
    match d.vendor.as_str() {
        "nvidia" => "nvidia.com/gpu".into(),
        "huawei" => match d.id.rsplit_once('-') {
            Some((family, _)) if family.starts_with("Ascend") => format!("huawei.com/{family}"),
            _ => "huawei.com/npu".into(),
        },
        "metax" => "metax-tech.com/gpu".into(),
        "amd" => "amd.com/gpu".into(),
        "intel" => "gpu.intel.com/i915".into(),
        _ => "fumarole.dev/accelerator".into(),
    }
}

/// The DRA class (= driver, [`fumarole_topology::dra`]) a device is published under.
pub fn dra_class_of(d: &DeviceInfo) -> &'static str {
    fumarole_topology::dra::driver_of(&d.vendor)
}

/// Resource name -> mask of its devices, shared by the nodes that have the same.
pub type ResourceMasks = Arc<[(String, u64)]>;

/// One node as the scheduler extension sees it.
#[derive(Clone, Debug)]
pub struct NodeView {
    pub name: String,
    /// Device ids, in `DeviceTopology` order (the indices `select` works with).
    pub device_ids: Vec<String>,
    /// Devices healthy and not allocated in the node's own status (bit i = device i).
    pub available_mask: u64,
    /// Resource name -> mask of its devices; one shared copy per distinct list (read for every
    /// node of every request, so the same few cache lines serve a whole homogeneous cluster).
    pub resource_masks: ResourceMasks,
    /// Devices named in the `fumarole.dev/devices` annotation of pods bound here.
    pub assumed_mask: u64,
    /// Devices held by allocated ResourceClaims.
    pub claimed_mask: u64,
    /// Each device's name in its DRA driver's pool (`<vendor>-<index>`).
    pub dra_names: Vec<String>,
    /// Devices the node reports unhealthy.
    pub unhealthy_mask: u64,
    /// Device id -> index.
    pub index_of: HashMap<String, usize>,
    /// NUMA node of each device, where known.
    pub numa: Vec<Option<u32>>,
    /// Free CPUs per NUMA node, from the node's `Numatopology` (`None` when it publishes none).
    pub free_cpus: Option<BTreeMap<u32, u32>>,
    /// Built once per distinct link matrix and shared by the nodes that have it.
    pub select: Arc<NodeContext>,
    /// Super-node id from the DeviceTopology or the node label, if any.
    pub super_node: Option<String>,
    /// Node labels (empty when no Node object was seen).
    pub labels: BTreeMap<String, String>,
    /// The node's [`NODE_POOL_LABEL`], read once: every decision compares it.
    pub node_pool: Option<String>,
    /// True when a `DeviceTopology` was published for the node; a bare `Node` has no devices.
    pub has_topology: bool,
    /// Pods (`namespace/name`) the node's status reports devices allocated to.
    pub reported: Vec<String>,
    /// Devices in use as shares or partitions (index, what: `MIG 3g.40gb, 1g.10gb`, `2
    /// shares: ns/pod/container, ...`), for people (`/ui`); empty on most nodes.
    pub shared: Vec<(usize, String)>,
    /// What the node offers in shares, per device and resource; empty on most nodes.
    pub share_rooms: Vec<ShareRoom>,
    /// How each pod holding devices here uses them, as the agent reports (for people:
    /// `kubectl fumarole top`, `/ui`); empty where the agent reads no vendor library.
    pub pod_usage: Vec<PodDeviceUsage>,
}

/// Replicas of one device, or its MIG devices of one profile, as a node offers them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShareRoom {
    /// The resource they are advertised under (`nvidia.com/gpu.shared`,
    /// `nvidia.com/mig-1g.10gb`).
    pub resource: String,
    /// The device (index into the node's devices).
    pub device: usize,
    /// Replicas, or MIG devices of the profile; 0 on an unhealthy device.
    pub offered: u32,
    /// Held by containers, as the node's status reports.
    pub held: u32,
}

impl NodeView {
    /// True when `k` of the devices in `free` have ideal interconnect: the best `k` of them
    /// reach `Q_ideal(k)`, the best any `k` devices of this node have.
    pub fn ideal_fit(&self, free: u64, k: usize) -> bool {
        if (free.count_ones() as usize) < k {
            return false;
        }
        match (
            self.select.select(free, k),
            self.select.context.ideal_quality(k),
        ) {
            (Ok(s), Some(ideal)) => s.quality >= ideal,
            _ => false,
        }
    }

    /// The view of one node, reusing the context of an earlier node with the same links.
    fn with_contexts(dt: &DeviceTopology, contexts: &mut Contexts) -> Result<Self, ViewError> {
        let name = dt.metadata.name.clone().ok_or(ViewError::NoName {
            kind: "DeviceTopology",
        })?;
        let devices = &dt.spec.devices;
        let n = devices.len();
        if n > MAX_DEVICES {
            return Err(ViewError::TooManyDevices { node: name, n });
        }
        let mut seen = BTreeSet::new();
        for d in devices {
            if !seen.insert(d.id.as_str()) {
                return Err(ViewError::DuplicateDevice {
                    node: name.clone(),
                    id: d.id.clone(),
                });
            }
        }
        let mut weights = vec![vec![0u32; n]; n];
        for l in &dt.spec.links {
            let (a, b) = (l.a as usize, l.b as usize);
            if a >= n || b >= n {
                return Err(ViewError::LinkOutOfRange {
                    node: name,
                    a: l.a,
                    b: l.b,
                    n,
                });
            }
            if a != b {
                weights[a][b] = l.weight;
                weights[b][a] = l.weight;
            }
        }
        let select = match contexts.get(&weights) {
            Some(c) => Arc::clone(c),
            None => {
                let ctx =
                    SelectContext::from_weights(&weights).map_err(|source| ViewError::Links {
                        node: name.clone(),
                        source,
                    })?;
                let c = Arc::new(NodeContext::new(ctx));
                contexts.insert(weights, Arc::clone(&c));
                c
            }
        };
        let status = dt.status.as_ref();
        // Each device's status, looked up once.
        let statuses: Vec<_> = devices
            .iter()
            .map(|d| status.and_then(|s| s.devices.get(&d.id)))
            .collect();
        // A device is free for a whole-device pod when healthy and nobody holds it or a share
        // of it; a GPU in MIG mode is never offered whole (its MIG devices are).
        let available = devices.iter().zip(&statuses).map(|(d, s)| {
            d.mig.is_empty()
                && match s {
                    Some(s) => {
                        s.health == "Healthy" && s.allocation.is_none() && s.shares.is_empty()
                    }
                    // No status yet: the node has not reported health; count it healthy and free.
                    None => status.is_none(),
                }
        });
        let unhealthy = statuses
            .iter()
            .map(|s| s.is_some_and(|s| s.health != "Healthy"));
        // Each device under its extended resource (unless offered in replicas) and under its
        // DRA class.
        let mut resource_masks: Vec<(String, u64)> = Vec::new();
        for (i, d) in devices.iter().enumerate() {
            let whole = d.sharing.is_none().then(|| resource_of(d));
            for r in whole.into_iter().chain([dra_class_of(d).to_string()]) {
                match resource_masks.iter_mut().find(|(name, _)| *name == r) {
                    Some((_, m)) => *m |= 1 << i,
                    None => resource_masks.push((r, 1 << i)),
                }
            }
        }
        Ok(NodeView {
            name,
            device_ids: devices.iter().map(|d| d.id.clone()).collect(),
            available_mask: mask_of(available),
            resource_masks: contexts.resource_masks(resource_masks),
            assumed_mask: 0,
            claimed_mask: 0,
            dra_names: devices
                .iter()
                .map(|d| fumarole_topology::dra::name_of(&d.vendor, d.index))
                .collect(),
            unhealthy_mask: mask_of(unhealthy),
            index_of: devices
                .iter()
                .enumerate()
                .map(|(i, d)| (d.id.clone(), i))
                .collect(),
            numa: devices.iter().map(|d| d.numa_node).collect(),
            free_cpus: None,
            select,
            super_node: dt.spec.super_node.as_ref().map(|s| s.id.clone()),
            labels: BTreeMap::new(),
            node_pool: None,
            has_topology: true,
            reported: status
                .iter()
                .flat_map(|s| s.devices.values())
                .flat_map(|s| {
                    let shares = s.shares.iter().map(|a| (&a.namespace, &a.pod));
                    let whole = s.allocation.iter().map(|a| (&a.namespace, &a.pod));
                    whole.chain(shares)
                })
                .map(|(ns, pod)| format!("{ns}/{pod}"))
                .collect(),
            share_rooms: share_rooms(devices, &statuses),
            pod_usage: status.map(|s| s.pods.clone()).unwrap_or_default(),
            shared: devices
                .iter()
                .zip(&statuses)
                .enumerate()
                .filter_map(|(i, (d, s))| {
                    let shares = s.map_or(&[][..], |s| &s.shares[..]);
                    let what = if !shares.is_empty() {
                        let holders: Vec<String> =
                            shares.iter().map(ShareAllocation::holder).collect();
                        shares_in_use(&holders)
                    } else if !d.mig.is_empty() {
                        let profiles: Vec<&str> =
                            d.mig.iter().map(|m| m.profile.as_str()).collect();
                        format!("MIG {}", profiles.join(", "))
                    } else {
                        return None;
                    };
                    Some((i, what))
                })
                .collect(),
        })
    }

    /// Takes in the node's `Node` object: its labels, and its super-node where the topology
    /// names none.
    fn label(&mut self, meta: &ObjectMeta) {
        self.labels = meta.labels.clone().unwrap_or_default();
        self.node_pool = self.labels.get(NODE_POOL_LABEL).cloned();
        if self.super_node.is_none() {
            self.super_node = self.labels.get(SUPER_NODE_LABEL).cloned();
        }
    }

    /// A node with a `Node` object but no DeviceTopology: no devices.
    fn bare(name: String) -> Self {
        NodeView {
            name,
            device_ids: Vec::new(),
            available_mask: 0,
            resource_masks: Arc::new([]),
            assumed_mask: 0,
            claimed_mask: 0,
            dra_names: Vec::new(),
            unhealthy_mask: 0,
            index_of: HashMap::new(),
            numa: Vec::new(),
            free_cpus: None,
            select: Arc::new(NodeContext::new(empty_context())),
            super_node: None,
            labels: BTreeMap::new(),
            node_pool: None,
            has_topology: false,
            reported: Vec::new(),
            shared: Vec::new(),
            share_rooms: Vec::new(),
            pod_usage: Vec::new(),
        }
    }

    /// The pods holding devices here that the agent reports idle (`idleSince` set: their
    /// devices' mean utilisation under 5 % over its window).
    pub fn idle_pods(&self) -> impl Iterator<Item = &PodDeviceUsage> {
        self.pod_usage.iter().filter(|p| p.idle_since.is_some())
    }

    /// True when the node offers `resource` in shares ([`ShareRoom`]s), not as whole devices.
    pub fn offers_shares(&self, resource: &str) -> bool {
        self.share_rooms.iter().any(|r| r.resource == resource)
    }

    /// The super-node the node belongs to: its published one, else the node itself.
    pub fn group(&self) -> &str {
        self.super_node.as_deref().unwrap_or(&self.name)
    }

    /// Mask of the devices of `resource`.
    pub fn resource_mask(&self, resource: &str) -> u64 {
        self.resource_masks
            .iter()
            .find(|(r, _)| r == resource)
            .map_or(0, |(_, m)| *m)
    }

    /// Mask of the devices named by `ids` (unknown ids are ignored).
    pub fn mask_of_ids<'a>(&self, ids: impl IntoIterator<Item = &'a String>) -> u64 {
        ids.into_iter()
            .filter_map(|id| self.index_of.get(id))
            .fold(0, |m, &i| m | 1 << i)
    }

    /// Device ids of the devices at `devices` (indices).
    pub fn ids_of(&self, devices: &[usize]) -> Vec<String> {
        devices
            .iter()
            .filter_map(|&i| self.device_ids.get(i).cloned())
            .collect()
    }
}

/// The node's [`ShareRoom`]s: each device offered in replicas, and each MIG profile of each
/// GPU in MIG mode, with how many of them the status reports held.
fn share_rooms(devices: &[DeviceInfo], statuses: &[Option<&DeviceStatus>]) -> Vec<ShareRoom> {
    let mut rooms = Vec::new();
    for (i, (d, s)) in devices.iter().zip(statuses).enumerate() {
        let shares = s.map_or(&[][..], |s| &s.shares[..]);
        let healthy = s.is_none_or(|s| s.health == "Healthy");
        let n = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
        let offered = |n: u32| if healthy { n } else { 0 };
        if let Some(sharing) = &d.sharing {
            rooms.push(ShareRoom {
                resource: sharing.resource.clone(),
                device: i,
                offered: offered(sharing.replicas),
                held: n(shares.len()),
            });
        }
        let mut profiles: Vec<&str> = d.mig.iter().map(|m| m.profile.as_str()).collect();
        profiles.sort_unstable();
        profiles.dedup();
        for profile in profiles {
            let of_profile = || d.mig.iter().filter(move |m| m.profile == profile);
            let held = of_profile()
                .filter(|m| shares.iter().any(|a| a.share == m.uuid))
                .count();
            rooms.push(ShareRoom {
                resource: mig_resource(profile),
                device: i,
                offered: offered(n(of_profile().count())),
                held: n(held),
            });
        }
    }
    rooms
}

/// The mask with bit i set where the i-th item is true.
fn mask_of(bits: impl Iterator<Item = bool>) -> u64 {
    bits.enumerate()
        .filter(|(_, b)| *b)
        .fold(0, |m, (i, _)| m | 1 << i)
}

pub use fumarole_topology::select::indices;

/// Select contexts by link matrix, kept from one view to the next so a rebuilt view reuses
/// the contexts (and their memos) of the nodes that did not change.
#[derive(Debug, Default)]
pub struct ContextCache {
    contexts: HashMap<Vec<Vec<u32>>, Arc<NodeContext>>,
    /// The shared copy of each distinct [`NodeView::resource_masks`].
    resource_masks: HashMap<Vec<(String, u64)>, ResourceMasks>,
}

impl ContextCache {
    /// Most distinct link matrices kept; the cache starts over beyond it.
    pub const LIMIT: usize = 1024;

    /// The shared copy of `masks`.
    fn resource_masks(&mut self, masks: Vec<(String, u64)>) -> ResourceMasks {
        if let Some(shared) = self.resource_masks.get(&masks) {
            return Arc::clone(shared);
        }
        if self.resource_masks.len() >= Self::LIMIT {
            self.resource_masks.clear();
        }
        let shared: ResourceMasks = Arc::from(masks.clone());
        self.resource_masks.insert(masks, Arc::clone(&shared));
        shared
    }

    fn get(&self, weights: &Vec<Vec<u32>>) -> Option<&Arc<NodeContext>> {
        self.contexts.get(weights)
    }

    fn insert(&mut self, weights: Vec<Vec<u32>>, context: Arc<NodeContext>) {
        if self.contexts.len() >= Self::LIMIT {
            self.contexts.clear();
        }
        self.contexts.insert(weights, context);
    }
}

type Contexts = ContextCache;

/// Largest number of remembered answers per context; the memo starts over beyond it.
pub const MEMO_LIMIT: usize = 4096;

/// A [`SelectContext`] and the answers it gave. `select` is a pure function of the context, the
/// free set and `k`, so nodes with the same links and the same free devices (most of a
/// homogeneous cluster) share one search.
#[derive(Debug)]
pub struct NodeContext {
    pub context: SelectContext,
    memo: RwLock<Memo>,
}

/// An answer of `select`, shared by every node and request that asks the same.
pub type Choice = Result<Arc<Selection>, SelectError>;

/// `(free mask, k)` -> the answer of `select`. foldhash, not SipHash: the keys are our own
/// masks, and SipHash was a tenth of judging a pod at 5,000 nodes (a perf profile).
type Memo = HashMap<(u64, usize), Choice, foldhash::fast::RandomState>;

impl NodeContext {
    pub fn new(context: SelectContext) -> Self {
        NodeContext {
            context,
            memo: RwLock::new(HashMap::default()),
        }
    }

    /// `SelectContext::select` over the devices in `free`, remembered.
    pub fn select(&self, free: u64, k: usize) -> Choice {
        let key = (free, k);
        if let Ok(memo) = self.memo.read()
            && let Some(r) = memo.get(&key)
        {
            return r.clone();
        }
        let r = self.context.select(&indices(free), &[], k).map(Arc::new);
        if let Ok(mut memo) = self.memo.write() {
            if memo.len() >= MEMO_LIMIT {
                memo.clear();
            }
            memo.insert(key, r.clone());
        }
        r
    }
}

/// Answers of [`NodeContext::select`] remembered for one request (one pod against many nodes).
///
/// The nodes of a homogeneous cluster share a few link matrices and free masks, so most nodes
/// of a request ask what an earlier node asked; looking that up here costs a fast hash and no
/// lock, where the shared memo costs a lock (a cache line every request thread writes) and
/// SipHash. The key is everything `select` depends on: the context (by identity: one context
/// per distinct link matrix), the free mask and `k`. Each entry holds its context, so an
/// address in a key cannot be reused by another context while the memo lives. The answers
/// are those of the view the request reads; make one memo per request.
#[derive(Debug, Default)]
pub struct RequestMemo {
    choices: HashMap<Question, (Arc<NodeContext>, Choice), foldhash::fast::RandomState>,
}

/// (address of the context, free mask, k).
type Question = (usize, u64, usize);

impl RequestMemo {
    /// `nv`'s [`NodeContext::select`] over `free`, from this memo when an earlier node with the
    /// same context asked the same.
    pub fn select(&mut self, nv: &NodeView, free: u64, k: usize) -> Choice {
        let key = (Arc::as_ptr(&nv.select) as usize, free, k);
        let (_, choice) = self
            .choices
            .entry(key)
            .or_insert_with(|| (Arc::clone(&nv.select), nv.select.select(free, k)));
        choice.clone()
    }

    /// Distinct questions asked so far.
    pub fn len(&self) -> usize {
        self.choices.len()
    }

    pub fn is_empty(&self) -> bool {
        self.choices.is_empty()
    }
}

/// The context of a node without devices.
fn empty_context() -> SelectContext {
    SelectContext::new(&fumarole_topology::LinkMatrix::from_fn(0, |_, _| {
        fumarole_topology::LinkClass::CrossNuma
    }))
}

/// Node name -> position, for the lookup every request makes for each node it names
/// (thousands). The names sit back to back in one buffer: kept each in its own allocation,
/// spread over the heap the view was parsed into, a lookup cost a cache and TLB miss on the
/// key, most of the time `filter` took. Hashed with a fast hash rather than SipHash (seeded
/// per process all the same).
#[derive(Clone, Debug, Default)]
struct NameIndex {
    /// Every name, back to back, in position order.
    text: String,
    table: hashbrown::HashTable<NameEntry>,
    hasher: foldhash::fast::RandomState,
    /// Different for each index made in this process (see [`ClusterView::names_generation`]).
    generation: u64,
}

/// The last [`NameIndex::generation`] handed out.
static NAME_GENERATIONS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Where a name sits in [`NameIndex::text`], and its position.
#[derive(Clone, Copy, Debug)]
struct NameEntry {
    start: usize,
    end: usize,
    position: usize,
}

impl NameEntry {
    fn name<'t>(&self, text: &'t str) -> &'t str {
        text.get(self.start..self.end).unwrap_or_default()
    }
}

impl NameIndex {
    /// The index of `names`, each at its position in the iteration (a repeated name is found
    /// at its first position).
    fn new<'a>(names: impl ExactSizeIterator<Item = &'a str> + Clone) -> Self {
        let mut text = String::with_capacity(names.clone().map(str::len).sum());
        let mut table = hashbrown::HashTable::with_capacity(names.len());
        let hasher = foldhash::fast::RandomState::default();
        for (position, name) in names.enumerate() {
            let hash = hasher.hash_one(name);
            if table
                .find(hash, |e: &NameEntry| e.name(&text) == name)
                .is_some()
            {
                continue;
            }
            let start = text.len();
            text.push_str(name);
            let entry = NameEntry {
                start,
                end: text.len(),
                position,
            };
            table.insert_unique(hash, entry, |e| hasher.hash_one(e.name(&text)));
        }
        NameIndex {
            text,
            table,
            hasher,
            generation: NAME_GENERATIONS.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1,
        }
    }

    /// The position of `name`.
    fn get(&self, name: &str) -> Option<usize> {
        let hash = self.hasher.hash_one(name);
        self.table
            .find(hash, |e| e.name(&self.text) == name)
            .map(|e| e.position)
    }
}

/// A pod of a gpu-group-size unit that is bound to a node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Member {
    /// `namespace/name`.
    pub pod: String,
    pub node: String,
    pub gpus: u32,
}

/// Nodes per shared chunk of a [`NodeTable`].
const NODE_CHUNK: usize = 64;

/// Every node view, by position, in chunks that views derived from one another share: a new
/// view copies one pointer per chunk and, for a node that changed, its chunk.
#[derive(Clone, Debug, Default)]
struct NodeTable {
    chunks: Vec<Arc<Vec<Arc<NodeView>>>>,
    len: usize,
}

impl NodeTable {
    fn new(nodes: Vec<NodeView>) -> Self {
        let len = nodes.len();
        let mut chunks = Vec::with_capacity(len.div_ceil(NODE_CHUNK));
        let mut nodes = nodes.into_iter().map(Arc::new).peekable();
        while nodes.peek().is_some() {
            chunks.push(Arc::new(nodes.by_ref().take(NODE_CHUNK).collect()));
        }
        NodeTable { chunks, len }
    }

    fn get(&self, i: usize) -> Option<&NodeView> {
        self.chunks
            .get(i / NODE_CHUNK)
            .and_then(|c| c.get(i % NODE_CHUNK))
            .map(AsRef::as_ref)
    }

    /// The node at `i`, copied first (with its chunk) if another view shares it.
    fn get_mut(&mut self, i: usize) -> Option<&mut NodeView> {
        let chunk = Arc::make_mut(self.chunks.get_mut(i / NODE_CHUNK)?);
        chunk.get_mut(i % NODE_CHUNK).map(Arc::make_mut)
    }

    fn iter(&self) -> impl Iterator<Item = &NodeView> {
        self.chunks.iter().flat_map(|c| c.iter().map(AsRef::as_ref))
    }
}

/// Every node the service knows, and the devices it assumed for pods.
///
/// Views derived from one another ([`IncrementalView`]) share what did not change: the node
/// table by chunks, the per-pod and per-job maps by shards ([`CowMap`]).
#[derive(Clone, Debug, Default)]
pub struct ClusterView {
    /// Every node, in name order.
    nodes: NodeTable,
    /// Node name -> its place in `nodes`.
    index: Arc<NameIndex>,
    /// Every resource name some node offers (computed once; requests check against it).
    offered: Arc<BTreeSet<String>>,
    /// Super-node -> its nodes.
    super_nodes: Arc<BTreeMap<String, Vec<String>>>,
    /// Job -> (unit, atomic part) -> its placed pods.
    members: CowMap<String, BTreeMap<(u32, u32), Vec<Member>>>,
    /// Every job's group annotations and Volcano task sizes, from all pods.
    jobs: Jobs,
    /// Bound pods with a `fumarole.dev/devices` annotation (`namespace/name` -> node).
    annotated: CowMap<Arc<str>, Arc<str>>,
    /// Pods not bound yet whose devices are promised on a node (`namespace/name` -> node).
    promised: CowMap<Arc<str>, Arc<str>>,
    /// Pods (`namespace/name`) some node reports devices allocated to, with how many nodes
    /// do.
    reported: CowMap<String, u32>,
    /// Pods not bound yet, not finished, asking for an accelerator some node offers.
    pending: CowMap<Arc<str>, Arc<Pod>>,
    /// The ResourceClaims the view was built with.
    claims: Arc<Claims>,
    /// Nodes left out because their `DeviceTopology` is unusable.
    pub skipped: Vec<ViewError>,
    /// What could not be read of nodes and claims, with the reason (logged by the caller,
    /// never fatal); [`Self::warnings`] adds the pods'.
    node_warnings: Vec<String>,
    /// A pod's own warning: its choice of devices unreadable, or made for another node.
    pod_warnings: CowMap<Arc<str>, String>,
    /// Why a pod's unit cannot be read.
    unit_warnings: CowMap<Arc<str>, String>,
}

impl ClusterView {
    /// The view from the objects of a cluster. `nodes` are the `Node` objects' metadata (labels).
    /// Pods that are bound to a node, not finished and carry a valid `fumarole.dev/devices`
    /// annotation count as using those devices. A node whose `DeviceTopology` is unusable is
    /// left out and its error kept in [`Self::skipped`]; only a nameless object is an error.
    pub fn build<'a>(
        topologies: impl IntoIterator<Item = &'a DeviceTopology>,
        numatopologies: impl IntoIterator<Item = &'a Numatopology>,
        nodes: impl IntoIterator<Item = &'a ObjectMeta>,
        pods: impl IntoIterator<Item = &'a Pod>,
    ) -> Result<Self, ViewError> {
        let facts: Vec<PodFacts> = pods.into_iter().map(PodFacts::of).collect();
        Self::build_with(
            &mut ContextCache::default(),
            topologies,
            numatopologies,
            nodes,
            &facts,
        )
    }

    /// [`Self::build`] from what was read of each pod ([`PodFacts`]), reusing (and filling)
    /// `contexts`.
    pub fn build_with<'a, 'p>(
        contexts: &mut ContextCache,
        topologies: impl IntoIterator<Item = &'a DeviceTopology>,
        numatopologies: impl IntoIterator<Item = &'a Numatopology>,
        nodes: impl IntoIterator<Item = &'a ObjectMeta>,
        pods: impl IntoIterator<Item = &'p PodFacts>,
    ) -> Result<Self, ViewError> {
        Self::build_with_jobs(
            contexts,
            topologies,
            numatopologies,
            nodes,
            pods,
            Claims::default(),
            JobSources::default(),
        )
    }

    /// [`Self::build_with`] with the cluster's ResourceClaims (the devices allocated claims
    /// hold are not free, and pods' claims are read into their requests) and what is known of
    /// jobs from outside their pods (their Volcano PodGroups' `sp-block`).
    pub fn build_with_jobs<'a, 'p>(
        contexts: &mut ContextCache,
        topologies: impl IntoIterator<Item = &'a DeviceTopology>,
        numatopologies: impl IntoIterator<Item = &'a Numatopology>,
        nodes: impl IntoIterator<Item = &'a ObjectMeta>,
        pods: impl IntoIterator<Item = &'p PodFacts>,
        claims: Claims,
        job_sources: JobSources,
    ) -> Result<Self, ViewError> {
        let mut view = ClusterView {
            claims: Arc::new(claims),
            ..ClusterView::default()
        };
        let mut found: HashMap<String, NodeView> = HashMap::new();
        let mut reported: CowMap<String, u32> = CowMap::default();
        for dt in topologies {
            let nv = match NodeView::with_contexts(dt, contexts) {
                Ok(nv) => nv,
                Err(e @ ViewError::NoName { .. }) => return Err(e),
                Err(e) => {
                    view.node_warnings.push(format!("skipping node: {e}"));
                    view.skipped.push(e);
                    continue;
                }
            };
            if found.contains_key(&nv.name) {
                view.skipped.push(ViewError::DuplicateNode(nv.name));
                continue;
            }
            for pod in &nv.reported {
                *reported.get_or_default(pod.clone()) += 1;
            }
            found.insert(nv.name.clone(), nv);
        }
        view.reported = reported;
        for meta in nodes {
            let name = meta
                .name
                .clone()
                .ok_or(ViewError::NoName { kind: "Node" })?;
            let nv = found
                .entry(name.clone())
                .or_insert_with(|| NodeView::bare(name));
            nv.label(meta);
        }
        for nt in numatopologies {
            let Some(name) = nt.metadata.name.as_deref() else {
                continue;
            };
            if let Some(nv) = found.get_mut(name) {
                match free_cpus_by_numa(nt) {
                    Ok(m) => nv.free_cpus = Some(m),
                    Err(e) => view.node_warnings.push(format!("Numatopology {name}: {e}")),
                }
            }
        }
        let mut nodes: Vec<NodeView> = found.into_values().collect();
        nodes.sort_unstable_by(|a, b| a.name.cmp(&b.name));
        let index = NameIndex::new(nodes.iter().map(|nv| nv.name.as_str()));
        let mut super_nodes: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for nv in &nodes {
            super_nodes
                .entry(nv.group().to_string())
                .or_default()
                .push(nv.name.clone());
        }
        view.super_nodes = Arc::new(super_nodes);
        for (key, claim) in view.claims.iter() {
            for held in &claim.held {
                let Some(nv) = index.get(&held.node).and_then(|i| nodes.get_mut(i)) else {
                    view.node_warnings.push(format!(
                        "ResourceClaim {key}: holds {} on {}, a node the view does not have",
                        held.device, held.node
                    ));
                    continue;
                };
                // A partition (`nvidia-0-3g-40gb-4`, a MIG instance or vNPU) is held on its
                // device, which is then not free whole either.
                let of_device =
                    |d: &String| fumarole_topology::dra::is_or_partitions(&held.device, d);
                match nv.dra_names.iter().position(of_device) {
                    Some(i) => nv.claimed_mask |= 1 << i,
                    None => view.node_warnings.push(format!(
                        "ResourceClaim {key}: holds {} on {}, which has no such device",
                        held.device, held.node
                    )),
                }
            }
        }
        view.offered = Arc::new(
            nodes
                .iter()
                .flat_map(|n| {
                    let whole = n.resource_masks.iter().map(|(r, _)| r.clone());
                    whole.chain(n.share_rooms.iter().map(|r| r.resource.clone()))
                })
                .collect(),
        );
        view.index = Arc::new(index);
        view.nodes = NodeTable::new(nodes);
        let pods: Vec<&PodFacts> = pods.into_iter().collect();
        let offered = Arc::clone(&view.offered);
        let offered: BTreeSet<&str> = offered.iter().map(String::as_str).collect();
        view.jobs = Jobs::with_sources(job_sources);
        for pod in &pods {
            view.jobs.add_facts(&pod.unit);
            view.jobs.add_pod_group(&pod.unit);
        }
        for pod in &pods {
            view.count_devices(pod, &offered);
        }
        for pod in pods {
            view.add_pod(pod, &offered);
            if let Some((node, ids)) = assumes(pod)
                && let Some(nv) = view.index.get(node).and_then(|i| view.nodes.get_mut(i))
            {
                nv.assumed_mask |= nv.mask_of_ids(ids);
            }
            if let Some(node) = placed_on(pod) {
                view.add_member(pod, node, &offered);
            }
        }
        Ok(view)
    }

    /// Counts the devices of one pod towards its job's total. Job totals are checked against
    /// sp-block: counted for group jobs only (cheap in a big cluster); pods on their way out
    /// do not count. With Huawei's whole-job default, Ascend pods count towards their job too.
    fn count_devices(&mut self, pod: &PodFacts, offered: &BTreeSet<&str>) {
        let grouped = self.jobs.annotated_unit(&pod.unit);
        if !pod.finished
            && !pod.deleting
            && (grouped || self.jobs.whole_job_super_pod())
            && let Ok(r) = pod.request.request(offered, &self.claims)
        {
            let n = u32::try_from(r.count).unwrap_or(u32::MAX);
            if grouped {
                self.jobs.add_devices(&pod.unit.job, n);
            } else if ascend::chip_of(&r.resource).is_some() {
                self.jobs.add_ascend_pod(&pod.unit.job, n);
            }
        }
    }

    /// True when `pod` may change what the view knows of its job: it names a Volcano task,
    /// carries group annotations, its PodGroup does, or (Huawei's whole-job default) it asks
    /// for an Ascend resource. Jobs no pod speaks for hold nothing.
    fn speaks_for_job(&self, pod: &PodFacts, offered: &BTreeSet<&str>) -> bool {
        pod.unit.speaks()
            || self.jobs.pod_group_speaks(&pod.unit)
            || (self.jobs.whole_job_super_pod()
                && pod
                    .request
                    .request(offered, &self.claims)
                    .is_ok_and(|r| ascend::chip_of(&r.resource).is_some()))
    }

    /// Records what a pod itself says (its unit apart, [`Self::add_member`]; its devices
    /// apart, [`assumes`]): a bound one annotated with its choice; an unbound one asking for
    /// an accelerator is pending, and its promise recorded; a choice that cannot be used is
    /// a warning.
    fn add_pod(&mut self, pod: &PodFacts, offered: &BTreeSet<&str>) {
        if pod.finished {
            return;
        }
        let key = &pod.key;
        let node = match &pod.node {
            Some(node) => {
                if pod.choice_node.as_ref().is_some_and(|n| n != node) {
                    // Bound elsewhere than the choice was made for: the choice is void here.
                    self.pod_warnings.insert(
                        Arc::clone(key),
                        format!(
                            "pod {key}: bound to {node}, its {DEVICES_ANNOTATION} is for another node"
                        ),
                    );
                    return;
                }
                node
            }
            None => {
                let waiting = !pod.deleting;
                if waiting
                    && pod.request.request(offered, &self.claims).is_ok()
                    && let Some(whole) = &pod.unbound
                {
                    self.pending.insert(Arc::clone(key), Arc::clone(whole));
                }
                match &pod.choice_node {
                    Some(node) if waiting => node,
                    _ => return,
                }
            }
        };
        match &pod.choice {
            Some(Ok(_)) => {
                let record = if pod.node.is_some() {
                    &mut self.annotated
                } else {
                    &mut self.promised
                };
                record.insert(Arc::clone(key), Arc::clone(node));
            }
            Some(Err(e)) => {
                self.pod_warnings.insert(Arc::clone(key), e.clone());
            }
            None => {}
        }
    }

    /// Forgets what [`Self::add_pod`] recorded of the pod `key`.
    fn remove_pod(&mut self, key: &str) {
        self.pending.remove(key);
        self.annotated.remove(key);
        self.promised.remove(key);
        self.pod_warnings.remove(key);
        self.unit_warnings.remove(key);
    }

    /// Indexes a pod placed on `node` (bound, or its devices promised there) by its unit.
    fn add_member(&mut self, pod: &PodFacts, node: &str, offered: &BTreeSet<&str>) {
        if !self.jobs.in_unit_facts(&pod.unit) {
            return;
        }
        let Ok(req) = pod.request.request(offered, &self.claims) else {
            return;
        };
        let gpus = u32::try_from(req.count).unwrap_or(u32::MAX);
        match unit::unit_spec_of(&pod.unit, gpus, &self.jobs) {
            Ok(Some(spec)) => self
                .members
                .get_or_default(pod.unit.job.clone())
                .entry((spec.unit, spec.atomic_unit))
                .or_default()
                .push(Member {
                    pod: pod.key.to_string(),
                    node: node.to_string(),
                    gpus,
                }),
            Ok(None) => {}
            Err(e) => {
                self.unit_warnings
                    .insert(Arc::clone(&pod.key), format!("pod {}: {e}", pod.key));
            }
        }
    }

    /// The node called `name`.
    pub fn node(&self, name: &str) -> Option<&NodeView> {
        self.index.get(name).and_then(|i| self.nodes.get(i))
    }

    /// Each of `names` with its position ([`Self::node_at`]; `None`: not in the
    /// view). While the names follow the view's order (by name), each is compared with the
    /// node after the last one found instead of hashed; a miss goes to the name index and
    /// guessing stops until a lookup lands right after the last again. (kube-scheduler lists
    /// a single zone's nodes by name, but its parallel filter merges chunks of that list node
    /// by node; following a few runs at once measured no faster, see docs/performance.md.)
    pub fn positions<'n>(
        &self,
        names: impl IntoIterator<Item = &'n str>,
    ) -> impl Iterator<Item = (&'n str, Option<usize>)> {
        let mut last: Option<usize> = None;
        let mut guessing = true;
        names.into_iter().map(move |name| {
            let guessed = last
                .map(|l| l + 1)
                .filter(|&i| guessing && self.nodes.get(i).is_some_and(|nv| nv.name == name));
            let found = guessed.or_else(|| self.index.get(name));
            if let Some(i) = found {
                guessing = last.is_none_or(|l| i == l + 1);
                last = Some(i);
            }
            (name, found)
        })
    }

    /// The node at `position` (see [`Self::positions`]).
    pub fn node_at(&self, position: usize) -> Option<&NodeView> {
        self.nodes.get(position)
    }

    /// Names the order of [`Self::nodes`]: views with the same generation list the same nodes
    /// in the same order (an update that adds, removes or renames none keeps it), so a caller
    /// may keep a table of positions across views and calls. 0 only for the empty default view.
    pub fn names_generation(&self) -> u64 {
        self.index.generation
    }

    /// All nodes, by name.
    pub fn nodes(&self) -> impl Iterator<Item = &NodeView> {
        self.nodes.iter()
    }

    pub fn len(&self) -> usize {
        self.nodes.len
    }

    pub fn is_empty(&self) -> bool {
        self.nodes.len == 0
    }

    /// What could not be read (logged by the caller, never fatal): of nodes and claims in
    /// the order found, then of pods by pod.
    pub fn warnings(&self) -> Vec<&str> {
        let mut pods: Vec<(&Arc<str>, u8, &String)> = self
            .pod_warnings
            .iter()
            .map(|(k, w)| (k, 0, w))
            .chain(self.unit_warnings.iter().map(|(k, w)| (k, 1, w)))
            .collect();
        pods.sort_unstable();
        self.node_warnings
            .iter()
            .map(String::as_str)
            .chain(pods.into_iter().map(|(_, _, w)| w.as_str()))
            .collect()
    }

    /// The ResourceClaims the view was built with.
    pub fn claims(&self) -> &Claims {
        &self.claims
    }

    /// Every resource name some node offers.
    pub fn resources(&self) -> BTreeSet<&str> {
        self.offered.iter().map(String::as_str).collect()
    }

    /// Pods waiting for an accelerator: not bound, not finished, requesting a resource some
    /// node offers; by `namespace/name`.
    pub fn pending(&self) -> Vec<&Arc<Pod>> {
        let mut pending: Vec<(&Arc<str>, &Arc<Pod>)> = self.pending.iter().collect();
        pending.sort_unstable_by(|a, b| a.0.cmp(b.0));
        pending.into_iter().map(|(_, p)| p).collect()
    }

    /// Super-nodes and their nodes, by id.
    pub fn super_nodes(&self) -> &BTreeMap<String, Vec<String>> {
        &self.super_nodes
    }

    /// What the pods of each job say about the job (group annotations, Volcano tasks).
    pub fn jobs(&self) -> &Jobs {
        &self.jobs
    }

    /// The bound pods of a unit.
    pub fn members(&self, unit: &UnitKey) -> &[Member] {
        self.members
            .get(unit.job.as_str())
            .and_then(|units| units.get(&(unit.unit, unit.atomic)))
            .map_or(&[], Vec::as_slice)
    }

    /// True when some node reports devices allocated to the pod (`namespace/name`).
    pub fn reported(&self, pod: &str) -> bool {
        self.reported.contains_key(pod)
    }

    /// The node a pod is bound to with a `fumarole.dev/devices` annotation, if it is.
    pub fn annotated_on(&self, pod: &str) -> Option<&str> {
        self.annotated.get(pod).map(AsRef::as_ref)
    }

    /// Pods not bound yet with devices promised on a node: (`namespace/name`, node).
    pub fn promised(&self) -> impl Iterator<Item = (&str, &str)> {
        self.promised.iter().map(|(p, n)| (p.as_ref(), n.as_ref()))
    }

    /// The node `pod`'s devices are promised on, while it is not bound.
    pub fn promised_on(&self, pod: &str) -> Option<&str> {
        self.promised.get(pod).map(AsRef::as_ref)
    }

    /// Mask of the free devices of `resource` on `nv`: healthy, not allocated in status, not
    /// chosen for a bound pod, not held by an allocated ResourceClaim.
    pub fn free_mask(&self, nv: &NodeView, resource: &str) -> u64 {
        nv.available_mask & nv.resource_mask(resource) & !nv.assumed_mask & !nv.claimed_mask
    }

    /// Indices (into the node's devices) of the free devices of `resource` on `node`
    /// ([`Self::free_mask`]). Empty for unknown nodes.
    pub fn free(&self, node: &str, resource: &str) -> Vec<usize> {
        self.node(node)
            .map_or_else(Vec::new, |nv| indices(self.free_mask(nv, resource)))
    }
}

/// The node where a pod's chosen devices count as taken, and their ids: a pod bound with a
/// choice made for its node, or not bound yet (nor being deleted) with devices promised on
/// one. Finished pods hold nothing.
fn assumes(pod: &PodFacts) -> Option<(&Arc<str>, &[String])> {
    if pod.finished {
        return None;
    }
    let node = match &pod.node {
        Some(node) if pod.choice_node.as_ref().is_some_and(|n| n != node) => return None,
        Some(node) => node,
        None if pod.deleting => return None,
        None => pod.choice_node.as_ref()?,
    };
    match &pod.choice {
        Some(Ok(ids)) => Some((node, ids)),
        _ => None,
    }
}

/// The node a pod is placed on for its unit: the one it is bound to, or the one its usable
/// devices are promised on while it is not bound (nor being deleted).
fn placed_on(pod: &PodFacts) -> Option<&Arc<str>> {
    if pod.finished {
        return None;
    }
    match (&pod.node, &pod.choice_node, &pod.choice) {
        (Some(node), _, _) => Some(node),
        (None, Some(node), Some(Ok(_))) if !pod.deleting => Some(node),
        _ => None,
    }
}

/// Free CPUs per NUMA node: `numares.cpu.allocatable` (which the exporter publishes without the
/// CPUs pinned to pods) counted by `cpuDetail`'s NUMA ids.
fn free_cpus_by_numa(nt: &Numatopology) -> Result<BTreeMap<u32, u32>, String> {
    let allocatable = nt
        .spec
        .numares
        .get("cpu")
        .map(|r| r.allocatable.as_str())
        .unwrap_or_default();
    let free = CpuSet::parse(allocatable).map_err(|e| format!("numares.cpu.allocatable: {e}"))?;
    let mut out = BTreeMap::new();
    for (cpu, info) in &nt.spec.cpu_detail {
        let cpu: u32 = cpu
            .parse()
            .map_err(|_| format!("cpuDetail key {cpu:?} is not a CPU id"))?;
        let numa =
            u32::try_from(info.numa).map_err(|_| format!("cpu {cpu}: numa {}", info.numa))?;
        let n = out.entry(numa).or_insert(0u32);
        if free.contains(cpu) {
            *n += 1;
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;
    use fumarole_topology::annotation::DEVICES_NODE_ANNOTATION;
    use k8s_openapi::api::core::v1::Node;

    fn dt(name: &str, n: u32, weight: u32, allocated: &[u32]) -> DeviceTopology {
        fumarole_topology::crd::testing::nvlink_node(name, n, weight, allocated, |i| {
            format!("GPU-{i}")
        })
    }

    #[test]
    fn request_memo_shares_answers_only_for_the_same_links_free_mask_and_k() {
        // a and b: same links, same free GPUs; c: same links, other free GPUs; d: other links.
        let view = ClusterView::build(
            &[
                dt("a", 8, 10, &[0, 1]),
                dt("b", 8, 10, &[0, 1]),
                dt("c", 8, 10, &[2, 3]),
                dt("d", 8, 20, &[0, 1]),
            ],
            &[],
            &[],
            &[],
        )
        .unwrap();
        let gpu = "nvidia.com/gpu";
        let node = |n| view.node(n).unwrap();
        let free = |n| view.free_mask(node(n), gpu);
        let mut memo = RequestMemo::default();
        let a = memo.select(node("a"), free("a"), 4).unwrap();
        let b = memo.select(node("b"), free("b"), 4).unwrap();
        assert!(Arc::ptr_eq(&a, &b), "b is answered from a's search");
        assert_eq!(memo.len(), 1);
        let c = memo.select(node("c"), free("c"), 4).unwrap();
        let d = memo.select(node("d"), free("d"), 4).unwrap();
        let a2 = memo.select(node("a"), free("a"), 2).unwrap();
        assert_eq!(
            memo.len(),
            4,
            "another mask, other links, another k: new questions"
        );
        // Every answer is what the node's own context gives.
        for (n, k, got) in [("a", 4, &a), ("c", 4, &c), ("d", 4, &d), ("a", 2, &a2)] {
            let own = node(n)
                .select
                .context
                .select(&indices(free(n)), &[], k)
                .unwrap();
            assert_eq!(**got, own, "{n} k={k}");
        }
        assert_ne!(a.devices, c.devices);
        // Too few free devices is remembered as the same error select gives.
        assert_eq!(
            memo.select(node("a"), free("a"), 7),
            Err(SelectError::NotEnoughFree { k: 7, free: 6 })
        );
    }

    #[test]
    fn a_rebuilt_view_is_judged_afresh() {
        use crate::core::cluster::Cluster;
        use crate::core::decide::judge;
        use crate::core::ledger::Ledger;
        use crate::core::request::{DeviceRequest, PodRequest};
        use crate::core::score::Scoring;
        use crate::core::verdict::NodeVerdict;
        let req = PodRequest {
            devices: DeviceRequest {
                pod: "default/p".into(),
                resource: "nvidia.com/gpu".into(),
                count: 4,
            },
            unit: None,
            numa_cpus: None,
        };
        let ledger = Ledger::default();
        let now = std::time::Instant::now();
        let names = ["a", "b", "ghost", "c"];
        let mut contexts = ContextCache::default();
        let mut verdicts = Vec::new();
        for allocated_on_b in [&[0u32, 1][..], &[0, 1, 2, 3, 4]] {
            // The second view reuses the first one's contexts (and their shared memos).
            let view = ClusterView::build_with(
                &mut contexts,
                &[
                    dt("a", 8, 10, &[0, 1]),
                    dt("b", 8, 10, allocated_on_b),
                    dt("c", 8, 10, &[0, 1]),
                ],
                &[],
                &[],
                &[],
            )
            .unwrap();
            let c = Cluster::new(&view, &ledger, now);
            let s = Scoring::default();
            let judged = judge(c, &s, &req, None, names);
            // One request's memo gives what judging each node on its own gives.
            let g = s.gpu_aware();
            let alone: Vec<NodeVerdict> = names.iter().map(|n| g.node(&c, n, &req)).collect();
            assert_eq!(judged, alone);
            verdicts.push(judged);
        }
        assert!(verdicts[0][1].feasible());
        assert_eq!(
            verdicts[1][1].reason().as_deref(),
            Some("needs 4 nvidia.com/gpu, 3 free")
        );
        assert_eq!(verdicts[0][0], verdicts[1][0]);
        assert!(verdicts[1][2].reason().unwrap().starts_with("unknown node"));
    }

    #[test]
    fn name_index_finds_each_name_at_its_position() {
        let index = NameIndex::new(["n-1", "n-0", "", "n-10", "n-0"].into_iter());
        assert_eq!(index.get("n-1"), Some(0));
        assert_eq!(
            index.get("n-0"),
            Some(1),
            "a repeated name keeps its first position"
        );
        assert_eq!(index.get(""), Some(2));
        assert_eq!(index.get("n-10"), Some(3));
        assert_eq!(index.get("n-"), None);
        assert_eq!(index.get("n-100"), None);
        assert_eq!(NameIndex::default().get("n-1"), None);
        let view =
            ClusterView::build(&[dt("b", 2, 10, &[]), dt("a", 2, 10, &[])], &[], &[], &[]).unwrap();
        assert_eq!(view.node("a").unwrap().name, "a");
        assert_eq!(view.node("b").unwrap().name, "b");
        assert!(view.node("c").is_none());
        let order: Vec<&str> = view.nodes().map(|n| n.name.as_str()).collect();
        assert_eq!(order, ["a", "b"]);
    }

    #[test]
    fn every_name_is_found_in_any_order() {
        let view = ClusterView::build(
            &[
                dt("c", 2, 10, &[]),
                dt("a", 2, 10, &[]),
                dt("b", 2, 10, &[]),
            ],
            &[],
            &[],
            &[],
        )
        .unwrap();
        let at = |names: &[&str]| {
            view.positions(names.iter().copied())
                .map(|(_, p)| p)
                .collect::<Vec<_>>()
        };
        assert_eq!(at(&["a", "b", "c"]), [Some(0), Some(1), Some(2)]);
        assert_eq!(at(&["c", "a", "b"]), [Some(2), Some(0), Some(1)]);
        assert_eq!(
            at(&["b", "x", "b", "c", "a"]),
            [Some(1), None, Some(1), Some(2), Some(0)]
        );
        assert_eq!(at(&[]), []);
        let order: Vec<&str> = (0..4)
            .filter_map(|i| Some(view.node_at(i)?.name.as_str()))
            .collect();
        assert_eq!(order, ["a", "b", "c"]);
    }

    #[test]
    fn nodes_with_the_same_resources_share_one_list() {
        let view = ClusterView::build(&[dt("a", 4, 10, &[0]), dt("b", 4, 20, &[])], &[], &[], &[])
            .unwrap();
        let (a, b) = (view.node("a").unwrap(), view.node("b").unwrap());
        assert!(Arc::ptr_eq(&a.resource_masks, &b.resource_masks));
        assert_eq!(a.resource_mask("nvidia.com/gpu"), 0b1111);
        assert_eq!(b.resource_mask("amd.com/gpu"), 0);
    }

    #[test]
    fn free_excludes_allocated_unhealthy_and_assumed() {
        let mut t = dt("a", 4, 10, &[0]);
        t.status
            .as_mut()
            .unwrap()
            .devices
            .get_mut("GPU-1")
            .unwrap()
            .health = "Unhealthy".into();
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "annotations": {DEVICES_ANNOTATION: r#"{"nvidia.com/gpu":["GPU-2"]}"#}},
            "spec": {"nodeName": "a", "containers": []}
        }))
        .unwrap();
        let view = ClusterView::build(&[t], &[], &[], &[pod]).unwrap();
        assert_eq!(view.free("a", "nvidia.com/gpu"), vec![3]);
        assert!(view.free("a", "huawei.com/Ascend910").is_empty());
        assert!(view.free("nope", "nvidia.com/gpu").is_empty());
    }

    /// A GPU in MIG mode, or one whose share (a replica, a MIG device) a container holds, is
    /// not free for a whole-device pod.
    #[test]
    fn shared_and_mig_gpus_are_not_free_whole() {
        use fumarole_topology::crd::device_topology::{MigInfo, ShareAllocation};
        let mut t = dt("a", 4, 10, &[]);
        t.spec.devices[0].mig = vec![MigInfo {
            uuid: "MIG-0".into(),
            profile: "7g.80gb".into(),
        }];
        t.status
            .as_mut()
            .unwrap()
            .devices
            .get_mut("GPU-2")
            .unwrap()
            .shares = vec![ShareAllocation {
            share: "GPU-2::0".into(),
            namespace: "serve".into(),
            pod: "infer".into(),
            container: "main".into(),
        }];
        let view = ClusterView::build(&[t], &[], &[], &[]).unwrap();
        assert_eq!(view.free("a", "nvidia.com/gpu"), vec![1, 3]);
        // What holds them, for people.
        assert_eq!(
            view.node("a").unwrap().shared,
            [
                (0, "MIG 7g.80gb".to_string()),
                (2, "1 shares: serve/infer/main".to_string())
            ]
        );
    }

    /// Devices promised to a pod not bound yet count as taken on their node; a promise on a
    /// pod being deleted, or one made for another node than the pod was bound to, does not.
    #[test]
    fn promises_count_until_bound_elsewhere_or_deleted() {
        let pod =
            |name: &str, node: Option<&str>, for_node: &str, gpu: &str, deleting: bool| -> Pod {
                serde_json::from_value(serde_json::json!({
                    "metadata": {
                        "name": name, "namespace": "ml",
                        "deletionTimestamp": deleting.then_some("2026-01-01T00:00:00Z"),
                        "annotations": {
                            DEVICES_ANNOTATION: format!(r#"{{"nvidia.com/gpu":["{gpu}"]}}"#),
                            DEVICES_NODE_ANNOTATION: for_node,
                        }
                    },
                    "spec": {"nodeName": node, "containers": [{"name": "c",
                        "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}
                }))
                .unwrap()
            };
        let pods = [
            pod("promised", None, "a", "GPU-0", false),
            pod("going", None, "a", "GPU-1", true),
            pod("moved", Some("b"), "a", "GPU-2", false),
            pod("bound", Some("a"), "a", "GPU-3", false),
        ];
        let view = ClusterView::build(&[dt("a", 4, 10, &[]), dt("b", 4, 10, &[])], &[], &[], &pods)
            .unwrap();
        assert_eq!(view.free("a", "nvidia.com/gpu"), vec![1, 2]);
        assert_eq!(view.free("b", "nvidia.com/gpu"), vec![0, 1, 2, 3]);
        assert_eq!(view.promised_on("ml/promised"), Some("a"));
        assert_eq!(view.promised().count(), 1);
        assert_eq!(view.annotated_on("ml/bound"), Some("a"));
        assert_eq!(view.annotated_on("ml/moved"), None);
        assert!(
            view.warnings().iter().any(|w| w.contains("ml/moved")),
            "{:?}",
            view.warnings()
        );
        // The promised pod is still waiting to be bound.
        assert_eq!(view.pending().len(), 1);
    }

    #[test]
    fn bad_links_skip_the_node_with_the_reason() {
        let mut t = dt("a", 2, 10, &[]);
        t.spec.links[0].b = 7;
        let view = ClusterView::build(&[t, dt("b", 2, 10, &[])], &[], &[], &[]).unwrap();
        assert!(view.node("a").is_none() && view.node("b").is_some());
        let e = &view.skipped[0];
        assert!(e.to_string().contains("DeviceTopology a"), "{e}");
    }

    #[test]
    fn same_links_share_one_context_and_memo_answers_match() {
        let view = ClusterView::build(
            &[
                dt("a", 4, 10, &[0]),
                dt("b", 4, 10, &[]),
                dt("c", 4, 20, &[]),
            ],
            &[],
            &[],
            &[],
        )
        .unwrap();
        let (a, b, c) = (
            view.node("a").unwrap(),
            view.node("b").unwrap(),
            view.node("c").unwrap(),
        );
        assert!(Arc::ptr_eq(&a.select, &b.select));
        assert!(!Arc::ptr_eq(&a.select, &c.select));
        let free = view.free("a", "nvidia.com/gpu");
        let direct = a.select.context.select(&free, &[], 2).map(Arc::new);
        let mask = view.free_mask(a, "nvidia.com/gpu");
        assert_eq!(indices(mask), free);
        assert_eq!(a.select.select(mask, 2), direct);
        assert_eq!(b.select.select(mask, 2), direct);
        assert_eq!(
            a.select.select(mask, 9),
            a.select.context.select(&free, &[], 9).map(Arc::new)
        );
    }

    /// What an agent publishes while GPU 3 is out (health and a reason) and GPU 1 has an
    /// NVLink lane down (its pairs at NV17, weight 270, the others NV18, 280): GPU 3 is never
    /// free, and select stops pairing GPU 1 first.
    #[test]
    fn faults_the_agent_publishes_flow_into_the_view() {
        let mut t = dt("a", 4, 280, &[]);
        let status = t.status.as_mut().unwrap().devices.get_mut("GPU-3").unwrap();
        status.health = "Unhealthy".into();
        status.reason = Some("xid: XID 79 (GPU has fallen off the bus)".into());
        for l in &mut t.spec.links {
            if l.a == 1 || l.b == 1 {
                l.count = Some(17);
                l.weight = 270;
            }
        }
        let view = ClusterView::build(&[t], &[], &[], &[]).unwrap();
        assert_eq!(view.free("a", "nvidia.com/gpu"), vec![0, 1, 2]);
        let nv = view.node("a").unwrap();
        assert_eq!(nv.select.context.weight(0, 1), 270);
        let pair = nv.select.context.select(&[0, 1, 2], &[], 2).unwrap();
        assert_eq!(pair.devices, vec![0, 2]);
    }

    #[test]
    fn node_without_topology_has_no_devices() {
        let node: Node = serde_json::from_value(
            serde_json::json!({"metadata": {"name": "cpu", "labels": {"x": "y"}}}),
        )
        .unwrap();
        let view = ClusterView::build(&[], &[], &[node.metadata], &[]).unwrap();
        let nv = view.node("cpu").unwrap();
        assert!(!nv.has_topology);
        assert_eq!(nv.labels["x"], "y");
    }

    /// Devices held by allocated claims of our drivers are used on the node the pool names,
    /// for the DRA class and the extended resource alike; a hold on a node or device the view
    /// does not have is a warning; each node offers the class of its devices.
    #[test]
    fn devices_held_by_allocated_claims_are_not_free() {
        use crate::core::claims::testing::{ascend_node, claim};
        const NPU: &str = "npu.fumarole.dev";
        let claims = Claims::new(&[
            claim("a", NPU, 2, Some(("a", &[0, 5]))),
            claim("pending", NPU, 1, None),
            claim("elsewhere", NPU, 1, Some(("ghost", &[1]))),
            claim("odd", NPU, 1, Some(("b", &[9]))),
            // Another driver's results never count.
            claim("nic", "nic.example.com", 1, Some(("b", &[1]))),
        ]);
        let view = ClusterView::build_with_jobs(
            &mut ContextCache::default(),
            &[ascend_node("a"), ascend_node("b"), dt("g", 2, 10, &[])],
            &[],
            &[],
            &[],
            claims,
            crate::core::unit::JobSources::default(),
        )
        .unwrap();
        assert_eq!(view.free("a", NPU), vec![1, 2, 3, 4, 6, 7]);
        assert_eq!(
            view.free("a", "huawei.com/Ascend910"),
            vec![1, 2, 3, 4, 6, 7]
        );
        assert_eq!(view.free("b", NPU), (0..8).collect::<Vec<_>>());
        assert_eq!(view.free("g", NPU), Vec::<usize>::new());
        assert_eq!(view.free("g", "gpu.fumarole.dev"), vec![0, 1]);
        let offered = view.resources();
        assert!(offered.contains(NPU) && offered.contains("gpu.fumarole.dev"));
        assert_eq!(view.warnings().len(), 2, "{:?}", view.warnings());
        assert!(
            view.warnings()
                .iter()
                .any(|w| w.contains("ml/elsewhere") && w.contains("ghost"))
        );
        assert!(
            view.warnings()
                .iter()
                .any(|w| w.contains("ml/odd") && w.contains("huawei-9"))
        );
        // The same view without claims: everything free.
        let plain = ClusterView::build(&[ascend_node("a")], &[], &[], &[]).unwrap();
        assert_eq!(plain.free("a", NPU).len(), 8);
    }

    /// A claim holding partitions (vNPUs of chips 2 and 1) holds their chips: neither is free
    /// whole, and no warning is given (the device names match no whole device).
    #[test]
    fn a_held_partition_holds_its_device() {
        use crate::core::claims::testing::{ascend_node, claim};
        const NPU: &str = "npu.fumarole.dev";
        let mut c = claim("vnpu", NPU, 2, Some(("a", &[2])));
        let results = c
            .status
            .as_mut()
            .and_then(|s| s.allocation.as_mut())
            .and_then(|a| a.devices.as_mut())
            .and_then(|d| d.results.as_mut())
            .unwrap();
        results[0].device = "huawei-2-vir04-1".into();
        let mut other = results[0].clone();
        other.device = "huawei-1-vir02-0".into();
        results.push(other);
        let view = ClusterView::build_with_jobs(
            &mut ContextCache::default(),
            &[ascend_node("a")],
            &[],
            &[],
            &[],
            Claims::new(&[c]),
            crate::core::unit::JobSources::default(),
        )
        .unwrap();
        assert_eq!(view.free("a", NPU), vec![0, 3, 4, 5, 6, 7]);
        assert!(view.warnings().is_empty(), "{:?}", view.warnings());
    }

    /// An sp-block job's total counts the NPUs of its unfinished pods in the view: three pods
    /// of 8 with `sp-block: 16` are refused, a fourth makes whole blocks.
    #[test]
    fn sp_block_job_totals_come_from_the_view() {
        use crate::core::request::{RequestError, pod_request};
        let worker = |i: u32, phase: &str| -> Pod {
            let annotations = if i == 0 {
                serde_json::json!({"sp-block": "16"})
            } else {
                serde_json::json!({})
            };
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": format!("sp-worker-{i}"), "namespace": "ml",
                             "labels": {"volcano.sh/job-name": "sp", "volcano.sh/task-spec": "worker"},
                             "annotations": annotations},
                "spec": {"containers": [{"name": "c",
                    "resources": {"limits": {"huawei.com/Ascend910": "8"}}}]},
                "status": {"phase": phase}
            }))
            .unwrap()
        };
        let nodes = [fumarole_topology::crd::testing::atlas_800_910("a", &[])];
        let three = [
            worker(0, "Pending"),
            worker(1, "Pending"),
            worker(2, "Pending"),
        ];
        let view = ClusterView::build(&nodes, &[], &[], &three).unwrap();
        let e = pod_request(&three[1], &view.resources(), view.jobs()).unwrap_err();
        assert!(
            matches!(&e, RequestError::Unit { .. })
                && e.to_string().contains(
                    "job ml/sp requests 24 devices in all (pods seen so far), not a multiple of sp-block = 16"
                ),
            "{e}"
        );
        // A finished pod does not count; a fourth pending one makes two blocks.
        let mut four = three.to_vec();
        four.push(worker(3, "Failed"));
        let view = ClusterView::build(&nodes, &[], &[], &four).unwrap();
        assert!(pod_request(&four[1], &view.resources(), view.jobs()).is_err());
        four[3] = worker(3, "Pending");
        let view = ClusterView::build(&nodes, &[], &[], &four).unwrap();
        let req = pod_request(&four[1], &view.resources(), view.jobs()).unwrap();
        let g = req.unit.unwrap();
        assert_eq!(
            (g.spec.group_size, g.spec.unit, g.spec.super_pod),
            (16, 0, true)
        );
    }

    /// Huawei's default with `--whole-job-super-pod`: a job of several Ascend pods without any
    /// group annotation is one block of all its NPUs, every pod in block 0 (also while only
    /// some of its pods are in the view); off, or for one pod, GPUs, or an `sp-block` job, it
    /// changes nothing.
    #[test]
    fn whole_job_super_pod_makes_one_block_of_an_unannotated_ascend_job() {
        use crate::core::request::pod_request;
        use crate::core::unit::JobSources;
        let pod = |job: &str, i: u32, resource: &str, annotations: serde_json::Value| -> Pod {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": format!("{job}-worker-{i}"), "namespace": "ml",
                             "labels": {"volcano.sh/job-name": job, "volcano.sh/task-spec": "worker"},
                             "annotations": {"volcano.sh/task-index": i.to_string()}},
                "spec": {"containers": [{"name": "c",
                    "resources": {"limits": {resource: "8"}}}]},
                "status": {"phase": "Pending"}
            }))
            .map(|mut p: Pod| {
                if let (Some(a), Some(extra)) =
                    (p.metadata.annotations.as_mut(), annotations.as_object())
                {
                    for (k, v) in extra {
                        a.insert(k.clone(), v.as_str().unwrap().to_string());
                    }
                }
                p
            })
            .unwrap()
        };
        let npu = "huawei.com/Ascend910";
        let build = |pods: &[Pod], on: bool| {
            let facts: Vec<PodFacts> = pods.iter().map(PodFacts::of).collect();
            let nodes = [
                fumarole_topology::crd::testing::atlas_800_910("a", &[]),
                fumarole_topology::crd::testing::nvlink_node("g", 8, 10, &[], |i| format!("g-{i}")),
            ];
            ClusterView::build_with_jobs(
                &mut ContextCache::default(),
                &nodes,
                &[],
                &[],
                &facts,
                Claims::default(),
                JobSources {
                    whole_job_super_pod: on,
                    ..JobSources::default()
                },
            )
            .unwrap()
        };
        let group = |view: &ClusterView, p: &Pod| {
            pod_request(p, &view.resources(), view.jobs())
                .unwrap()
                .unit
                .map(|g| {
                    (
                        g.spec.atomic_size,
                        g.spec.unit,
                        g.spec.atomic_unit,
                        g.spec.super_pod,
                    )
                })
        };
        let job: Vec<Pod> = (0..4)
            .map(|i| pod("big", i, npu, serde_json::json!({})))
            .collect();
        let view = build(&job, true);
        for p in &job {
            assert_eq!(group(&view, p), Some((32, 0, 0, true)));
            assert!(view.jobs().in_unit(p));
        }
        assert_eq!(group(&build(&job, false), &job[3]), None);
        // Only ranks 2 and 3 seen so far: still one block, of what is seen.
        let view = build(&job[2..], true);
        assert_eq!(group(&view, &job[3]), Some((16, 0, 0, true)));
        // One pod is no super-pod job.
        let view = build(&job[..1], true);
        assert_eq!(group(&view, &job[0]), None);
        // GPUs are not Ascend.
        let gpus: Vec<Pod> = (0..2)
            .map(|i| pod("gpu", i, "nvidia.com/gpu", serde_json::json!({})))
            .collect();
        assert_eq!(group(&build(&gpus, true), &gpus[1]), None);
        // An sp-block job keeps its blocks.
        let sp: Vec<Pod> = (0..4)
            .map(|i| pod("sp", i, npu, serde_json::json!({"sp-block": "16"})))
            .collect();
        assert_eq!(group(&build(&sp, true), &sp[3]), Some((16, 1, 1, true)));
    }

    /// `sp-block` and `sp-fit` on a Volcano Job reach its pods through the PodGroup the pods
    /// name: each pod's unit follows from them; a pod's own `sp-block` wins for that pod, and
    /// when it differs the job's other pods are refused with the disagreement.
    #[test]
    fn pod_group_sp_block_holds_for_pods_without_their_own() {
        use crate::core::request::pod_request;
        use crate::core::unit::{JobSources, PodGroupSizes};
        let worker = |i: u32, own: serde_json::Value| -> Pod {
            let mut annotations = serde_json::json!({
                "scheduling.k8s.io/group-name": "sp-1234",
                "volcano.sh/task-index": i.to_string()});
            if let (Some(a), Some(own)) = (annotations.as_object_mut(), own.as_object()) {
                a.extend(own.clone());
            }
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": format!("sp-worker-{i}"), "namespace": "ml",
                             "labels": {"volcano.sh/job-name": "sp", "volcano.sh/task-spec": "worker"},
                             "annotations": annotations},
                "spec": {"containers": [{"name": "c",
                    "resources": {"limits": {"huawei.com/Ascend910": "8"}}}]},
                "status": {"phase": "Pending"}
            }))
            .unwrap()
        };
        let build = |pods: &[Pod], group: serde_json::Value| {
            let annotations: BTreeMap<String, String> = serde_json::from_value(group).unwrap();
            let sources = JobSources {
                pod_groups: PodGroupSizes::new([("ml", "sp-1234", &annotations)]),
                ..JobSources::default()
            };
            let facts: Vec<PodFacts> = pods.iter().map(PodFacts::of).collect();
            let nodes = [fumarole_topology::crd::testing::atlas_800_910("a", &[])];
            ClusterView::build_with_jobs(
                &mut ContextCache::default(),
                &nodes,
                &[],
                &[],
                &facts,
                Claims::default(),
                sources,
            )
            .unwrap()
        };
        let plain: Vec<Pod> = (0..4).map(|i| worker(i, serde_json::json!({}))).collect();
        let view = build(
            &plain,
            serde_json::json!({"sp-block": "16", "sp-fit": "idlest", "other": "x"}),
        );
        let specs: Vec<(u32, u32, bool, bool)> = plain
            .iter()
            .map(|p| {
                let g = pod_request(p, &view.resources(), view.jobs())
                    .unwrap()
                    .unit
                    .unwrap();
                (
                    g.spec.rank,
                    g.spec.atomic_unit,
                    g.spec.super_pod,
                    g.spec.idlest,
                )
            })
            .collect();
        assert_eq!(
            specs,
            [
                (0, 0, true, true),
                (1, 0, true, true),
                (2, 1, true, true),
                (3, 1, true, true)
            ]
        );
        // Without the PodGroup's sp-block the pods are in no group.
        let view = build(&plain, serde_json::json!({"sp-fit": "idlest"}));
        assert!(
            pod_request(&plain[0], &view.resources(), view.jobs())
                .unwrap()
                .unit
                .is_none()
        );
        // A pod's own value wins for it; the others cannot tell which holds.
        let mut mixed = plain.clone();
        mixed[0] = worker(0, serde_json::json!({"sp-block": "32"}));
        let view = build(&mixed, serde_json::json!({"sp-block": "16"}));
        let own = pod_request(&mixed[0], &view.resources(), view.jobs())
            .unwrap()
            .unit
            .unwrap();
        assert_eq!(own.spec.atomic_size, 32);
        let e = pod_request(&mixed[1], &view.resources(), view.jobs()).unwrap_err();
        assert!(
            e.to_string()
                .contains("pods of job ml/sp disagree on their group annotations"),
            "{e}"
        );
        // A pod asked about before the view holds any pod of its job (a scheduler may be
        // quicker than the pod watch) still gets its PodGroup's sp-block.
        let view = build(&[], serde_json::json!({"sp-block": "16"}));
        let first = pod_request(&plain[2], &view.resources(), view.jobs())
            .unwrap()
            .unit
            .unwrap();
        assert_eq!(
            (
                first.spec.atomic_size,
                first.spec.atomic_unit,
                first.spec.super_pod
            ),
            (16, 1, true)
        );
        // A garbled PodGroup value is the job's reason.
        let view = build(&plain, serde_json::json!({"sp-block": "sixteen"}));
        let e = pod_request(&plain[1], &view.resources(), view.jobs()).unwrap_err();
        assert!(
            e.to_string()
                .contains("sp-block: \"sixteen\" is not a positive integer"),
            "{e}"
        );
    }
}
