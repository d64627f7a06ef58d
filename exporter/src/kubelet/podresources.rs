//! Client of the kubelet PodResources v1 API over its unix socket
//! (`/var/lib/kubelet/pod-resources/kubelet.sock`). The kubelet rate-limits this API (about
//! 100 qps), so callers poll it at their re-check interval, not faster.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use fumarole_topology::CpuSet;
use tonic::transport::Endpoint;

use super::{ClaimedDevice, ContainerAllocation, MemoryBlock, PodAllocation};

/// Generated from `proto/podresources_v1.proto`.
pub mod v1 {
    tonic::include_proto!("v1");
}

#[derive(Debug, thiserror::Error)]
pub enum PodResourcesError {
    #[error("connecting to {path}: {reason}")]
    Connect { path: String, reason: String },
    #[error("List: {0}")]
    List(#[from] tonic::Status),
}

/// Every pod's exclusive CPUs, devices and NUMA-pinned memory.
pub async fn list(socket: &Path) -> Result<Vec<PodAllocation>, PodResourcesError> {
    let connect_err = |e: tonic::transport::Error| PodResourcesError::Connect {
        path: socket.display().to_string(),
        reason: e.to_string(),
    };
    let channel = Endpoint::from_shared(format!("unix:{}", socket.display()))
        .map_err(connect_err)?
        .connect_timeout(Duration::from_secs(5))
        .timeout(Duration::from_secs(10))
        .connect()
        .await
        .map_err(connect_err)?;
    let mut client = v1::pod_resources_lister_client::PodResourcesListerClient::new(channel);
    let response = client
        .list(v1::ListPodResourcesRequest {})
        .await?
        .into_inner();
    Ok(response
        .pod_resources
        .into_iter()
        .map(pod_allocation)
        .collect())
}

fn pod_allocation(p: v1::PodResources) -> PodAllocation {
    PodAllocation {
        uid: None,
        name: p.name,
        namespace: p.namespace,
        containers: p
            .containers
            .into_iter()
            .map(|c| {
                let mut devices: BTreeMap<String, Vec<String>> = BTreeMap::new();
                for d in c.devices {
                    devices
                        .entry(d.resource_name)
                        .or_default()
                        .extend(d.device_ids);
                }
                let claimed = c
                    .dynamic_resources
                    .into_iter()
                    .flat_map(|claim| claim.claim_resources)
                    .map(|r| ClaimedDevice {
                        driver: r.driver_name,
                        pool: r.pool_name,
                        device: r.device_name,
                    })
                    .collect();
                ContainerAllocation {
                    name: c.name,
                    claimed,
                    // Negative ids would be a kubelet bug; drop them rather than fail.
                    cpus: c
                        .cpu_ids
                        .into_iter()
                        .filter_map(|id| u32::try_from(id).ok())
                        .collect::<CpuSet>(),
                    devices,
                    memory: c
                        .memory
                        .into_iter()
                        .filter(|m| m.size > 0)
                        .map(|m| MemoryBlock {
                            resource: m.memory_type,
                            bytes: m.size,
                            numa_nodes: m
                                .topology
                                .map(|t| {
                                    t.nodes
                                        .iter()
                                        .filter_map(|n| u32::try_from(n.id).ok())
                                        .collect()
                                })
                                .unwrap_or_default(),
                        })
                        .collect(),
                }
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::v1::pod_resources_lister_server::{PodResourcesLister, PodResourcesListerServer};
    use super::*;

    struct Fixed;

    #[tonic::async_trait]
    impl PodResourcesLister for Fixed {
        async fn list(
            &self,
            _: tonic::Request<v1::ListPodResourcesRequest>,
        ) -> Result<tonic::Response<v1::ListPodResourcesResponse>, tonic::Status> {
            Ok(tonic::Response::new(v1::ListPodResourcesResponse {
                pod_resources: vec![v1::PodResources {
                    name: "train-0".into(),
                    namespace: "ml".into(),
                    containers: vec![v1::ContainerResources {
                        name: "main".into(),
                        cpu_ids: vec![4, 5, 6, 7],
                        devices: vec![v1::ContainerDevices {
                            resource_name: "nvidia.com/gpu".into(),
                            device_ids: vec!["GPU-a".into(), "GPU-b".into()],
                            topology: None,
                        }],
                        memory: vec![v1::ContainerMemory {
                            memory_type: "hugepages-1Gi".into(),
                            size: 2 << 30,
                            topology: Some(v1::TopologyInfo {
                                nodes: vec![v1::NumaNode { id: 1 }],
                            }),
                        }],
                        dynamic_resources: vec![v1::DynamicResource {
                            claim_name: "gpus".into(),
                            claim_namespace: "ml".into(),
                            claim_resources: vec![v1::ClaimResource {
                                cdi_devices: vec![],
                                driver_name: "gpu.fumarole.dev".into(),
                                pool_name: "dgx-1".into(),
                                device_name: "nvidia-3".into(),
                                share_id: None,
                            }],
                        }],
                    }],
                }],
            }))
        }

        async fn get_allocatable_resources(
            &self,
            _: tonic::Request<v1::AllocatableResourcesRequest>,
        ) -> Result<tonic::Response<v1::AllocatableResourcesResponse>, tonic::Status> {
            Err(tonic::Status::unimplemented("not used"))
        }
    }

    #[tokio::test]
    async fn lists_over_a_unix_socket() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("kubelet.sock");
        let listener = tokio::net::UnixListener::bind(&socket).unwrap();
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(PodResourcesListerServer::new(Fixed))
                .serve_with_incoming(tokio_stream::wrappers::UnixListenerStream::new(listener)),
        );
        let pods = list(&socket).await.unwrap();
        assert_eq!(pods[0].name, "train-0");
        assert_eq!(pods[0].containers[0].cpus.to_string(), "4-7");
        assert_eq!(
            pods[0].containers[0].devices["nvidia.com/gpu"],
            vec!["GPU-a", "GPU-b"]
        );
        assert_eq!(
            pods[0].containers[0].memory,
            vec![MemoryBlock {
                resource: "hugepages-1Gi".into(),
                bytes: 2 << 30,
                numa_nodes: vec![1],
            }]
        );
        assert_eq!(
            pods[0].containers[0].claimed,
            vec![ClaimedDevice {
                driver: "gpu.fumarole.dev".into(),
                pool: "dgx-1".into(),
                device: "nvidia-3".into(),
            }]
        );

        let err = list(&dir.path().join("absent.sock")).await.unwrap_err();
        assert!(err.to_string().contains("absent.sock"), "{err}");
    }
}
