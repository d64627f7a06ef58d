//! Claims as the kubelet names them ([`ClaimRef`]), why one cannot be prepared
//! ([`PrepareError`]), and where the plugin reads ResourceClaims: [`ClaimReader`], the API
//! server in the agent ([`KubeClaims`]), a map in tests.

use std::fmt;
use std::future::Future;
use std::pin::Pin;

use k8s_openapi::api::resource::v1::ResourceClaim;

use crate::dra::api;
use crate::dra::node::LookupError;

/// A claim as the kubelet names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClaimRef {
    pub namespace: String,
    pub uid: String,
    pub name: String,
}

impl fmt::Display for ClaimRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{} ({})", self.namespace, self.name, self.uid)
    }
}

impl From<&api::Claim> for ClaimRef {
    fn from(c: &api::Claim) -> Self {
        Self {
            namespace: c.namespace.clone(),
            uid: c.uid.clone(),
            name: c.name.clone(),
        }
    }
}

/// Why one claim could not be prepared or unprepared: its error string in the kubelet's
/// answer. The kubelet retries the claim later, so each says what to fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PrepareError {
    /// The request named no uid, namespace or name.
    #[error("claim {0}: namespace, name and uid are all required")]
    Incomplete(String),
    /// A uid that is not letters, digits and `-` (it names a file).
    #[error("claim {0}: the uid must be letters, digits and '-'")]
    BadUid(String),
    /// The API server did not answer.
    #[error("reading ResourceClaim {claim}: {reason}")]
    Read { claim: String, reason: String },
    /// No such claim (deleted, or not yet visible).
    #[error("ResourceClaim {0} not found")]
    NotFound(String),
    /// A claim of that name exists with another uid: the one the kubelet means is gone.
    #[error("ResourceClaim {claim} has uid {found:?} now: the claim the kubelet names is gone")]
    UidMismatch { claim: String, found: String },
    /// The claim has no allocation yet.
    #[error("ResourceClaim {0} is not allocated")]
    NotAllocated(String),
    /// An allocated device is not one this plugin serves here.
    #[error("ResourceClaim {claim}: {source}")]
    Device { claim: String, source: LookupError },
    /// A partition could not be made or removed.
    #[error("ResourceClaim {claim}: partition {device}: {reason}")]
    Partition {
        claim: String,
        device: String,
        reason: String,
    },
    /// The spec file could not be written, read or removed.
    #[error("ResourceClaim {claim}: CDI spec {path}: {reason}")]
    Spec {
        claim: String,
        path: String,
        reason: String,
    },
}

/// A claim read: `Ok(None)` when it does not exist, `Err` with the reason when it could not
/// be read.
pub type ClaimFuture<'a> =
    Pin<Box<dyn Future<Output = Result<Option<ResourceClaim>, String>> + Send + 'a>>;

/// Reads one ResourceClaim by namespace and name.
pub trait ClaimReader: Send + Sync {
    fn get<'a>(&'a self, namespace: &'a str, name: &'a str) -> ClaimFuture<'a>;
}

/// Claims from the API server.
#[derive(Clone)]
pub struct KubeClaims {
    client: kube::Client,
}

impl KubeClaims {
    pub fn new(client: kube::Client) -> Self {
        Self { client }
    }
}

impl ClaimReader for KubeClaims {
    fn get<'a>(&'a self, namespace: &'a str, name: &'a str) -> ClaimFuture<'a> {
        Box::pin(async move {
            kube::Api::<ResourceClaim>::namespaced(self.client.clone(), namespace)
                .get_opt(name)
                .await
                .map_err(|e| e.to_string())
        })
    }
}
