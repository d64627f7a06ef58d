//! fumarole's kubelet device plugins (API v1beta1), one per extended resource of the node.
//!
//! Start at [`plugin::DevicePluginService`] (the gRPC server: `ListAndWatch` with health,
//! `GetPreferredAllocation`, `Allocate`) and [`register::serve`] (serve on
//! `<dir>/fumarole-<resource>.sock`, then register with the kubelet, and again whenever the
//! kubelet restarts). [`resources`] says which resources a node has and what a container gets;
//! [`admission`] which pod the kubelet is admitting and how the scheduler extension's device
//! choice ([`annotation`]) is honoured or reported; [`config`] the
//! configuration file that renames resources and sets env vars and device nodes per device class.
//!
//! Beside them, [`dra`] is the DRA (v1) kubelet plugin: devices whose config entry says
//! `servedBy: dra` (or `both`) are handed out through ResourceClaims, with the same env vars
//! and device nodes, as CDI specs ([`dra::serve::start`] is where to start).
//!
//! [`settings`] holds both plugins' flags (flattened into `fumarole-agent run`) and the typed
//! settings they become.

pub mod admission;
pub mod annotation;
pub mod config;
pub mod dra;
pub mod plugin;
pub mod register;
pub mod resources;
pub mod settings;

/// Generated from `proto/deviceplugin_v1beta1.proto`.
pub mod api {
    tonic::include_proto!("v1beta1");
}
