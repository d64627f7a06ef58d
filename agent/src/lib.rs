//! The node agent's own parts beyond discovery, publishing and device plugins (those live in
//! `fumarole-exporter` and `fumarole-device-plugin`): the co-location logic for online and
//! offline pods (QoS, CPU burst, oversubscription, eviction: pure state machines and the cgroup
//! layer in [`qos`]) and the tasks of `run --colocation` that apply it to this node
//! ([`colocation`]), over the watches of [`watched`].

pub mod colocation;
pub mod qos;
pub mod watched;
