//! Fleet ranges: `IPAMPool` (cluster-scoped, one pool per datacenter) and `IPAMAllocation` (in
//! a cluster's namespace, named after the pool), with Kubermatic's field names.
//!
//! The pool's `status.allocations` is the record of truth: every allocation is written there
//! first, with a resourceVersion compare-and-swap on the status subresource, so two allocators
//! can never hand out overlapping ranges. The `IPAMAllocation` (and the ConfigMap beside it) is
//! what users and their tools read; it is written from the record afterwards.
//!
//! Converting a datacenter's entry into core's checked [`FleetPool`] is one `TryFrom`, which
//! calls core's `from_spec`: a pool is valid in a cluster exactly when `allotctl fleet plan`
//! accepts it.

use std::collections::BTreeMap;

use allot_core::fleet::{
    Allocation, AllocationType, FleetPool, FleetSpecError, IpamAllocationSpec, IpamPoolDatacenter,
};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// `IPAMPool.spec`.
#[derive(
    CustomResource, Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema,
)]
#[kube(
    group = "allot.dev",
    version = "v1alpha1",
    kind = "IPAMPool",
    plural = "ipampools",
    doc = "Per-datacenter CIDRs that each cluster of a fleet gets its own range or prefix from.",
    status = "IPAMPoolStatus",
    printcolumn = r#"{"name":"CLUSTERS","type":"integer","jsonPath":".status.clusters"}"#,
    printcolumn = r#"{"name":"AGE","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct IPAMPoolSpec {
    /// Datacenter name → the pool its clusters get their allocation from.
    #[schemars(extend("maxProperties" = 1000))]
    pub datacenters: BTreeMap<String, IPAMPoolDatacenter>,
}

/// One datacenter's pool. `poolCidr`, `type` and `allocationPrefix` are immutable once set;
/// `allocationRange` may change (clusters below it grow by disjoint runs, clusters above it keep
/// what they hold).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schemars(extend("x-kubernetes-validations" = [
    {
        "rule": "self.type == 'range' ? (has(self.allocationRange) && !has(self.allocationPrefix)) : (has(self.allocationPrefix) && !has(self.allocationRange))",
        "message": "type range needs allocationRange (and no allocationPrefix); type prefix needs allocationPrefix (and no allocationRange)"
    },
    {
        "rule": "self.poolCidr == oldSelf.poolCidr",
        "message": "poolCidr is immutable: clusters hold addresses of it; for other addresses add another IPAMPool"
    },
    {
        "rule": "self.type == oldSelf.type",
        "message": "type is immutable: for allocations of the other type add another IPAMPool"
    },
    {
        "rule": "!has(oldSelf.allocationPrefix) || (has(self.allocationPrefix) && self.allocationPrefix == oldSelf.allocationPrefix)",
        "message": "allocationPrefix is immutable: prefixes cannot be resized in place; for another length add another IPAMPool"
    }
]))]
pub struct IPAMPoolDatacenter {
    /// `range`: `allocationRange` addresses per cluster, as "first-last" runs; `prefix`: one
    /// subnet of length `allocationPrefix` per cluster.
    #[serde(rename = "type")]
    pub allocation_type: AllocationType,
    /// The CIDR clusters get their allocations from, e.g. 192.168.0.0/16 or fd00:10::/48.
    #[schemars(regex(pattern = r"^[0-9A-Fa-f:.]+/[0-9]{1,3}$"), length(max = 64))]
    pub pool_cidr: String,
    /// Addresses per cluster (type `range`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub allocation_range: Option<u64>,
    /// Prefix length of each cluster's subnet (type `prefix`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 128))]
    pub allocation_prefix: Option<u8>,
    /// Addresses never handed out: "first-last" runs or single addresses, matched by overlap.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(inner(regex(pattern = r"^[0-9A-Fa-f:.]+(-[0-9A-Fa-f:.]+)?$")))]
    pub exclude_ranges: Vec<String>,
    /// Subnets never handed out (CIDRs of any length inside the pool), matched by overlap.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(inner(regex(pattern = r"^[0-9A-Fa-f:.]+/[0-9]{1,3}$")))]
    pub exclude_prefixes: Vec<String>,
    /// A deprecated pool serves no new cluster; clusters holding an allocation keep it (to
    /// migrate to a new poolCidr: deprecate this one, add another IPAMPool).
    #[serde(default, skip_serializing_if = "is_false")]
    pub deprecated: bool,
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// `IPAMPool.status`: the record of every allocation made from the pool, written only with a
/// resourceVersion compare-and-swap.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct IPAMPoolStatus {
    /// Cluster namespace → what the cluster holds (the same fields as its IPAMAllocation).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub allocations: BTreeMap<String, IPAMAllocationSpec>,
    /// How many clusters hold an allocation (for `kubectl get ipampools`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clusters: Option<u64>,
    /// Bumped on every change of `allocations`; an IPAMAllocation written from an older record
    /// never replaces one written from a newer record.
    #[serde(default)]
    pub record_version: u64,
}

/// `IPAMAllocation.spec`: created by the controller for each cluster of a datacenter the pool
/// serves, or by a user with `dc` set and no addresses (the controller fills them in).
#[derive(
    CustomResource, Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema,
)]
#[kube(
    group = "allot.dev",
    version = "v1alpha1",
    kind = "IPAMAllocation",
    plural = "ipamallocations",
    namespaced,
    doc = "A cluster's allocation from the IPAMPool of the same name: a prefix or address runs.",
    status = "IPAMAllocationStatus",
    printcolumn = r#"{"name":"TYPE","type":"string","jsonPath":".spec.type"}"#,
    printcolumn = r#"{"name":"DC","type":"string","jsonPath":".spec.dc"}"#,
    printcolumn = r#"{"name":"CIDR","type":"string","jsonPath":".spec.cidr"}"#,
    printcolumn = r#"{"name":"ADDRESSES","type":"string","jsonPath":".spec.addresses"}"#,
    printcolumn = r#"{"name":"STATE","type":"string","jsonPath":".status.state"}"#
)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schemars(extend("x-kubernetes-validations" = [{
    "rule": "!(has(self.cidr) && has(self.addresses) && size(self.addresses) > 0)",
    "message": "set cidr (type prefix) or addresses (type range), not both"
}]))]
pub struct IPAMAllocationSpec {
    /// The pool's type; a request may leave it out (the pool's entry says it).
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub allocation_type: Option<AllocationType>,
    /// The datacenter whose pool the allocation comes from.
    #[schemars(length(min = 1))]
    pub dc: String,
    /// The subnet (type `prefix`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[0-9A-Fa-f:.]+/[0-9]{1,3}$"))]
    pub cidr: Option<String>,
    /// "first-last" runs (type `range`), in the order they were allocated.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(inner(regex(pattern = r"^[0-9A-Fa-f:.]+(-[0-9A-Fa-f:.]+)?$")))]
    pub addresses: Vec<String>,
}

/// `IPAMAllocation.status`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct IPAMAllocationStatus {
    /// `Allocated` or `Refused`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(transform = no_null_in_enum)]
    pub state: Option<AllocationState>,
    /// Why it was refused and what to do, or what the allocation holds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The pool record (`IPAMPool.status.recordVersion`) the spec was written from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub record_version: Option<u64>,
    /// The uid of that IPAMPool (record versions of a pool deleted and created again start over).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool_uid: Option<String>,
}

/// An optional enum's schema lists `null` among its values; `nullable: true` already admits it,
/// and the API server wants an enum of the field's own type.
fn no_null_in_enum(schema: &mut schemars::Schema) {
    if let Some(serde_json::Value::Array(values)) = schema.get_mut("enum") {
        values.retain(|v| !v.is_null());
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum AllocationState {
    Allocated,
    Refused,
}

/// The one conversion from a datacenter's entry to core's checked pool (the same `from_spec`
/// `allotctl fleet plan` uses). `deprecated` is not a property of the addresses: read it from
/// the entry.
impl TryFrom<&IPAMPoolDatacenter> for FleetPool {
    type Error = FleetSpecError;

    fn try_from(dc: &IPAMPoolDatacenter) -> Result<FleetPool, FleetSpecError> {
        FleetPool::from_spec(&IpamPoolDatacenter {
            allocation_type: dc.allocation_type,
            pool_cidr: dc.pool_cidr.clone(),
            allocation_range: dc.allocation_range,
            allocation_prefix: dc.allocation_prefix,
            exclude_ranges: dc.exclude_ranges.clone(),
            exclude_prefixes: dc.exclude_prefixes.clone(),
        })
    }
}

impl IPAMAllocationSpec {
    /// What the spec holds: `None` for a request (no `cidr`, no `addresses`), otherwise the
    /// checked allocation. A spec whose `type` is left out reads as the type its fields say.
    pub fn allocation(&self) -> Result<Option<Allocation>, FleetSpecError> {
        if self.cidr.is_none() && self.addresses.is_empty() {
            return Ok(None);
        }
        let allocation_type = self.allocation_type.unwrap_or(if self.cidr.is_some() {
            AllocationType::Prefix
        } else {
            AllocationType::Range
        });
        Allocation::from_spec(&IpamAllocationSpec {
            allocation_type,
            dc: self.dc.clone(),
            cidr: self.cidr.clone(),
            addresses: self.addresses.clone(),
        })
        .map(Some)
    }

    /// The spec recording `allocation` from datacenter `dc`.
    pub fn recording(allocation: &Allocation, dc: &str) -> IPAMAllocationSpec {
        let spec = allocation.to_spec(dc);
        IPAMAllocationSpec {
            allocation_type: Some(spec.allocation_type),
            dc: spec.dc,
            cidr: spec.cidr,
            addresses: spec.addresses,
        }
    }
}
