//! IPPool, Subnet and ReservedIP: cluster-scoped, their specs exactly the standalone shapes.

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// An IPPool's spec: the same fields as in a standalone file (`allot_core::spec::IpPoolSpec`).
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "allot.dev",
    version = "v1alpha1",
    kind = "IPPool",
    plural = "ippools",
    doc = "Addresses pods get theirs from: a subnet, the entries of it to hand out, and which pods may use them.",
    shortname = "ipp",
    status = "AddressCounts",
    printcolumn = r#"{"name":"VERSION","type":"integer","jsonPath":".spec.ipVersion"}"#,
    printcolumn = r#"{"name":"SUBNET","type":"string","jsonPath":".spec.subnet"}"#,
    printcolumn = r#"{"name":"ALLOCATED","type":"integer","jsonPath":".status.allocatedIPCount"}"#,
    printcolumn = r#"{"name":"TOTAL","type":"integer","jsonPath":".status.totalIPCount"}"#,
    printcolumn = r#"{"name":"DEFAULT","type":"boolean","jsonPath":".spec.default"}"#,
    printcolumn = r#"{"name":"DISABLE","type":"boolean","jsonPath":".spec.disable"}"#
)]
#[serde(transparent)]
pub struct IpPoolSpec(pub allot_core::spec::IpPoolSpec);

/// The status of IPPools and Subnets: derived by the controller from the claims, at most every
/// few seconds; never authoritative.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct AddressCounts {
    /// Addresses claimed (a Subnet: handed to its pools).
    #[serde(
        rename = "allocatedIPCount",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub allocated_ip_count: Option<u64>,
    #[serde(
        rename = "totalIPCount",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub total_ip_count: Option<u64>,
}

/// A Subnet's spec: the same fields as in a standalone file.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "allot.dev",
    version = "v1alpha1",
    kind = "Subnet",
    plural = "subnets",
    doc = "A range that pools for single applications (auto pools) are carved from.",
    status = "AddressCounts",
    printcolumn = r#"{"name":"VERSION","type":"integer","jsonPath":".spec.ipVersion"}"#,
    printcolumn = r#"{"name":"SUBNET","type":"string","jsonPath":".spec.subnet"}"#,
    printcolumn = r#"{"name":"ALLOCATED","type":"integer","jsonPath":".status.allocatedIPCount"}"#,
    printcolumn = r#"{"name":"TOTAL","type":"integer","jsonPath":".status.totalIPCount"}"#
)]
#[serde(transparent)]
pub struct SubnetSpec(pub allot_core::spec::SubnetSpec);

/// A ReservedIP's spec (a terminating ReservedIP no longer reserves).
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "allot.dev",
    version = "v1alpha1",
    kind = "ReservedIP",
    plural = "reservedips",
    doc = "Addresses never handed out, whatever pool holds them.",
    printcolumn = r#"{"name":"VERSION","type":"integer","jsonPath":".spec.ipVersion"}"#
)]
#[serde(transparent)]
pub struct ReservedIpSpec(pub allot_core::spec::ReservedIpSpec);
