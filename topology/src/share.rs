//! Sharing one accelerator among pods: one model, several mechanisms (issue 39).
//!
//! A physical device is offered in one of four ways ([`Offer`]): whole; as time-sliced replicas
//! (nothing isolates them); as MPS clients, each with a pinned-memory limit and an
//! active-thread share that NVIDIA's MPS control daemon enforces; or as hardware partitions
//! (NVIDIA MIG instances, Ascend vNPUs) that consume the device's compute and memory slices.
//! A pod asks with the resource names users already write ([`Ask::read`]): replicas of
//! `nvidia.com/gpu` (or `nvidia.com/gpu.shared` with `renameByDefault`), `nvidia.com/mig-<profile>`,
//! `huawei.com/Ascend910-<template>` and the other vNPU names; Volcano's vGPU resources are
//! recognised and refused with a reason, not silently read as something else.
//! [`DeviceUse`] counts what one device has given, so no share is given twice and no share
//! lands on a device a whole-device pod holds.
//!
//! What enforces what: MIG and vNPU partitions are enforced by the hardware; an MPS client's
//! memory limit and thread share by NVIDIA's MPS daemon (`set_default_device_pinned_mem_limit`,
//! `set_default_active_thread_percentage` on its control pipe); time-sliced replicas by nothing
//! (every replica sees the whole device and its whole memory).

use serde::Deserialize;

/// Compute and memory slices of one device, or what a partition consumes of them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Slices {
    /// MIG compute slices (7 per A100/H100), Ascend AI cores.
    pub compute: u32,
    /// MIG memory slices (8 per A100/H100); for Ascend, MiB of device memory.
    pub memory: u32,
}

impl Slices {
    fn fits_in(self, free: Slices) -> bool {
        self.compute <= free.compute && self.memory <= free.memory
    }
}

/// One kind of hardware partition: a MIG profile (`1g.10gb`) or an Ascend vNPU template
/// (`vir02`), with the resource name it is advertised as.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Profile {
    /// As the vendor's tools write it: `1g.10gb`, `vir02`, `vir06_1c_16g`.
    pub name: &'static str,
    /// The extended resource a pod asks for it with.
    pub resource: &'static str,
    pub uses: Slices,
    /// Most instances of it one device holds (NVIDIA's table: `1g.10gb+me` once, say).
    pub max: u32,
}

/// A device model's partitions, and the slices the device has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Catalogue {
    /// Models it applies to, matched as a prefix of [`crate::Device::model`] after the
    /// vendor's name (`A100-SXM4-80GB`, `H100 80GB`), case-insensitively.
    pub models: &'static [&'static str],
    pub total: Slices,
    pub profiles: &'static [Profile],
    /// Partitions sit at fixed places (MIG: a GPU instance starts on a memory slice aligned
    /// to its size, [`Catalogue::placements`]); otherwise they are counted only (vNPU).
    pub placed: bool,
}

const fn partition(
    name: &'static str,
    resource: &'static str,
    compute: u32,
    memory: u32,
    max: u32,
) -> Profile {
    Profile {
        name,
        resource,
        uses: Slices { compute, memory },
        max,
    }
}

/// MIG profiles (NVIDIA's MIG user guide and mig-parted's per-model counts: 7 compute and 8
/// memory slices per GPU). Only profiles whose compute instance is the whole GPU instance:
/// those are what the device plugin's `mixed` strategy advertises.
pub const MIG_CATALOGUES: &[Catalogue] = &[
    Catalogue {
        models: &["A100-SXM4-40GB", "A100-PCIE-40GB", "A100 40GB"],
        placed: true,
        total: Slices {
            compute: 7,
            memory: 8,
        },
        profiles: &[
            partition("1g.5gb", "nvidia.com/mig-1g.5gb", 1, 1, 7),
            partition("1g.5gb+me", "nvidia.com/mig-1g.5gb.me", 1, 1, 1),
            partition("1g.10gb", "nvidia.com/mig-1g.10gb", 1, 2, 4),
            partition("2g.10gb", "nvidia.com/mig-2g.10gb", 2, 2, 3),
            partition("3g.20gb", "nvidia.com/mig-3g.20gb", 3, 4, 2),
            partition("4g.20gb", "nvidia.com/mig-4g.20gb", 4, 4, 1),
            partition("7g.40gb", "nvidia.com/mig-7g.40gb", 7, 8, 1),
        ],
    },
    Catalogue {
        models: &[
            "A100-SXM4-80GB",
            "A100 80GB",
            "A800",
            "H100 80GB",
            "H100-SXM5-80GB",
            "H800",
        ],
        placed: true,
        total: Slices {
            compute: 7,
            memory: 8,
        },
        profiles: &[
            partition("1g.10gb", "nvidia.com/mig-1g.10gb", 1, 1, 7),
            partition("1g.10gb+me", "nvidia.com/mig-1g.10gb.me", 1, 1, 1),
            partition("1g.20gb", "nvidia.com/mig-1g.20gb", 1, 2, 4),
            partition("2g.20gb", "nvidia.com/mig-2g.20gb", 2, 2, 3),
            partition("3g.40gb", "nvidia.com/mig-3g.40gb", 3, 4, 2),
            partition("4g.40gb", "nvidia.com/mig-4g.40gb", 4, 4, 1),
            partition("7g.80gb", "nvidia.com/mig-7g.80gb", 7, 8, 1),
        ],
    },
];

/// Ascend static vNPU templates (MindCluster's documentation; memory in MiB, from the `_Ng`
/// suffix or, for the templates that carry none, HAMi's Ascend configuration). The device
/// plugin advertises each as `huawei.com/<type>`. The most of one template per chip is
/// derived (the chip's AI cores over the template's), not quoted. The 910B comes first: its
/// model name starts with the 910's.
pub const VNPU_CATALOGUES: &[Catalogue] = &[
    Catalogue {
        models: &["Ascend910B"],
        placed: false,
        total: Slices {
            compute: 24,
            memory: 65536,
        },
        profiles: &[
            partition(
                "vir06_1c_16g",
                "huawei.com/Ascend910-6c.1cpu.16g",
                6,
                16384,
                4,
            ),
            partition(
                "vir12_3c_32g",
                "huawei.com/Ascend910-12c.3cpu.32g",
                12,
                32768,
                2,
            ),
        ],
    },
    Catalogue {
        models: &["Ascend910A", "Ascend910"],
        placed: false,
        total: Slices {
            compute: 30,
            memory: 32768,
        },
        profiles: &[
            partition("vir02", "huawei.com/Ascend910-2c", 2, 2184, 15),
            partition("vir04", "huawei.com/Ascend910-4c", 4, 4369, 7),
            partition("vir08", "huawei.com/Ascend910-8c", 8, 8738, 3),
            partition("vir16", "huawei.com/Ascend910-16c", 16, 17476, 1),
        ],
    },
    Catalogue {
        models: &["Ascend310P"],
        placed: false,
        total: Slices {
            compute: 8,
            memory: 24576,
        },
        profiles: &[
            partition("vir01", "huawei.com/Ascend310P-1c", 1, 3072, 8),
            partition("vir02", "huawei.com/Ascend310P-2c", 2, 6144, 4),
            partition("vir04", "huawei.com/Ascend310P-4c", 4, 12288, 2),
        ],
    },
];

/// The resource NVIDIA's `mixed` MIG strategy advertises a MIG profile as:
/// `nvidia.com/mig-1g.10gb`, and `nvidia.com/mig-1g.10gb.me` for `1g.10gb+me` (the MIG
/// catalogues' `resource` follow it).
pub fn mig_resource(profile: &str) -> String {
    format!("nvidia.com/mig-{}", profile.replace('+', "."))
}

impl Catalogue {
    /// The catalogue for a device's model name (`"NVIDIA A100-SXM4-80GB"`, `"Ascend910B"`).
    pub fn for_model(model: &str) -> Option<&'static Catalogue> {
        let bare = model
            .strip_prefix("NVIDIA ")
            .unwrap_or(model)
            .to_ascii_lowercase();
        MIG_CATALOGUES.iter().chain(VNPU_CATALOGUES).find(|c| {
            c.models
                .iter()
                .any(|m| bare.starts_with(&m.to_ascii_lowercase()))
        })
    }

    pub fn profile(&self, name: &str) -> Option<&'static Profile> {
        self.profiles.iter().find(|p| p.name == name)
    }

    /// Where partitions of `p` may start: for a placed catalogue (MIG) the first memory
    /// slice of each GPU instance, aligned to the profile's memory slices and holding its
    /// compute slices (the compute slices are the first `total.compute` memory slices' worth:
    /// 7 of 8 on A100/H100, so a 1g instance never starts on slice 7 and a 4g only on 0). This
    /// gives NVIDIA's placements (`nvidia-smi mig -lgipp`: 1g.10gb `{0..6}:1`, 2g.20gb
    /// `{0,2,4}:2`, 3g.40gb `{0,4}:4`, 4g.40gb and 7g.80gb `{0}`), and as many as the profile's
    /// `max` (a unit test holds the two to each other). Unplaced (vNPU): instances `0..max`.
    pub fn placements(&self, p: &Profile) -> Vec<u32> {
        if !self.placed {
            return (0..p.max).collect();
        }
        let size = p.uses.memory.max(1);
        (0..self.total.memory)
            .step_by(size as usize)
            .filter(|start| start + size <= self.total.memory)
            .filter(|start| {
                let compute_slots = self.total.compute.min(start + size).saturating_sub(*start);
                compute_slots >= p.uses.compute
            })
            .collect()
    }

    fn by_resource(resource: &str) -> Option<&'static Profile> {
        MIG_CATALOGUES
            .iter()
            .chain(VNPU_CATALOGUES)
            .flat_map(|c| c.profiles)
            .find(|p| p.resource == resource)
    }
}

/// How one physical device is offered.
#[derive(Clone, Debug, PartialEq)]
pub enum Offer {
    Whole,
    /// `replicas` time-sliced replicas: no memory or compute isolation.
    TimeSliced {
        replicas: u32,
    },
    /// `clients` MPS clients, each limited to `memory_limit_bytes` of pinned device memory
    /// and `thread_percentage` % of the SMs by the MPS control daemon.
    Mps {
        clients: u32,
        memory_limit_bytes: u64,
        thread_percentage: u32,
    },
    /// Hardware partitions from the device's catalogue.
    Partitioned(&'static Catalogue),
}

impl Offer {
    /// MPS as NVIDIA's daemon sets it up for a device of `memory_bytes`: each client gets an
    /// equal part of the memory (rounded down to MiB) and `100 / clients` % of the threads.
    pub fn mps(clients: u32, memory_bytes: u64) -> Offer {
        let mib = memory_bytes / u64::from(clients.max(1)) / (1 << 20);
        Offer::Mps {
            clients,
            memory_limit_bytes: mib << 20,
            thread_percentage: 100 / clients.max(1),
        }
    }
}

/// What a pod asks for, read from one extended resource of its containers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ask {
    /// `count` whole devices.
    Whole { count: u64 },
    /// `count` time-sliced or MPS replicas.
    Replicas { count: u64 },
    /// `count` partitions of `profile`.
    Partitions {
        profile: &'static Profile,
        count: u64,
    },
}

/// How the node's NVIDIA device plugin names shared replicas (its sharing config).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Naming {
    /// Replicas are advertised (`nvidia.com/gpu` or `nvidia.com/gpu.shared`).
    pub replicated: bool,
    /// `renameByDefault`: replicas are `<name>.shared`.
    pub rename_by_default: bool,
}

/// Why a pod's ask cannot be read or met.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ShareError {
    #[error(
        "{resource}: Volcano's vGPU resources (HAMi-core interception) are not served by \
         fumarole; ask for MPS replicas or a MIG profile instead"
    )]
    VgpuUnsupported { resource: String },
    #[error(
        "{resource}: more than one shared replica per container is refused \
             (failRequestsGreaterThanOne), asked {count}"
    )]
    MoreThanOneReplica { resource: String, count: u64 },
    #[error("{profile} is not a partition of {model}")]
    UnknownProfile { profile: String, model: String },
    #[error(
        "{profile}: the device has {free_compute} compute and {free_memory} memory slices \
             free, {max_left} more of this profile allowed; asked {count}"
    )]
    DoesNotFit {
        profile: String,
        count: u64,
        free_compute: u32,
        free_memory: u32,
        max_left: u32,
    },
    #[error("the device is held whole")]
    HeldWhole,
    #[error("the device is shared ({shares} shares held); a whole-device pod cannot have it")]
    Shared { shares: u32 },
    #[error("no replica left: {held} of {offered} held")]
    NoReplicaLeft { held: u32, offered: u32 },
    #[error("the device offers {offer}; asked for {asked}")]
    WrongOffer {
        offer: &'static str,
        asked: &'static str,
    },
}

impl Ask {
    /// The ask behind `count` of `resource` under the node's `naming`; `None`: not a device
    /// resource fumarole shares (cpu, memory, another vendor's name).
    pub fn read(resource: &str, count: u64, naming: Naming) -> Option<Result<Ask, ShareError>> {
        if resource.starts_with("volcano.sh/vgpu-") {
            return Some(Err(ShareError::VgpuUnsupported {
                resource: resource.into(),
            }));
        }
        if let Some(profile) = Catalogue::by_resource(resource) {
            return Some(Ok(Ask::Partitions { profile, count }));
        }
        let replicas = match resource {
            "nvidia.com/gpu.shared" => naming.replicated && naming.rename_by_default,
            "nvidia.com/gpu" => naming.replicated && !naming.rename_by_default,
            _ => false,
        };
        if replicas {
            return Some(Ok(Ask::Replicas { count }));
        }
        is_whole_device_resource(resource).then_some(Ok(Ask::Whole { count }))
    }
}

fn is_whole_device_resource(resource: &str) -> bool {
    matches!(
        resource,
        "nvidia.com/gpu" | "metax-tech.com/gpu" | "amd.com/gpu" | "huawei.com/npu"
    ) || resource
        .strip_prefix("huawei.com/Ascend")
        .is_some_and(|model| !model.contains('-'))
}

/// What one physical device has given, checked against its [`Offer`].
#[derive(Clone, Debug, PartialEq)]
pub struct DeviceUse {
    offer: Offer,
    whole: bool,
    replicas: u32,
    /// (profile name, instances) held.
    partitions: Vec<(&'static str, u32)>,
}

impl DeviceUse {
    pub fn new(offer: Offer) -> Self {
        DeviceUse {
            offer,
            whole: false,
            replicas: 0,
            partitions: Vec::new(),
        }
    }

    /// Shares (replicas or partitions) held now.
    pub fn shares(&self) -> u32 {
        self.replicas + self.partitions.iter().map(|(_, n)| n).sum::<u32>()
    }

    /// Slices the held partitions use.
    pub fn used(&self) -> Slices {
        let Offer::Partitioned(c) = &self.offer else {
            return Slices::default();
        };
        self.partitions
            .iter()
            .filter_map(|(name, n)| Some((c.profile(name)?, n)))
            .fold(Slices::default(), |s, (p, n)| Slices {
                compute: s.compute + p.uses.compute * n,
                memory: s.memory + p.uses.memory * n,
            })
    }

    /// Takes `ask` of this device (one device's part of it: a whole device, `count` replicas
    /// or partitions), or says why not; nothing changes on an error.
    pub fn take(&mut self, ask: Ask) -> Result<(), ShareError> {
        if self.whole {
            return Err(ShareError::HeldWhole);
        }
        match (ask, &self.offer) {
            (Ask::Whole { .. }, _) if self.shares() > 0 => Err(ShareError::Shared {
                shares: self.shares(),
            }),
            (Ask::Whole { .. }, _) => {
                self.whole = true;
                Ok(())
            }
            (Ask::Replicas { count }, Offer::TimeSliced { replicas: offered })
            | (
                Ask::Replicas { count },
                Offer::Mps {
                    clients: offered, ..
                },
            ) => {
                let offered = *offered;
                let left = offered - self.replicas.min(offered);
                match u32::try_from(count) {
                    Ok(n) if n <= left => {
                        self.replicas += n;
                        Ok(())
                    }
                    _ => Err(ShareError::NoReplicaLeft {
                        held: self.replicas,
                        offered,
                    }),
                }
            }
            (Ask::Partitions { profile, count }, Offer::Partitioned(c)) => {
                let Some(p) = c
                    .profile(profile.name)
                    .filter(|p| p.resource == profile.resource)
                else {
                    return Err(ShareError::UnknownProfile {
                        profile: profile.name.into(),
                        model: c.models.first().copied().unwrap_or_default().into(),
                    });
                };
                let used = self.used();
                let free = Slices {
                    compute: c.total.compute.saturating_sub(used.compute),
                    memory: c.total.memory.saturating_sub(used.memory),
                };
                let held = self.held_of(p.name);
                let max_left = p.max.saturating_sub(held);
                let wanted = u32::try_from(count).ok().and_then(|n| {
                    let uses = Slices {
                        compute: p.uses.compute.checked_mul(n)?,
                        memory: p.uses.memory.checked_mul(n)?,
                    };
                    (n <= max_left && uses.fits_in(free)).then_some(n)
                });
                let Some(n) = wanted else {
                    return Err(ShareError::DoesNotFit {
                        profile: p.name.into(),
                        count,
                        free_compute: free.compute,
                        free_memory: free.memory,
                        max_left,
                    });
                };
                match self.partitions.iter_mut().find(|(name, _)| *name == p.name) {
                    Some((_, held)) => *held += n,
                    None => self.partitions.push((p.name, n)),
                }
                Ok(())
            }
            (ask, offer) => Err(ShareError::WrongOffer {
                offer: offer_name(offer),
                asked: ask_name(&ask),
            }),
        }
    }

    /// Gives back what [`Self::take`] took for `ask` (what is not held is ignored).
    pub fn release(&mut self, ask: Ask) {
        match ask {
            Ask::Whole { .. } => self.whole = false,
            Ask::Replicas { count } => {
                self.replicas = self
                    .replicas
                    .saturating_sub(u32::try_from(count).unwrap_or(u32::MAX));
            }
            Ask::Partitions { profile, count } => {
                let n = u32::try_from(count).unwrap_or(u32::MAX);
                for (name, held) in &mut self.partitions {
                    if *name == profile.name {
                        *held = held.saturating_sub(n);
                    }
                }
                self.partitions.retain(|(_, held)| *held > 0);
            }
        }
    }

    fn held_of(&self, profile: &str) -> u32 {
        self.partitions
            .iter()
            .find(|(name, _)| *name == profile)
            .map_or(0, |(_, n)| *n)
    }
}

fn offer_name(offer: &Offer) -> &'static str {
    match offer {
        Offer::Whole => "whole use only",
        Offer::TimeSliced { .. } => "time-sliced replicas",
        Offer::Mps { .. } => "MPS clients",
        Offer::Partitioned(_) => "hardware partitions",
    }
}

fn ask_name(ask: &Ask) -> &'static str {
    match ask {
        Ask::Whole { .. } => "whole devices",
        Ask::Replicas { .. } => "replicas",
        Ask::Partitions { .. } => "a partition",
    }
}

// --- Replica ids --------------------------------------------------------------------------------

/// What separates a device's id from its replica number in a replica's id (`<uuid>::<n>`,
/// NVIDIA's "annotated ids", which tools reading PodResources already know).
pub const REPLICA_SEPARATOR: &str = "::";

/// The id the kubelet sees for replica `n` of device `device`.
pub fn replica_id(device: &str, n: u32) -> String {
    format!("{device}{REPLICA_SEPARATOR}{n}")
}

/// The device and replica number of a replica id; `None` for an id without a replica number.
pub fn replica_of(id: &str) -> Option<(&str, u32)> {
    let (device, n) = id.rsplit_once(REPLICA_SEPARATOR)?;
    Some((device, n.parse().ok()?))
}

// --- NVIDIA's device-plugin sharing configuration ------------------------------------------------

/// The `sharing` part of NVIDIA's k8s-device-plugin configuration file (`version: v1`), with
/// its keys as that project writes them.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SharingConfig {
    #[serde(default)]
    pub time_slicing: Option<Replicated>,
    #[serde(default)]
    pub mps: Option<Replicated>,
}

/// `sharing.timeSlicing` / `sharing.mps`.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Replicated {
    #[serde(default)]
    pub rename_by_default: bool,
    /// Unset: false for time-slicing, true for MPS (as NVIDIA's plugin since v0.20.0).
    #[serde(default)]
    pub fail_requests_greater_than_one: Option<bool>,
    #[serde(default)]
    pub resources: Vec<ReplicatedResource>,
}

#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ReplicatedResource {
    pub name: String,
    pub replicas: u32,
    /// Accepted and ignored, as NVIDIA's plugin does (it logs that renaming per resource is not
    /// supported).
    #[serde(default)]
    pub rename: Option<String>,
    /// Only `all` (NVIDIA's plugin forces it).
    #[serde(default)]
    pub devices: Option<serde_json::Value>,
}

/// The node's sharing, as [`SharingConfig::resolve`] reads it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Strategy {
    None,
    TimeSlicing { replicas: u32 },
    Mps { replicas: u32 },
}

/// A sharing configuration that contradicts itself or NVIDIA's rules.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error("sharing: timeSlicing and mps are both set; a node uses one strategy")]
    BothStrategies,
    #[error("sharing.{strategy}: no resources specified")]
    NoResources { strategy: &'static str },
    #[error("sharing.{strategy}: {resource}: number of replicas must be >= 2, got {replicas}")]
    TooFewReplicas {
        strategy: &'static str,
        resource: String,
        replicas: u32,
    },
    #[error("sharing.mps: {resource}: at most {max} replicas per GPU, got {replicas}")]
    TooManyMpsReplicas {
        resource: String,
        replicas: u32,
        max: u32,
    },
    #[error("sharing.{strategy}: only nvidia.com/gpu is shared by fumarole, not {resource}")]
    UnsupportedResource {
        strategy: &'static str,
        resource: String,
    },
    #[error(
        "sharing.{strategy}: {resource}: devices must be \"all\" (per-device sharing is not supported)"
    )]
    PerDevice {
        strategy: &'static str,
        resource: String,
    },
}

/// Most MPS clients per GPU of compute capability 7.5 or later (NVIDIA's limit; 16 before).
pub const MPS_MAX_CLIENTS: u32 = 48;

impl SharingConfig {
    /// The strategy, the replica naming and whether a container may ask more than one
    /// replica; an error for a configuration NVIDIA's plugin would refuse (or one fumarole
    /// cannot honour, said so).
    pub fn resolve(&self) -> Result<(Strategy, Naming, bool), ConfigError> {
        let (strategy, config) = match (&self.time_slicing, &self.mps) {
            (Some(_), Some(_)) => return Err(ConfigError::BothStrategies),
            (Some(t), None) => ("timeSlicing", t),
            (None, Some(m)) => ("mps", m),
            (None, None) => return Ok((Strategy::None, Naming::default(), false)),
        };
        let [resource] = config.resources.as_slice() else {
            return Err(match config.resources.first() {
                None => ConfigError::NoResources { strategy },
                Some(_) => ConfigError::UnsupportedResource {
                    strategy,
                    resource: config
                        .resources
                        .iter()
                        .map(|r| r.name.as_str())
                        .filter(|n| *n != "nvidia.com/gpu")
                        .collect::<Vec<_>>()
                        .join(", "),
                },
            });
        };
        if resource.name != "nvidia.com/gpu" {
            return Err(ConfigError::UnsupportedResource {
                strategy,
                resource: resource.name.clone(),
            });
        }
        if resource
            .devices
            .as_ref()
            .is_some_and(|d| d.as_str() != Some("all"))
        {
            return Err(ConfigError::PerDevice {
                strategy,
                resource: resource.name.clone(),
            });
        }
        let replicas = resource.replicas;
        if replicas < 2 {
            return Err(ConfigError::TooFewReplicas {
                strategy,
                resource: resource.name.clone(),
                replicas,
            });
        }
        let mps = self.mps.is_some();
        if mps && replicas > MPS_MAX_CLIENTS {
            return Err(ConfigError::TooManyMpsReplicas {
                resource: resource.name.clone(),
                replicas,
                max: MPS_MAX_CLIENTS,
            });
        }
        let naming = Naming {
            replicated: true,
            rename_by_default: config.rename_by_default,
        };
        let one_each = config.fail_requests_greater_than_one.unwrap_or(mps);
        let strategy = if mps {
            Strategy::Mps { replicas }
        } else {
            Strategy::TimeSlicing { replicas }
        };
        Ok((strategy, naming, one_each))
    }
}

/// `ask` checked against `failRequestsGreaterThanOne` (`one_each`) for `resource`.
pub fn check_replica_count(resource: &str, ask: Ask, one_each: bool) -> Result<Ask, ShareError> {
    match ask {
        Ask::Replicas { count } if one_each && count > 1 => Err(ShareError::MoreThanOneReplica {
            resource: resource.into(),
            count,
        }),
        ask => Ok(ask),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;

    fn h100() -> &'static Catalogue {
        Catalogue::for_model("NVIDIA H100 80GB HBM3").unwrap()
    }

    fn partitions(resource: &str, count: u64) -> Ask {
        Ask::read(resource, count, Naming::default())
            .unwrap()
            .unwrap()
    }

    #[test]
    fn mig_profiles_are_advertised_under_nvidias_mixed_names() {
        for p in MIG_CATALOGUES.iter().flat_map(|c| c.profiles) {
            assert_eq!(p.resource, mig_resource(p.name), "{}", p.name);
        }
        assert_eq!(mig_resource("1g.10gb+me"), "nvidia.com/mig-1g.10gb.me");
    }

    #[test]
    fn mig_placements_are_nvidias_and_as_many_as_the_table_allows() {
        let starts = |name: &str| h100().placements(h100().profile(name).unwrap());
        assert_eq!(starts("1g.10gb"), [0, 1, 2, 3, 4, 5, 6]);
        assert_eq!(starts("1g.20gb"), [0, 2, 4, 6]);
        assert_eq!(starts("2g.20gb"), [0, 2, 4]);
        assert_eq!(starts("3g.40gb"), [0, 4]);
        assert_eq!(starts("4g.40gb"), [0]);
        assert_eq!(starts("7g.80gb"), [0]);
        // Two sources, one answer: the placements derived from the slices and the table's
        // most instances per GPU (mig-parted's counts); `+me` is limited by its media engines.
        for c in MIG_CATALOGUES {
            for p in c.profiles.iter().filter(|p| !p.name.ends_with("+me")) {
                assert_eq!(c.placements(p).len() as u32, p.max, "{}", p.name);
            }
        }
        // vNPU templates are counted, not placed.
        let ascend = Catalogue::for_model("Ascend910B").unwrap();
        assert_eq!(ascend.placements(&ascend.profiles[0]), [0, 1, 2, 3]);
    }

    #[test]
    fn replica_ids_name_their_device() {
        let id = replica_id("GPU-1f6a", 3);
        assert_eq!(id, "GPU-1f6a::3");
        assert_eq!(replica_of(&id), Some(("GPU-1f6a", 3)));
        assert_eq!(replica_of("GPU-1f6a"), None);
        assert_eq!(replica_of("GPU-1f6a::x"), None);
        assert_eq!(replica_of("GPU-1f6a::-1"), None);
    }

    #[test]
    fn models_find_their_catalogue() {
        assert_eq!(
            h100().total,
            Slices {
                compute: 7,
                memory: 8
            }
        );
        let a100_40 = Catalogue::for_model("NVIDIA A100-SXM4-40GB").unwrap();
        assert_eq!(a100_40.profile("1g.10gb").unwrap().uses.memory, 2);
        assert_eq!(h100().profile("1g.10gb").unwrap().uses.memory, 1);
        assert_eq!(
            Catalogue::for_model("Ascend910B").unwrap().total.compute,
            24
        );
        assert_eq!(Catalogue::for_model("Ascend910").unwrap().total.compute, 30);
        assert!(Catalogue::for_model("NVIDIA GeForce RTX 4090").is_none());
    }

    #[test]
    fn users_resource_names_read_as_asks() {
        let plain = Naming::default();
        let shared = Naming {
            replicated: true,
            rename_by_default: false,
        };
        let renamed = Naming {
            replicated: true,
            rename_by_default: true,
        };
        let read = |r: &str, n: &Naming| Ask::read(r, 2, *n);
        assert_eq!(
            read("nvidia.com/gpu", &plain),
            Some(Ok(Ask::Whole { count: 2 }))
        );
        assert_eq!(
            read("nvidia.com/gpu", &shared),
            Some(Ok(Ask::Replicas { count: 2 }))
        );
        assert_eq!(
            read("nvidia.com/gpu", &renamed),
            Some(Ok(Ask::Whole { count: 2 }))
        );
        assert_eq!(
            read("nvidia.com/gpu.shared", &renamed),
            Some(Ok(Ask::Replicas { count: 2 }))
        );
        assert_eq!(
            read("nvidia.com/gpu.shared", &plain),
            None,
            "not advertised without renaming"
        );
        match partitions("nvidia.com/mig-3g.40gb", 1) {
            Ask::Partitions { profile, count: 1 } => assert_eq!(profile.name, "3g.40gb"),
            other => panic!("{other:?}"),
        }
        match partitions("huawei.com/Ascend910-6c.1cpu.16g", 1) {
            Ask::Partitions { profile, .. } => assert_eq!(profile.name, "vir06_1c_16g"),
            other => panic!("{other:?}"),
        }
        assert_eq!(
            read("huawei.com/Ascend910", &plain),
            Some(Ok(Ask::Whole { count: 2 }))
        );
        assert!(matches!(
            read("volcano.sh/vgpu-memory", &plain),
            Some(Err(ShareError::VgpuUnsupported { .. }))
        ));
        assert_eq!(read("cpu", &plain), None);
        assert_eq!(
            read("huawei.com/Ascend910-3c", &plain),
            None,
            "no such template"
        );
    }

    #[test]
    fn mig_profiles_fill_the_slices_and_never_overlap() {
        let mut d = DeviceUse::new(Offer::Partitioned(h100()));
        d.take(partitions("nvidia.com/mig-3g.40gb", 2)).unwrap();
        // 6 compute and 8 memory slices used: a 1g.10gb has compute but no memory left.
        let err = d.take(partitions("nvidia.com/mig-1g.10gb", 1)).unwrap_err();
        assert!(
            matches!(
                err,
                ShareError::DoesNotFit {
                    free_compute: 1,
                    free_memory: 0,
                    ..
                }
            ),
            "{err}"
        );
        assert_eq!(
            d.used(),
            Slices {
                compute: 6,
                memory: 8
            }
        );
        d.release(partitions("nvidia.com/mig-3g.40gb", 1));
        d.take(partitions("nvidia.com/mig-2g.20gb", 1)).unwrap();
        d.take(partitions("nvidia.com/mig-1g.10gb", 2)).unwrap();
        assert_eq!(
            d.used(),
            Slices {
                compute: 7,
                memory: 8
            }
        );
        assert_eq!(d.shares(), 4);
        // The most of one profile: 1g.10gb+me once.
        let mut e = DeviceUse::new(Offer::Partitioned(h100()));
        e.take(partitions("nvidia.com/mig-1g.10gb.me", 1)).unwrap();
        assert!(e.take(partitions("nvidia.com/mig-1g.10gb.me", 1)).is_err());
        // Another model's profile is refused by name.
        let mut f = DeviceUse::new(Offer::Partitioned(h100()));
        assert!(matches!(
            f.take(partitions("nvidia.com/mig-1g.5gb", 1)),
            Err(ShareError::UnknownProfile { .. })
        ));
        assert_eq!(f.shares(), 0);
    }

    #[test]
    fn replicas_are_counted_and_whole_use_excludes_shares() {
        let mut d = DeviceUse::new(Offer::TimeSliced { replicas: 4 });
        d.take(Ask::Replicas { count: 3 }).unwrap();
        assert_eq!(
            d.take(Ask::Replicas { count: 2 }),
            Err(ShareError::NoReplicaLeft {
                held: 3,
                offered: 4
            })
        );
        assert_eq!(
            d.take(Ask::Whole { count: 1 }),
            Err(ShareError::Shared { shares: 3 })
        );
        d.release(Ask::Replicas { count: 3 });
        d.take(Ask::Whole { count: 1 }).unwrap();
        assert_eq!(
            d.take(Ask::Replicas { count: 1 }),
            Err(ShareError::HeldWhole)
        );
        let mut w = DeviceUse::new(Offer::Whole);
        assert!(matches!(
            w.take(Ask::Replicas { count: 1 }),
            Err(ShareError::WrongOffer { .. })
        ));
        let mut t = DeviceUse::new(Offer::TimeSliced { replicas: 4 });
        assert!(t.take(Ask::Replicas { count: u64::MAX }).is_err());
        assert_eq!(t.shares(), 0);
    }

    #[test]
    fn mps_splits_memory_and_threads_evenly() {
        let o = Offer::mps(4, 80 << 30);
        assert_eq!(
            o,
            Offer::Mps {
                clients: 4,
                memory_limit_bytes: 20 << 30,
                thread_percentage: 25
            }
        );
        let Offer::Mps {
            thread_percentage, ..
        } = Offer::mps(3, 80 << 30)
        else {
            panic!()
        };
        assert_eq!(thread_percentage, 33);
    }

    fn config(yaml_json: &str) -> Result<(Strategy, Naming, bool), ConfigError> {
        serde_json::from_str::<SharingConfig>(yaml_json)
            .unwrap()
            .resolve()
    }

    #[test]
    fn nvidias_sharing_config_as_users_write_it() {
        let (s, n, one) =
            config(r#"{"timeSlicing":{"resources":[{"name":"nvidia.com/gpu","replicas":10}]}}"#)
                .unwrap();
        assert_eq!(s, Strategy::TimeSlicing { replicas: 10 });
        assert!(n.replicated && !n.rename_by_default && !one);
        let (s, n, one) = config(
            r#"{"mps":{"renameByDefault":true,"resources":[{"name":"nvidia.com/gpu","replicas":4}]}}"#,
        )
        .unwrap();
        assert_eq!(s, Strategy::Mps { replicas: 4 });
        assert!(
            n.rename_by_default && one,
            "MPS defaults to one replica per container"
        );
        let (_, _, one) = config(
            r#"{"mps":{"failRequestsGreaterThanOne":false,"resources":[{"name":"nvidia.com/gpu","replicas":4}]}}"#,
        )
        .unwrap();
        assert!(!one, "an explicit false is honoured");
        assert_eq!(config("{}").unwrap().0, Strategy::None);
    }

    #[test]
    fn contradictory_sharing_configs_are_refused() {
        let gpu =
            |n: u32| format!(r#"{{"resources":[{{"name":"nvidia.com/gpu","replicas":{n}}}]}}"#);
        assert_eq!(
            config(&format!(r#"{{"timeSlicing":{},"mps":{}}}"#, gpu(2), gpu(2))),
            Err(ConfigError::BothStrategies)
        );
        assert!(matches!(
            config(&format!(r#"{{"timeSlicing":{}}}"#, gpu(1))),
            Err(ConfigError::TooFewReplicas { replicas: 1, .. })
        ));
        assert!(matches!(
            config(&format!(r#"{{"mps":{}}}"#, gpu(49))),
            Err(ConfigError::TooManyMpsReplicas { .. })
        ));
        assert_eq!(
            config(r#"{"timeSlicing":{"resources":[]}}"#),
            Err(ConfigError::NoResources {
                strategy: "timeSlicing"
            })
        );
        assert!(matches!(
            config(
                r#"{"timeSlicing":{"resources":[{"name":"nvidia.com/gpu","replicas":2,"devices":[0]}]}}"#
            ),
            Err(ConfigError::PerDevice { .. })
        ));
        assert!(
            serde_json::from_str::<SharingConfig>(r#"{"timeslicing":{}}"#).is_err(),
            "a misspelt key"
        );
        let ask = Ask::Replicas { count: 2 };
        assert!(check_replica_count("nvidia.com/gpu", ask, true).is_err());
        assert_eq!(check_replica_count("nvidia.com/gpu", ask, false), Ok(ask));
    }
}
