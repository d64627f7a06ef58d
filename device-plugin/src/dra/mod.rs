//! The DRA (Dynamic Resource Allocation, `resource.k8s.io/v1`) kubelet plugin: hands a pod
//! the devices the scheduler allocated to its ResourceClaims, beside the device plugins,
//! chosen per device by the configuration's `servedBy` ([`crate::config`]).
//!
//! Start at [`serve::start`]: for each driver with devices on the node (`gpu.fumarole.dev`,
//! `npu.fumarole.dev`, see [`fumarole_topology::dra`]) it serves the DRA service on
//! `<plugins-dir>/<driver>/dra.sock` ([`service`]) and then the registration service on
//! `<registry-dir>/<driver>-reg.sock` ([`registration`]), where the kubelet's plugin watcher
//! finds it. [`prepare::DriverPlugin`] does the work of one driver:
//!
//! - `NodePrepareResources`: read each claim from the API server ([`claims::ClaimReader`]),
//!   check its uid and allocation, keep the results of our driver in this node's pool
//!   ([`allocation`]), map each device name to the node's device ([`node::DraNode`]), and write
//!   one CDI spec file per claim ([`cdi`]) with the same env vars and device nodes a
//!   device-plugin container gets ([`crate::resources`]). A claim that cannot be prepared gets
//!   its own error string in the answer; the others are prepared.
//! - `NodeUnprepareResources`: delete the claim's spec file (missing is success).
//!
//! The spec files are the record: preparing a prepared claim answers from its file, and a new
//! process (after a restart) unprepares claims an old one prepared, without the API server.
//! The exporter publishes in ResourceSlices exactly the devices the plugin serves.
//!
//! Proven by unit tests and gRPC tests against our own client (`dra/tests.rs`,
//! `tests/dra_grpc.rs`); not yet against the kubelet's DRA manager.

pub mod allocation;
pub mod authority;
pub mod cdi;
pub mod claims;
pub mod node;
pub mod prepare;
pub mod registration;
pub mod serve;
pub mod service;

/// Generated from `proto/dra_v1.proto`: the kubelet's DRA plugin service, v1.
pub mod api {
    tonic::include_proto!("k8s.io.kubelet.pkg.apis.dra.v1");
}

/// Generated from `proto/pluginregistration_v1.proto`: the kubelet's plugin registration.
pub mod registration_api {
    tonic::include_proto!("pluginregistration");
}

#[cfg(test)]
mod tests;
