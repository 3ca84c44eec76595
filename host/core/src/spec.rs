//! The user-facing object shapes (IPPool, Subnet, ReservedIP) with REFERENCE.md's field names.
//!
//! Unknown fields are rejected so that a typo (`nodename`) is an error naming the field, not a
//! silently ignored constraint.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ObjectMeta {
    pub name: String,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    /// Set when the object is being deleted (it then no longer serves allocations).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deletion_timestamp: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LabelSelector {
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub match_labels: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub match_expressions: Vec<LabelSelectorRequirement>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LabelSelectorRequirement {
    pub key: String,
    pub operator: SelectorOperator,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub values: Vec<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum SelectorOperator {
    In,
    NotIn,
    Exists,
    DoesNotExist,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteSpec {
    pub dst: String,
    pub gw: String,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct IpPoolSpec {
    /// 4 or 6; taken from `subnet` when omitted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ip_version: Option<u8>,
    pub subnet: String,
    /// Entries: single addresses, "first-last" ranges or CIDRs. Empty: every usable host of
    /// `subnet`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ips: Vec<String>,
    #[serde(default, rename = "excludeIPs", skip_serializing_if = "Vec::is_empty")]
    pub exclude_ips: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub routes: Vec<RouteSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_affinity: Option<LabelSelector>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace_affinity: Option<LabelSelector>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_affinity: Option<LabelSelector>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub namespace_name: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub node_name: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub multus_name: Vec<String>,
    #[serde(default)]
    pub default: bool,
    #[serde(default)]
    pub disable: bool,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SubnetSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ip_version: Option<u8>,
    pub subnet: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ips: Vec<String>,
    #[serde(default, rename = "excludeIPs", skip_serializing_if = "Vec::is_empty")]
    pub exclude_ips: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub routes: Vec<RouteSpec>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ReservedIpSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ip_version: Option<u8>,
    pub ips: Vec<String>,
}

/// Labels a controller puts on an auto pool (one carved from a Subnet for one workload).
pub mod auto_pool_labels {
    pub const OWNER_SUBNET: &str = "ipam.allot.dev/owner-subnet";
    pub const APPLICATION_KIND: &str = "ipam.allot.dev/owner-application-kind";
    pub const APPLICATION_NAMESPACE: &str = "ipam.allot.dev/owner-application-namespace";
    pub const APPLICATION_NAME: &str = "ipam.allot.dev/owner-application-name";
}
