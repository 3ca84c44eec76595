//! The user-facing object shapes (IPPool, Subnet, ReservedIP) with Spiderpool's field names
//! (`spidernet.io/v2beta1`), so that its users' manifests carry over.
//!
//! Unknown fields are rejected so that a typo (`nodename`) is an error naming the field, not a
//! silently ignored constraint.
//!
//! With the `schema` feature each shape also describes itself as JSON Schema (the CRDs of
//! allot-k8s): what a schema can check (address formats, `ipVersion`) is checked by the API
//! server too, and everything is checked again by the same `from_spec` code as here.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The forms a schema can check (the exact checks are `from_spec`'s): a CIDR, an address, and
/// an `ips` entry (an address, a "first-last" range or a CIDR).
#[cfg(feature = "schema")]
const CIDR_FORMAT: &str = r"^[0-9A-Fa-f:.]+/[0-9]{1,3}$";
#[cfg(feature = "schema")]
const ADDRESS_FORMAT: &str = r"^[0-9A-Fa-f:.]+$";
#[cfg(feature = "schema")]
const ENTRY_FORMAT: &str = r"^[0-9A-Fa-f:.]+(-[0-9A-Fa-f:.]+|/[0-9]{1,3})?$";

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
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct LabelSelector {
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub match_labels: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub match_expressions: Vec<LabelSelectorRequirement>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct LabelSelectorRequirement {
    pub key: String,
    pub operator: SelectorOperator,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub values: Vec<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub enum SelectorOperator {
    In,
    NotIn,
    Exists,
    DoesNotExist,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct RouteSpec {
    #[cfg_attr(feature = "schema", schemars(regex(pattern = CIDR_FORMAT)))]
    pub dst: String,
    #[cfg_attr(feature = "schema", schemars(regex(pattern = ADDRESS_FORMAT)))]
    pub gw: String,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct IpPoolSpec {
    /// 4 or 6; taken from `subnet` when omitted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schema", schemars(extend("enum" = [4, 6])))]
    pub ip_version: Option<u8>,
    #[cfg_attr(feature = "schema", schemars(regex(pattern = CIDR_FORMAT)))]
    pub subnet: String,
    /// Entries: single addresses, "first-last" ranges or CIDRs. Empty: every usable host of
    /// `subnet`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[cfg_attr(
        feature = "schema",
        schemars(inner(regex(pattern = ENTRY_FORMAT)))
    )]
    pub ips: Vec<String>,
    #[serde(default, rename = "excludeIPs", skip_serializing_if = "Vec::is_empty")]
    #[cfg_attr(
        feature = "schema",
        schemars(inner(regex(pattern = ENTRY_FORMAT)))
    )]
    pub exclude_ips: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schema", schemars(regex(pattern = ADDRESS_FORMAT)))]
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
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct SubnetSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schema", schemars(extend("enum" = [4, 6])))]
    pub ip_version: Option<u8>,
    #[cfg_attr(feature = "schema", schemars(regex(pattern = CIDR_FORMAT)))]
    pub subnet: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[cfg_attr(
        feature = "schema",
        schemars(inner(regex(pattern = ENTRY_FORMAT)))
    )]
    pub ips: Vec<String>,
    #[serde(default, rename = "excludeIPs", skip_serializing_if = "Vec::is_empty")]
    #[cfg_attr(
        feature = "schema",
        schemars(inner(regex(pattern = ENTRY_FORMAT)))
    )]
    pub exclude_ips: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schema", schemars(regex(pattern = ADDRESS_FORMAT)))]
    pub gateway: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub routes: Vec<RouteSpec>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct ReservedIpSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schema", schemars(extend("enum" = [4, 6])))]
    pub ip_version: Option<u8>,
    #[cfg_attr(
        feature = "schema",
        schemars(inner(regex(pattern = ENTRY_FORMAT)))
    )]
    pub ips: Vec<String>,
}

/// Labels a controller puts on an auto pool (one carved from a Subnet for one workload).
pub mod auto_pool_labels {
    pub const OWNER_SUBNET: &str = "ipam.allot.dev/owner-subnet";
    pub const APPLICATION_KIND: &str = "ipam.allot.dev/owner-application-kind";
    pub const APPLICATION_NAMESPACE: &str = "ipam.allot.dev/owner-application-namespace";
    pub const APPLICATION_NAME: &str = "ipam.allot.dev/owner-application-name";
}
