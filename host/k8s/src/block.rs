//! IPBlock: the claims of an aligned run of 64 addresses (`allot_core::block`).
//!
//! One object per address would not scale (150,000 claims against Kubernetes' ~10,000 objects
//! per kind for list SLOs), and one pool-wide object rewritten per allocation is the hot spot
//! that caps Spiderpool's pools. A block holds the claims of an aligned /26 (IPv4) or /122
//! (IPv6), whatever pools they come from (each claim names its pool); each write is a
//! compare-and-swap on the block's resourceVersion, and each node starts its allocations at a
//! place of its own, so that two nodes rarely write one block.

use std::collections::BTreeMap;

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

#[derive(
    CustomResource, Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema,
)]
#[kube(
    group = "allot.dev",
    version = "v1alpha1",
    kind = "IPBlock",
    plural = "ipblocks",
    doc = "The claims of an aligned run of one pool's addresses, each change one compare-and-swap.",
    printcolumn = r#"{"name":"CIDR","type":"string","jsonPath":".spec.cidr"}"#,
    printcolumn = r#"{"name":"NODE","type":"string","jsonPath":".spec.node"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct IPBlockSpec {
    /// The aligned run this block covers (its name says the same: `v4-10-0-0-64-26`).
    #[schemars(regex(pattern = r"^[0-9A-Fa-f:.]+/[0-9]{1,3}$"))]
    pub cidr: String,
    /// The node that opened this block (for people reading it; any node may claim in it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// The claims, by address (canonical text form).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub claims: BTreeMap<String, BlockClaim>,
    /// Released addresses still cooling down: unix seconds of the release, by address.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub released: BTreeMap<String, u64>,
}

/// One claim: the same record as a claim in the embedded and etcd stores.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BlockClaim {
    /// The IPPool the address was handed out from.
    pub pool: String,
    /// The CNI network (the config's `name`).
    pub network: String,
    /// Absent while a StatefulSet pod's address is kept between its DEL and its next ADD.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interface: Option<String>,
    pub namespace: String,
    pub pod: String,
    pub uid: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner_kind: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner_name: Option<String>,
    /// The node whose agent made the claim, or last took it back for its pod: the CNI GC verb
    /// of a node judges its own node's claims only. Absent from claims made before allot
    /// recorded it.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub node: String,
    /// Unix seconds of the claim (or of its last attach or detach).
    pub updated_at: u64,
}
