//! What allot publishes about a pool to the scheduler through Dynamic Resource Allocation
//! (issue 38 item 1): one device per pool, allocatable many times over, whose consumable
//! capacity `addresses` counts the addresses the pool can still hand out.
//!
//! Pure: the controller turns a [`Publication`] into a `resource.k8s.io/v1` ResourceSlice.
//! Sources: KEP-4381 (structured parameters, ResourceSlice), KEP-5075 (consumable capacity,
//! `allowMultipleAllocations`), <https://kubernetes.io/docs/concepts/scheduling-eviction/dynamic-resource-allocation/>.

use std::collections::BTreeMap;

use crate::addr::{AddrSet, IpFamily};
use crate::policy::Labels;
use crate::pool::{Pool, Reserved};
use crate::spec::{LabelSelector, SelectorOperator};

/// The DRA driver name allot publishes under, and the suffix of its slices' names.
pub const DRIVER: &str = "ipam.allot.dev";

/// The name of the consumable capacity of a pool's device.
pub const CAPACITY: &str = "addresses";

/// The most addresses a device announces. An IPv6 /64 has 2^64; the scheduler parses the
/// capacity as a Quantity, and no node runs 2^32 pods, so more would say nothing more.
pub const CAPACITY_CAP: u64 = 1 << 32;

/// An attribute's value, as DRA types them (`string`, `int`, `bool`, `version`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Attribute {
    String(String),
    Int(i64),
    Bool(bool),
}

/// One device of a pool.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Device {
    /// `ipv4` or `ipv6`.
    pub name: String,
    pub attributes: BTreeMap<String, Attribute>,
    /// Addresses the pool can still hand out (capped at [`CAPACITY_CAP`]).
    pub addresses: u64,
}

/// A requirement on a node's labels (`labels`) or on its name (`names`); all must hold.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeRequirement {
    pub key: String,
    pub operator: SelectorOperator,
    pub values: Vec<String>,
}

/// The nodes a pool serves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NodeScope {
    /// Every node.
    All,
    /// Nodes matching every label requirement whose name is one of `names` (any name when
    /// empty). A pool's `nodeAffinity` and `nodeName` both restrict, as the agent applies them.
    Selector {
        labels: Vec<NodeRequirement>,
        names: Vec<String>,
    },
}

impl NodeScope {
    /// Whether the node named `node`, labelled `labels`, is one of the scope's, as the
    /// scheduler reads a node selector: `In` and `Exists` need the label, `NotIn` and
    /// `DoesNotExist` hold without it.
    pub fn admits(&self, node: &str, labels: &Labels) -> bool {
        let NodeScope::Selector {
            labels: reqs,
            names,
        } = self
        else {
            return true;
        };
        (names.is_empty() || names.iter().any(|n| n == node))
            && reqs.iter().all(|r| {
                let value = labels.get(&r.key);
                match r.operator {
                    SelectorOperator::In => value.is_some_and(|v| r.values.contains(v)),
                    SelectorOperator::NotIn => !value.is_some_and(|v| r.values.contains(v)),
                    SelectorOperator::Exists => value.is_some(),
                    SelectorOperator::DoesNotExist => value.is_none(),
                }
            })
    }
}

/// What allot publishes for one pool.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Publication {
    pub pool: String,
    pub nodes: NodeScope,
    pub devices: Vec<Device>,
}

impl Publication {
    /// The ResourceSlice's name: `<pool>.ipam.allot.dev` (a pool's name is a DNS subdomain).
    pub fn slice_name(&self) -> String {
        slice_name(&self.pool)
    }
}

/// The ResourceSlice name of `pool`.
pub fn slice_name(pool: &str) -> String {
    format!("{pool}.{DRIVER}")
}

/// The publication of `pool`, given every ReservedIP in force and every address claimed in the
/// store (of any pool: the store keys claims by address, so an address another pool's claim
/// holds cannot be handed out by this one either).
///
/// Claimed counts every claim: attached, detached (a StatefulSet pod's kept address) and
/// quarantined (a conflict seen on the link); none of them can be handed out. Cooling-down
/// addresses (released a short while ago) count as available: a cooldown only makes the
/// allocator prefer other addresses, it never refuses one, so the pool can still hand them out.
/// A disabled or terminating pool hands out nothing, and announces 0.
pub fn publication(pool: &Pool, reserved: &[Reserved], claimed: &AddrSet) -> Publication {
    let mut available = pool.allocatable();
    for r in reserved.iter().filter(|r| r.family == pool.family) {
        available = available.difference(&r.ips);
    }
    if claimed.family() == pool.family {
        available = available.difference(claimed);
    }
    let addresses = if pool.spec.disable || pool.terminating() {
        0
    } else {
        available.len().min(CAPACITY_CAP)
    };
    let (name, version) = match pool.family {
        IpFamily::V4 => ("ipv4", 4),
        IpFamily::V6 => ("ipv6", 6),
    };
    let mut attributes = BTreeMap::new();
    attributes.insert("pool".into(), Attribute::String(pool.name().to_string()));
    attributes.insert("ipVersion".into(), Attribute::Int(version));
    attributes.insert("subnet".into(), Attribute::String(pool.subnet.to_string()));
    if let Some(gw) = pool.gateway {
        attributes.insert("gateway".into(), Attribute::String(gw.to_string()));
    }
    attributes.insert("default".into(), Attribute::Bool(pool.spec.default));
    if !pool.spec.multus_name.is_empty() {
        // A string, not `strings`: list attributes are still behind a feature gate.
        attributes.insert(
            "multusNetworks".into(),
            Attribute::String(pool.spec.multus_name.join(",")),
        );
    }
    Publication {
        pool: pool.name().to_string(),
        nodes: node_scope(pool.spec.node_affinity.as_ref(), &pool.spec.node_name),
        devices: vec![Device {
            name: name.into(),
            attributes,
            addresses,
        }],
    }
}

/// The nodes of a pool's `nodeAffinity` and `nodeName`.
pub fn node_scope(affinity: Option<&LabelSelector>, names: &[String]) -> NodeScope {
    let mut labels: Vec<NodeRequirement> = Vec::new();
    if let Some(sel) = affinity {
        for (k, v) in &sel.match_labels {
            labels.push(NodeRequirement {
                key: k.clone(),
                operator: SelectorOperator::In,
                values: vec![v.clone()],
            });
        }
        for e in &sel.match_expressions {
            labels.push(NodeRequirement {
                key: e.key.clone(),
                operator: e.operator,
                values: e.values.clone(),
            });
        }
    }
    if labels.is_empty() && names.is_empty() {
        NodeScope::All
    } else {
        let mut names = names.to_vec();
        names.sort();
        names.dedup();
        NodeScope::Selector { labels, names }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::{IpPoolSpec, LabelSelectorRequirement, ObjectMeta, ReservedIpSpec};

    fn pool(spec: IpPoolSpec) -> Pool {
        Pool::from_spec(
            ObjectMeta {
                name: "p".into(),
                ..Default::default()
            },
            spec,
        )
        .unwrap()
    }

    fn v4(ips: &[&str], gw: Option<&str>) -> IpPoolSpec {
        IpPoolSpec {
            subnet: "10.0.0.0/24".into(),
            ips: ips.iter().map(|s| s.to_string()).collect(),
            gateway: gw.map(str::to_string),
            ..Default::default()
        }
    }

    fn reserved(ips: &[&str]) -> Reserved {
        Reserved::from_spec(
            ObjectMeta {
                name: "r".into(),
                ..Default::default()
            },
            ReservedIpSpec {
                ips: ips.iter().map(|s| s.to_string()).collect(),
                ..Default::default()
            },
        )
        .unwrap()
    }

    fn set(family: IpFamily, entries: &[&str]) -> AddrSet {
        AddrSet::parse_entries(family, entries).unwrap()
    }

    #[test]
    fn capacity_is_allocatable_minus_reserved_minus_claimed() {
        let p = pool(v4(&["10.0.0.1-10.0.0.20"], Some("10.0.0.1")));
        // 20 listed, the gateway excluded: 19.
        let none = AddrSet::empty(IpFamily::V4);
        assert_eq!(publication(&p, &[], &none).devices[0].addresses, 19);
        let r = reserved(&["10.0.0.2-10.0.0.4", "10.0.0.200"]);
        assert_eq!(
            publication(&p, std::slice::from_ref(&r), &none).devices[0].addresses,
            16
        );
        // Claims outside the pool, or on a reserved address, take nothing more.
        let claimed = set(
            IpFamily::V4,
            &["10.0.0.5", "10.0.0.6", "10.0.0.3", "10.0.1.9"],
        );
        assert_eq!(publication(&p, &[r], &claimed).devices[0].addresses, 14);
    }

    #[test]
    fn other_familys_reservations_and_claims_do_not_count() {
        let p = pool(v4(&["10.0.0.10-10.0.0.19"], None));
        let r6 = reserved(&["fd00::1"]);
        let claimed6 = set(IpFamily::V6, &["fd00::2"]);
        let publ = publication(&p, &[r6], &claimed6);
        assert_eq!(publ.devices[0].addresses, 10);
        assert_eq!(publ.devices[0].name, "ipv4");
    }

    #[test]
    fn a_disabled_pool_announces_nothing() {
        let mut spec = v4(&["10.0.0.10-10.0.0.19"], None);
        spec.disable = true;
        let p = pool(spec);
        assert_eq!(
            publication(&p, &[], &AddrSet::empty(IpFamily::V4)).devices[0].addresses,
            0
        );
    }

    #[test]
    fn an_ipv6_64_is_capped() {
        let p = pool(IpPoolSpec {
            subnet: "fd00::/64".into(),
            ..Default::default()
        });
        let publ = publication(&p, &[], &AddrSet::empty(IpFamily::V6));
        assert_eq!(publ.devices[0].name, "ipv6");
        assert_eq!(publ.devices[0].addresses, CAPACITY_CAP);
        assert_eq!(publ.devices[0].attributes["ipVersion"], Attribute::Int(6));
    }

    #[test]
    fn attributes_say_what_the_pool_is() {
        let mut spec = v4(&["10.0.0.10-10.0.0.19"], Some("10.0.0.1"));
        spec.default = true;
        spec.multus_name = vec!["kube-system/macvlan".into(), "web/vlan10".into()];
        let publ = publication(&pool(spec), &[], &AddrSet::empty(IpFamily::V4));
        let a = &publ.devices[0].attributes;
        assert_eq!(a["pool"], Attribute::String("p".into()));
        assert_eq!(a["subnet"], Attribute::String("10.0.0.0/24".into()));
        assert_eq!(a["gateway"], Attribute::String("10.0.0.1".into()));
        assert_eq!(a["default"], Attribute::Bool(true));
        assert_eq!(
            a["multusNetworks"],
            Attribute::String("kube-system/macvlan,web/vlan10".into())
        );
        assert_eq!(publ.slice_name(), "p.ipam.allot.dev");
        assert_eq!(publ.nodes, NodeScope::All);
    }

    #[test]
    fn a_scope_admits_nodes_as_the_scheduler_reads_a_selector() {
        let scope = |operator, values: &[&str]| NodeScope::Selector {
            labels: vec![NodeRequirement {
                key: "rack".into(),
                operator,
                values: values.iter().map(|v| v.to_string()).collect(),
            }],
            names: vec![],
        };
        let a = Labels::from([("rack".to_string(), "a".to_string())]);
        let none = Labels::new();
        assert!(scope(SelectorOperator::In, &["a"]).admits("n", &a));
        assert!(!scope(SelectorOperator::In, &["b"]).admits("n", &a));
        assert!(!scope(SelectorOperator::In, &["a"]).admits("n", &none));
        assert!(scope(SelectorOperator::NotIn, &["b"]).admits("n", &a));
        assert!(scope(SelectorOperator::NotIn, &["a"]).admits("n", &none));
        assert!(scope(SelectorOperator::Exists, &[]).admits("n", &a));
        assert!(scope(SelectorOperator::DoesNotExist, &[]).admits("n", &none));
        let named = NodeScope::Selector {
            labels: vec![],
            names: vec!["node-2".into()],
        };
        assert!(named.admits("node-2", &none) && !named.admits("node-1", &none));
        assert!(NodeScope::All.admits("any", &none));
    }

    #[test]
    fn node_affinity_and_names_become_one_selector() {
        let sel = LabelSelector {
            match_labels: [("zone".to_string(), "a".to_string())].into(),
            match_expressions: vec![LabelSelectorRequirement {
                key: "gpu".into(),
                operator: SelectorOperator::DoesNotExist,
                values: vec![],
            }],
        };
        let names = vec!["n2".to_string(), "n1".to_string(), "n2".to_string()];
        let NodeScope::Selector { labels, names } = node_scope(Some(&sel), &names) else {
            panic!("a selector");
        };
        assert_eq!(names, ["n1", "n2"]);
        assert_eq!(labels.len(), 2);
        assert_eq!(labels[0].operator, SelectorOperator::In);
        assert_eq!(labels[0].values, ["a"]);
        assert_eq!(labels[1].operator, SelectorOperator::DoesNotExist);
        assert_eq!(node_scope(None, &[]), NodeScope::All);
        assert_eq!(
            node_scope(Some(&LabelSelector::default()), &[]),
            NodeScope::All
        );
    }
}
