//! The user-facing shapes of fleet ranges with Kubermatic's field names (KKP's multi-cluster
//! IPAM, `kubermatic/kubermatic` `docs/proposals/multi-cluster-ipam.md` and its
//! `kubermatic.k8c.io/v1` IPAMPool and IPAMAllocation types): `IPAMPool` (cluster-scoped, one
//! pool per datacenter) and `IPAMAllocation` (in the cluster's namespace, named after the pool). Unknown fields are rejected, so a typo is an error naming
//! the field.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use super::{Allocation, FleetKind, FleetPool, FleetSpecError};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub enum AllocationType {
    /// `allocationRange` addresses per cluster, as "first-last" runs.
    Range,
    /// One subnet of `allocationPrefix` per cluster.
    Prefix,
}

impl fmt::Display for AllocationType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            AllocationType::Range => "range",
            AllocationType::Prefix => "prefix",
        })
    }
}

/// `IPAMPool.spec`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct IpamPoolSpec {
    /// Datacenter name → its pool.
    pub datacenters: BTreeMap<String, IpamPoolDatacenter>,
}

/// One datacenter's entry of an `IPAMPool`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct IpamPoolDatacenter {
    #[serde(rename = "type")]
    pub allocation_type: AllocationType,
    pub pool_cidr: String,
    /// Addresses per cluster (type `range`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allocation_range: Option<u64>,
    /// Prefix length per cluster (type `prefix`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allocation_prefix: Option<u8>,
    /// Entries "first-last" or a single address; never handed out, matched by overlap.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub exclude_ranges: Vec<String>,
    /// CIDRs of any length inside the pool; never handed out, matched by overlap.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub exclude_prefixes: Vec<String>,
}

/// `IPAMAllocation.spec`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct IpamAllocationSpec {
    #[serde(rename = "type")]
    pub allocation_type: AllocationType,
    /// The datacenter whose pool it was allocated from.
    pub dc: String,
    /// The subnet (type `prefix`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cidr: Option<String>,
    /// "first-last" runs (type `range`), in the order they were allocated.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub addresses: Vec<String>,
}

impl FleetPool {
    /// The one conversion from a datacenter's entry to a checked pool, for the controller and
    /// the webhook alike.
    pub fn from_spec(spec: &IpamPoolDatacenter) -> Result<FleetPool, FleetSpecError> {
        let kind = match spec.allocation_type {
            AllocationType::Range => {
                if spec.allocation_prefix.is_some() {
                    return Err(FleetSpecError::Misplaced {
                        kind: AllocationType::Range,
                        other: AllocationType::Prefix,
                        field: "allocationPrefix",
                    });
                }
                let per_cluster = spec.allocation_range.ok_or(FleetSpecError::Missing {
                    kind: AllocationType::Range,
                    field: "allocationRange",
                    hint: "set how many addresses each cluster gets",
                })?;
                FleetKind::Range {
                    per_cluster: per_cluster.into(),
                }
            }
            AllocationType::Prefix => {
                if spec.allocation_range.is_some() {
                    return Err(FleetSpecError::Misplaced {
                        kind: AllocationType::Prefix,
                        other: AllocationType::Range,
                        field: "allocationRange",
                    });
                }
                let len = spec.allocation_prefix.ok_or(FleetSpecError::Missing {
                    kind: AllocationType::Prefix,
                    field: "allocationPrefix",
                    hint: "set the prefix length of each cluster's subnet",
                })?;
                FleetKind::Prefix { len }
            }
        };
        FleetPool::parse(
            kind,
            &spec.pool_cidr,
            &spec.exclude_ranges,
            &spec.exclude_prefixes,
        )
    }

    /// The datacenter entry this pool was made from (exclusions as written, normalised).
    pub fn to_spec(&self) -> IpamPoolDatacenter {
        let (allocation_range, allocation_prefix) = match self.kind {
            FleetKind::Range { per_cluster } => {
                (Some(u64::try_from(per_cluster).unwrap_or(u64::MAX)), None)
            }
            FleetKind::Prefix { len } => (None, Some(len)),
        };
        IpamPoolDatacenter {
            allocation_type: self.kind.allocation_type(),
            pool_cidr: self.cidr.to_string(),
            allocation_range,
            allocation_prefix,
            exclude_ranges: self
                .exclude_ranges
                .iter()
                .map(|(f, l)| {
                    if f == l {
                        f.to_string()
                    } else {
                        format!("{f}-{l}")
                    }
                })
                .collect(),
            exclude_prefixes: self
                .exclude_prefixes
                .iter()
                .map(|n| n.to_string())
                .collect(),
        }
    }
}

impl Allocation {
    /// The allocation an `IPAMAllocation` holds, checked: `cidr` for type `prefix`,
    /// `addresses` for type `range`, never both.
    pub fn from_spec(spec: &IpamAllocationSpec) -> Result<Allocation, FleetSpecError> {
        match spec.allocation_type {
            AllocationType::Range => {
                if spec.cidr.is_some() {
                    return Err(FleetSpecError::Misplaced {
                        kind: AllocationType::Range,
                        other: AllocationType::Prefix,
                        field: "cidr",
                    });
                }
                Allocation::parse_addresses(&spec.addresses)
            }
            AllocationType::Prefix => {
                if !spec.addresses.is_empty() {
                    return Err(FleetSpecError::Misplaced {
                        kind: AllocationType::Prefix,
                        other: AllocationType::Range,
                        field: "addresses",
                    });
                }
                let cidr = spec.cidr.as_deref().ok_or(FleetSpecError::Missing {
                    kind: AllocationType::Prefix,
                    field: "cidr",
                    hint: "set the subnet the cluster holds",
                })?;
                Allocation::parse_cidr(cidr)
            }
        }
    }

    /// The `IPAMAllocation.spec` that records this allocation from datacenter `dc`.
    pub fn to_spec(&self, dc: &str) -> IpamAllocationSpec {
        IpamAllocationSpec {
            allocation_type: self.allocation_type(),
            dc: dc.to_string(),
            cidr: match self {
                Allocation::Prefix(net) => Some(net.to_string()),
                Allocation::Range(_) => None,
            },
            addresses: self.addresses(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_kubermatic_shaped_pools_and_rejects_typos() {
        let spec: IpamPoolSpec = serde_yaml::from_str(
            "datacenters:
  vsphere-hamburg:
    type: range
    poolCidr: 192.168.1.0/24
    allocationRange: 10
    excludeRanges: [192.168.1.100-192.168.1.110, 192.168.1.255]
  vsphere-berlin:
    type: prefix
    poolCidr: fd00:10::/48
    allocationPrefix: 64
    excludePrefixes: [fd00:10::/56]
",
        )
        .unwrap();
        let hamburg = FleetPool::from_spec(&spec.datacenters["vsphere-hamburg"]).unwrap();
        assert_eq!(hamburg.kind(), FleetKind::Range { per_cluster: 10 });
        assert_eq!(hamburg.exclude_ranges().len(), 2);
        let berlin = FleetPool::from_spec(&spec.datacenters["vsphere-berlin"]).unwrap();
        assert_eq!(berlin.kind(), FleetKind::Prefix { len: 64 });
        assert_eq!(FleetPool::from_spec(&berlin.to_spec()).unwrap(), berlin);
        assert_eq!(FleetPool::from_spec(&hamburg.to_spec()).unwrap(), hamburg);

        let typo = serde_yaml::from_str::<IpamPoolDatacenter>(
            "type: range\npoolCidr: 10.0.0.0/24\nallocationRnage: 4\n",
        )
        .unwrap_err();
        assert!(typo.to_string().contains("allocationRnage"), "{typo}");
    }

    #[test]
    fn a_setting_of_the_other_type_or_a_missing_one_is_named() {
        let mut dc = IpamPoolDatacenter {
            allocation_type: AllocationType::Range,
            pool_cidr: "10.0.0.0/24".into(),
            allocation_range: None,
            allocation_prefix: Some(28),
            exclude_ranges: vec![],
            exclude_prefixes: vec![],
        };
        let err = FleetPool::from_spec(&dc).unwrap_err();
        assert_eq!(
            err.to_string(),
            "allocationPrefix is for type prefix, but the type is range: remove it"
        );
        dc.allocation_prefix = None;
        let err = FleetPool::from_spec(&dc).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("type range needs allocationRange"),
            "{err}"
        );
        dc.allocation_type = AllocationType::Prefix;
        let err = FleetPool::from_spec(&dc).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("type prefix needs allocationPrefix"),
            "{err}"
        );
    }

    #[test]
    fn allocations_round_trip_through_their_spec() {
        let range = Allocation::parse_addresses(&["10.0.0.200-10.0.0.210", "10.0.0.240"]).unwrap();
        let spec = range.to_spec("hamburg");
        assert_eq!(
            spec.addresses,
            ["10.0.0.200-10.0.0.210", "10.0.0.240-10.0.0.240"]
        );
        assert_eq!(spec.cidr, None);
        assert_eq!(Allocation::from_spec(&spec).unwrap(), range);
        let yaml = serde_yaml::to_string(&spec).unwrap();
        assert!(
            yaml.starts_with("type: range\ndc: hamburg\naddresses:"),
            "{yaml}"
        );

        let prefix = Allocation::parse_cidr("fd00:10:0:1::/64").unwrap();
        let spec = prefix.to_spec("berlin");
        assert_eq!(spec.cidr.as_deref(), Some("fd00:10:0:1::/64"));
        assert_eq!(Allocation::from_spec(&spec).unwrap(), prefix);

        let both = IpamAllocationSpec {
            addresses: vec!["10.0.0.1".into()],
            ..spec
        };
        let err = Allocation::from_spec(&both).unwrap_err();
        assert!(
            err.to_string().starts_with("addresses is for type range"),
            "{err}"
        );
    }
}
