//! Which of a claim's allocated devices are this plugin's to prepare (pure): the results of
//! our driver in this node's pool, once the claim is known to be the one the kubelet means
//! and to be allocated.

use k8s_openapi::api::resource::v1::ResourceClaim;

use crate::dra::claims::{ClaimRef, PrepareError};

/// One device of the claim for us to prepare.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Allocated {
    /// The device's name in our pool (`nvidia-0`).
    pub device: String,
    /// The claim's requests it was allocated for, in the allocation's order.
    pub requests: Vec<String>,
}

/// The devices of `claim` (read for `want`) that `driver` prepares on node pool `pool`, in
/// the allocation's order, a device given to several requests once with all of them. Fails
/// when the claim read is not the one the kubelet named (uid) or is not allocated.
pub fn our_devices(
    claim: &ResourceClaim,
    want: &ClaimRef,
    driver: &str,
    pool: &str,
) -> Result<Vec<Allocated>, PrepareError> {
    let uid = claim.metadata.uid.as_deref().unwrap_or_default();
    if uid != want.uid {
        return Err(PrepareError::UidMismatch {
            claim: want.to_string(),
            found: uid.to_string(),
        });
    }
    let Some(allocation) = claim.status.as_ref().and_then(|s| s.allocation.as_ref()) else {
        return Err(PrepareError::NotAllocated(want.to_string()));
    };
    let mut out: Vec<Allocated> = Vec::new();
    let results = allocation
        .devices
        .as_ref()
        .and_then(|d| d.results.as_ref())
        .into_iter()
        .flatten();
    for r in results.filter(|r| r.driver == driver && r.pool == pool) {
        match out.iter_mut().find(|a| a.device == r.device) {
            Some(a) if !a.requests.contains(&r.request) => a.requests.push(r.request.clone()),
            Some(_) => {}
            None => out.push(Allocated {
                device: r.device.clone(),
                requests: vec![r.request.clone()],
            }),
        }
    }
    Ok(out)
}
