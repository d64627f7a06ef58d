//! Preparing and unpreparing claims for one driver, apart from gRPC: [`DriverPlugin`].
//!
//! Prepare: a claim whose spec file exists is answered from the file (the kubelet asks again
//! after it restarts, and the answer must not change); otherwise the claim is read, checked
//! ([`allocation::our_devices`]), its devices looked up ([`DraNode::lookup`]), the partitions
//! among them made ([`DraNode::partition`]: a MIG instance, whose uuid the container gets, or
//! an Ascend vNPU, whose `/dev/vdavinci<id>` it gets as `/dev/davinci<id>`) and its spec
//! written ([`cdi`]), the partitions' ids in it. Unprepare: the partitions
//! are removed, then the file. Nothing but the files is kept, so any process over the same CDI
//! directory can unprepare what another prepared.

use std::path::PathBuf;
use std::sync::Arc;

use tokio::sync::Mutex;

use crate::dra::allocation::{self, Allocated};
use crate::dra::api;
use crate::dra::cdi::{self, ClaimDevice};
use crate::dra::claims::{ClaimReader, ClaimRef, PrepareError};
use crate::dra::node::{DraNode, Served};
use crate::resources::{PluginDevice, Resource};
use fumarole_topology::dra::MadePartition;

/// CDI device annotations of a partition made for the claim: the uuid (or id) of the device
/// it was cut from, and a MIG device's uuid, GPU and compute instance ids, or a vNPU's vdev id.
pub const PARTITION_OF_ANNOTATION: &str = "fumarole.dev/partition-of";
pub const PARTITION_UUID_ANNOTATION: &str = "fumarole.dev/partition-uuid";
pub const GPU_INSTANCE_ANNOTATION: &str = "fumarole.dev/gpu-instance";
pub const COMPUTE_INSTANCE_ANNOTATION: &str = "fumarole.dev/compute-instance";
pub const VNPU_ANNOTATION: &str = "fumarole.dev/vnpu-id";

/// Huawei's container runtime's option for virtual devices: the visible ids are vNPUs, whose
/// nodes are `/dev/vdavinci<id>` on the host.
const ASCEND_VIRTUAL: &str = "ASCEND_RUNTIME_OPTIONS=VIRTUAL";

/// One allocated device, ready for the spec: served whole, or a partition made for the claim.
enum Ready<'a> {
    Whole(Served<'a>),
    Made {
        resource: &'a Resource,
        /// The parent's served device with the partition's uuid.
        device: Box<PluginDevice>,
        parent_uuid: String,
        made: MadePartition,
    },
}

/// One driver's prepare / unprepare. Cheap to share (`Arc`).
pub struct DriverPlugin {
    driver: &'static str,
    node: Arc<DraNode>,
    cdi_dir: PathBuf,
    claims: Arc<dyn ClaimReader>,
    /// Serializes spec file changes within this process.
    files: Mutex<()>,
}

impl DriverPlugin {
    pub fn new(
        driver: &'static str,
        node: Arc<DraNode>,
        cdi_dir: PathBuf,
        claims: Arc<dyn ClaimReader>,
    ) -> Self {
        Self {
            driver,
            node,
            cdi_dir,
            claims,
            files: Mutex::new(()),
        }
    }

    pub fn driver(&self) -> &'static str {
        self.driver
    }

    /// The devices the container runtime must add for `claim`, as their CDI ids.
    pub async fn prepare(&self, claim: &ClaimRef) -> Result<Vec<api::Device>, PrepareError> {
        check(claim)?;
        let file = cdi::file_name(self.driver, &claim.uid);
        let spec_error = |reason: String| PrepareError::Spec {
            claim: claim.to_string(),
            path: self.cdi_dir.join(&file).display().to_string(),
            reason,
        };
        match cdi::read(&self.cdi_dir, &file) {
            Ok(Some(spec)) => match spec.answer() {
                Some(answer) => return Ok(answer),
                None => {
                    tracing::warn!(driver = self.driver, %claim, file, "CDI spec without our annotations: preparing again")
                }
            },
            Ok(None) => {}
            Err(e) => {
                tracing::warn!(driver = self.driver, %claim, error = %e, "CDI spec unreadable: preparing again")
            }
        }
        let read = self
            .claims
            .get(&claim.namespace, &claim.name)
            .await
            .map_err(|reason| PrepareError::Read {
                claim: claim.to_string(),
                reason,
            })?
            .ok_or_else(|| PrepareError::NotFound(claim.to_string()))?;
        let allocated = allocation::our_devices(&read, claim, self.driver, &self.node.node_name)?;
        let mut ready: Vec<(Allocated, Ready)> = Vec::new();
        for a in allocated {
            match self.ready(claim, &a.device).await {
                Ok(r) => ready.push((a, r)),
                Err(e) => {
                    self.remove_made(made_of(&ready)).await;
                    return Err(e);
                }
            }
        }
        let devices: Vec<ClaimDevice> = ready
            .iter()
            .map(|(Allocated { device, requests }, r)| ClaimDevice {
                name: device.clone(),
                requests: requests.clone(),
                served: match r {
                    Ready::Whole(s) => *s,
                    Ready::Made {
                        resource, device, ..
                    } => Served { resource, device },
                },
            })
            .collect();
        if devices.is_empty() {
            // Nothing of ours in this claim here: nothing to add, no file.
            return Ok(Vec::new());
        }
        let mut spec = cdi::build(
            self.driver,
            &claim.uid,
            &format!("{}/{}", claim.namespace, claim.name),
            &self.node.node_name,
            &devices,
        );
        for ((a, r), d) in ready.iter().zip(&mut spec.devices) {
            if let Ready::Made {
                parent_uuid, made, ..
            } = r
            {
                debug_assert_eq!(d.annotations[cdi::DEVICE_ANNOTATION], a.device);
                d.annotations
                    .insert(PARTITION_OF_ANNOTATION.to_string(), parent_uuid.clone());
                match made {
                    MadePartition::Mig {
                        uuid,
                        gpu_instance,
                        compute_instance,
                    } => d.annotations.extend([
                        (PARTITION_UUID_ANNOTATION.to_string(), uuid.clone()),
                        (
                            GPU_INSTANCE_ANNOTATION.to_string(),
                            gpu_instance.to_string(),
                        ),
                        (
                            COMPUTE_INSTANCE_ANNOTATION.to_string(),
                            compute_instance.to_string(),
                        ),
                    ]),
                    MadePartition::Vnpu { vdev_id } => {
                        d.annotations
                            .insert(VNPU_ANNOTATION.to_string(), vdev_id.to_string());
                        // The vNPU's node, under the name the chip's would have.
                        d.container_edits.device_nodes.push(cdi::DeviceNode {
                            path: format!("/dev/davinci{vdev_id}"),
                            host_path: Some(format!("/dev/vdavinci{vdev_id}")),
                            permissions: Some("rw".into()),
                        });
                        if !spec.container_edits.env.iter().any(|e| e == ASCEND_VIRTUAL) {
                            spec.container_edits.env.push(ASCEND_VIRTUAL.into());
                        }
                    }
                }
            }
        }
        let _files = self.files.lock().await;
        let written = match spec.answer() {
            Some(answer) => cdi::write(&self.cdi_dir, &file, &spec)
                .map(|_| answer)
                .map_err(|e| spec_error(e.to_string())),
            None => Err(spec_error("built without annotations".into())),
        };
        let answer = match written {
            Ok(answer) => answer,
            Err(e) => {
                self.remove_made(made_of(&ready)).await;
                return Err(e);
            }
        };
        tracing::info!(driver = self.driver, %claim, devices = answer.len(), file, "claim prepared");
        Ok(answer)
    }

    /// Allocated device `name` of `claim`, served whole or made as a partition.
    async fn ready(&self, claim: &ClaimRef, name: &str) -> Result<Ready<'_>, PrepareError> {
        let device_error = |source| PrepareError::Device {
            claim: claim.to_string(),
            source,
        };
        let Some(found) = self.node.partition(self.driver, name) else {
            return self
                .node
                .lookup(self.driver, name)
                .map(Ready::Whole)
                .map_err(device_error);
        };
        let (parent, discovered, partition) = found.map_err(device_error)?;
        let Some(partitioner) = self.node.partitioner().cloned() else {
            return Err(PrepareError::Partition {
                claim: claim.to_string(),
                device: name.to_string(),
                reason: "no partitioner".into(),
            });
        };
        let (discovered, p) = (discovered.clone(), partition.clone());
        let made = tokio::task::spawn_blocking(move || partitioner.create(&discovered, &p))
            .await
            .unwrap_or_else(|e| Err(format!("making it panicked or was cancelled: {e}")))
            .map_err(|reason| PrepareError::Partition {
                claim: claim.to_string(),
                device: name.to_string(),
                reason,
            })?;
        tracing::info!(driver = self.driver, %claim, device = name, made = ?made, "partition made");
        let parent_uuid = parent
            .device
            .uuid
            .clone()
            .unwrap_or_else(|| parent.device.id.clone());
        let device = match &made {
            MadePartition::Mig { uuid, .. } => PluginDevice {
                id: uuid.clone(),
                uuid: Some(uuid.clone()),
                parent: Some(parent.device.id.clone()),
                ..parent.device.clone()
            },
            // Visible by its vdev id; its one node (`/dev/vdavinci<id>`) is added to the spec.
            MadePartition::Vnpu { vdev_id } => PluginDevice {
                id: made.visible_id(),
                index: *vdev_id,
                dev_nodes: Vec::new(),
                parent: Some(parent.device.id.clone()),
                ..parent.device.clone()
            },
        };
        Ok(Ready::Made {
            resource: parent.resource,
            device: Box::new(device),
            parent_uuid,
            made,
        })
    }

    /// Removes partitions made by a prepare that then failed: (parent uuid, partition).
    async fn remove_made(&self, made: Vec<(String, MadePartition)>) {
        for (parent_uuid, made) in made {
            let id = made.visible_id();
            if let Err(e) = self.destroy(parent_uuid, made).await {
                tracing::warn!(driver = self.driver, %id, error = %e, "removing a partition of a failed prepare");
            }
        }
    }

    async fn destroy(&self, parent_uuid: String, made: MadePartition) -> Result<(), String> {
        let Some(partitioner) = self.node.partitioner().cloned() else {
            return Err("no partitioner on this node to remove it".into());
        };
        tokio::task::spawn_blocking(move || partitioner.destroy(&parent_uuid, &made))
            .await
            .unwrap_or_else(|e| Err(format!("removing it panicked or was cancelled: {e}")))
    }

    /// Undoes [`Self::prepare`]: removes the partitions the claim's spec file records, then the
    /// file; a claim never prepared (or already unprepared) is success. A partition that cannot
    /// be removed keeps the file, and the kubelet asks again.
    pub async fn unprepare(&self, claim: &ClaimRef) -> Result<(), PrepareError> {
        check_uid(claim)?;
        let file = cdi::file_name(self.driver, &claim.uid);
        let _files = self.files.lock().await;
        if let Ok(Some(spec)) = cdi::read(&self.cdi_dir, &file) {
            for d in &spec.devices {
                let Some(made) = made_partition(&d.annotations) else {
                    continue;
                };
                let parent = d.annotations[PARTITION_OF_ANNOTATION].clone();
                self.destroy(parent, made.clone()).await.map_err(|reason| {
                    PrepareError::Partition {
                        claim: claim.to_string(),
                        device: d
                            .annotations
                            .get(cdi::DEVICE_ANNOTATION)
                            .cloned()
                            .unwrap_or_default(),
                        reason: format!("removing partition {}: {reason}", made.visible_id()),
                    }
                })?;
                tracing::info!(driver = self.driver, %claim, id = %made.visible_id(), "partition removed");
            }
        }
        cdi::remove(&self.cdi_dir, &file).map_err(|e| PrepareError::Spec {
            claim: claim.to_string(),
            path: self.cdi_dir.join(&file).display().to_string(),
            reason: e.to_string(),
        })?;
        tracing::info!(driver = self.driver, %claim, "claim unprepared");
        Ok(())
    }
}

/// The partitions made among `ready`, with the uuid of the device each was cut from.
fn made_of(ready: &[(Allocated, Ready)]) -> Vec<(String, MadePartition)> {
    ready
        .iter()
        .filter_map(|(_, r)| match r {
            Ready::Made {
                parent_uuid, made, ..
            } => Some((parent_uuid.clone(), made.clone())),
            Ready::Whole(_) => None,
        })
        .collect()
}

/// The partition a CDI device's annotations record, if it is one.
fn made_partition(a: &std::collections::BTreeMap<String, String>) -> Option<MadePartition> {
    a.get(PARTITION_OF_ANNOTATION)?;
    if let Some(vdev_id) = a.get(VNPU_ANNOTATION) {
        return Some(MadePartition::Vnpu {
            vdev_id: vdev_id.parse().ok()?,
        });
    }
    Some(MadePartition::Mig {
        uuid: a
            .get(PARTITION_UUID_ANNOTATION)
            .cloned()
            .unwrap_or_default(),
        gpu_instance: a.get(GPU_INSTANCE_ANNOTATION)?.parse().ok()?,
        compute_instance: a.get(COMPUTE_INSTANCE_ANNOTATION)?.parse().ok()?,
    })
}

/// A uid (it names the file), a namespace and a name (they find the claim).
fn check(claim: &ClaimRef) -> Result<(), PrepareError> {
    if claim.uid.is_empty() || claim.namespace.is_empty() || claim.name.is_empty() {
        return Err(PrepareError::Incomplete(claim.to_string()));
    }
    check_uid(claim)
}

/// A uid that names a file inside the CDI directory and a valid CDI device name.
fn check_uid(claim: &ClaimRef) -> Result<(), PrepareError> {
    if claim.uid.is_empty() {
        return Err(PrepareError::Incomplete(claim.to_string()));
    }
    if !claim
        .uid
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'-')
    {
        return Err(PrepareError::BadUid(claim.to_string()));
    }
    Ok(())
}
