//! Asks a device plugin what the kubelet asks it, over its socket, and prints the answers:
//! options, the first device list (ids, health, NUMA), a preferred allocation and an allocation
//! of `COUNT` devices (default 1). For node bring-up, where no kubelet runs yet:
//!
//! ```text
//! cargo run -p fumarole-device-plugin --example ask_plugin -- /var/lib/kubelet/device-plugins/fumarole-nvidia.com_gpu.sock 2
//! ```

use std::time::Duration;

use fumarole_device_plugin::api::device_plugin_client::DevicePluginClient;
use fumarole_device_plugin::api::{
    AllocateRequest, ContainerAllocateRequest, ContainerPreferredAllocationRequest, Empty,
    PreferredAllocationRequest,
};
use tonic::transport::Endpoint;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let Some(socket) = args.next() else {
        return Err("usage: ask_plugin SOCKET [COUNT]".into());
    };
    let count: usize = args.next().map_or(Ok(1), |c| c.parse())?;
    let channel = Endpoint::from_shared(format!("unix:{socket}"))?
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await?;
    let mut plugin = DevicePluginClient::new(channel);

    let options = plugin
        .get_device_plugin_options(Empty {})
        .await?
        .into_inner();
    println!("options: {options:?}");
    let mut updates = plugin.list_and_watch(Empty {}).await?.into_inner();
    let Some(first) = updates.message().await? else {
        return Err("ListAndWatch ended before its first list".into());
    };
    println!("devices: {}", first.devices.len());
    for d in &first.devices {
        let numa: Vec<i64> = d
            .topology
            .iter()
            .flat_map(|t| t.nodes.iter().map(|n| n.id))
            .collect();
        println!("  {} {} numa={numa:?}", d.id, d.health);
    }
    let healthy: Vec<String> = first
        .devices
        .iter()
        .filter(|d| d.health == "Healthy")
        .map(|d| d.id.clone())
        .collect();
    if healthy.len() < count {
        return Err(format!("{count} devices asked, {} healthy", healthy.len()).into());
    }
    let preferred = plugin
        .get_preferred_allocation(PreferredAllocationRequest {
            container_requests: vec![ContainerPreferredAllocationRequest {
                available_device_i_ds: healthy.clone(),
                must_include_device_i_ds: vec![],
                allocation_size: i32::try_from(count)?,
            }],
        })
        .await?
        .into_inner();
    let chosen = preferred
        .container_responses
        .first()
        .map(|r| r.device_i_ds.clone())
        .unwrap_or_default();
    println!("preferred: {chosen:?}");
    let allocated = plugin
        .allocate(AllocateRequest {
            container_requests: vec![ContainerAllocateRequest {
                devices_ids: if chosen.is_empty() {
                    healthy[..count].to_vec()
                } else {
                    chosen
                },
            }],
        })
        .await?
        .into_inner();
    for r in &allocated.container_responses {
        println!("envs: {:?}", r.envs);
        for d in &r.devices {
            println!(
                "device: {} -> {} ({})",
                d.host_path, d.container_path, d.permissions
            );
        }
        for m in &r.mounts {
            println!(
                "mount: {} -> {} ro={}",
                m.host_path, m.container_path, m.read_only
            );
        }
        println!("annotations: {:?}", r.annotations);
        let cdi: Vec<&str> = r.cdi_devices.iter().map(|c| c.name.as_str()).collect();
        println!("cdi: {cdi:?}");
    }
    Ok(())
}
