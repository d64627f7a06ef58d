//! Preparing and unpreparing claims for one driver, apart from gRPC: [`DriverPlugin`].
//!
//! Prepare: a claim whose spec file exists is answered from the file (the kubelet asks again
//! after it restarts, and the answer must not change); otherwise the claim is read, checked
//! ([`allocation::our_devices`]), its devices looked up ([`DraNode::lookup`]) and its spec
//! written ([`cdi`]). Unprepare: the file goes. Nothing but the files is kept, so any process
//! over the same CDI directory can unprepare what another prepared.

use std::path::PathBuf;
use std::sync::Arc;

use tokio::sync::Mutex;

use crate::dra::allocation::{self, Allocated};
use crate::dra::api;
use crate::dra::cdi::{self, ClaimDevice};
use crate::dra::claims::{ClaimReader, ClaimRef, PrepareError};
use crate::dra::node::DraNode;

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
        let devices = allocated
            .into_iter()
            .map(|Allocated { device, requests }| {
                let served = self.node.lookup(self.driver, &device).map_err(|source| {
                    PrepareError::Device {
                        claim: claim.to_string(),
                        source,
                    }
                })?;
                Ok(ClaimDevice {
                    name: device,
                    requests,
                    served,
                })
            })
            .collect::<Result<Vec<_>, PrepareError>>()?;
        if devices.is_empty() {
            // Nothing of ours in this claim here: nothing to add, no file.
            return Ok(Vec::new());
        }
        let spec = cdi::build(
            self.driver,
            &claim.uid,
            &format!("{}/{}", claim.namespace, claim.name),
            &self.node.node_name,
            &devices,
        );
        let answer = spec
            .answer()
            .ok_or_else(|| spec_error("built without annotations".into()))?;
        let _files = self.files.lock().await;
        cdi::write(&self.cdi_dir, &file, &spec).map_err(|e| spec_error(e.to_string()))?;
        tracing::info!(driver = self.driver, %claim, devices = answer.len(), file, "claim prepared");
        Ok(answer)
    }

    /// Undoes [`Self::prepare`]: removes the claim's spec file; a claim never prepared (or
    /// already unprepared) is success.
    pub async fn unprepare(&self, claim: &ClaimRef) -> Result<(), PrepareError> {
        check_uid(claim)?;
        let file = cdi::file_name(self.driver, &claim.uid);
        let _files = self.files.lock().await;
        cdi::remove(&self.cdi_dir, &file).map_err(|e| PrepareError::Spec {
            claim: claim.to_string(),
            path: self.cdi_dir.join(&file).display().to_string(),
            reason: e.to_string(),
        })?;
        tracing::info!(driver = self.driver, %claim, "claim unprepared");
        Ok(())
    }
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
