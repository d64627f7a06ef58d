//! Where the plugin reads ResourceClaims: [`ClaimReader`], the API server in the agent
//! ([`KubeClaims`]), a map in tests.

use std::future::Future;
use std::pin::Pin;

use k8s_openapi::api::resource::v1::ResourceClaim;

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
