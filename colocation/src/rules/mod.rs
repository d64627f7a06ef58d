//! The pure half of co-location: what volcano-agent decides, as functions of their inputs. No
//! I/O, no async, no clock (callers pass instants); the cgroup layer and the tasks feed them what
//! they read and apply what they return. Semantics in `../shared/reference/anchor-behaviour.md`.
//!
//! - [`level`]: QoS levels from `volcano.sh/qos-level` and what each level writes.
//! - [`burst`]: CPU burst from `volcano.sh/enable-quota-burst` / `volcano.sh/quota-burst-time`.
//! - [`kernel`]: what the node's kernel offers (cgroup version, QoS files), as the plans take it.
//! - [`pod`]: what the rules know about a pod: its Kubernetes QoS class, whether it is offline
//!   ([`pod::is_offline`]), its effective requests.
//! - [`psi`]: pressure (PSI) file text.
//! - [`oversub`]: batch resources for offline pods.
//! - [`batch_limits`]: a BestEffort pod's batch resources as its cgroup limits.
//! - [`evict`]: watermarks, pressure and which offline pod to evict.
//! - [`config`]: the `volcano-agent-configuration` ConfigMap (`colocation-config`) and what it
//!   means for one node.
//!
//! Start at [`evict::Evictor::round`], [`oversub::oversold`], [`level::desired`] and
//! [`config::effective`].

pub mod batch_limits;
pub mod burst;
pub mod config;
pub mod evict;
pub mod kernel;
pub mod level;
pub mod oversub;
pub mod pod;
pub mod psi;
