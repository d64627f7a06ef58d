//! The node agent's own parts beyond discovery, publishing and device plugins (those live in
//! `fumarole-exporter` and `fumarole-device-plugin`): node QoS, CPU burst, oversubscription and
//! eviction for co-located online and offline pods ([`qos`]), and the loop that applies QoS levels
//! and CPU burst to this node's pods ([`colocation`]).

pub mod colocation;
pub mod qos;
