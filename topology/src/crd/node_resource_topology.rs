//! `NodeResourceTopology` (`topology.node.k8s.io/v1alpha2`): one zone per NUMA node with
//! capacity / allocatable / available per resource, and distance costs. The object has no
//! `spec`: `zones`, `attributes` and `topologyPolicies` sit at the top level.

use serde::{Deserialize, Serialize};

pub const KIND: &str = "NodeResourceTopology";

/// The object body without `metadata` (the publisher adds it).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeResourceTopology {
    pub zones: Vec<Zone>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attributes: Vec<Attribute>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Zone {
    /// `node-N`.
    pub name: String,
    /// `Node`.
    #[serde(rename = "type")]
    pub zone_type: String,
    pub resources: Vec<ResourceInfo>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub costs: Vec<CostInfo>,
}

/// Quantities as Kubernetes quantity strings (`"32"`, `"137438953472"`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResourceInfo {
    pub name: String,
    pub capacity: String,
    pub allocatable: String,
    pub available: String,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CostInfo {
    /// The other zone, `node-M`.
    pub name: String,
    pub value: i64,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Attribute {
    pub name: String,
    pub value: String,
}
