//! Blocks: the aligned runs of addresses that the Kubernetes store groups claims into.
//!
//! Every address belongs to exactly one block, whatever pool it is handed out from: a block is
//! named after its address run alone, so create-if-absent per address holds even where pools
//! overlap or share a block. 64 addresses per block (a /26 of IPv4, a /122 of IPv6, Calico's
//! IPv4 size) keeps an object at a few kilobytes, and 150,000 dense claims in about 2,350 objects.

use std::collections::BTreeSet;
use std::net::IpAddr;

use ipnet::IpNet;

use crate::addr::{AddrSet, IpFamily, addr_to_u128, u128_to_addr};
use crate::dra::node_scope;
use crate::policy::Labels;
use crate::pool::{Pool, Subnet};

/// Addresses per block, as host bits: 2^6 = 64.
pub const BLOCK_HOST_BITS: u8 = 6;

/// Addresses per region, as host bits: 2^12 = 4,096, 64 blocks (a /20 of IPv4, a /116 of
/// IPv6). Every IPBlock carries its region as the label [`REGION_LABEL`], so an agent selects
/// the blocks of the pools its node may use with one set-based label selector
/// (`allot.dev/region in (…)`): a label is the only way to select custom objects by content,
/// and a region of 64 blocks keeps that selector short for any pool up to a /12.
pub const REGION_HOST_BITS: u8 = 12;

/// The label naming an IPBlock's region ([`region_of`]).
pub const REGION_LABEL: &str = "allot.dev/region";

/// Regions an agent selects by name at most; a node whose pools span more is served by
/// following every block (a selector of thousands of values costs the API server more per
/// event than the events it filters out).
pub const MAX_REGIONS: usize = 256;

/// The aligned run of `2^host_bits` addresses holding `address`.
fn run_of(address: IpAddr, host_bits: u8) -> IpNet {
    let family = IpFamily::of(address);
    let bits = match family {
        IpFamily::V4 => 32,
        IpFamily::V6 => 128,
    };
    let start = addr_to_u128(address) & !((1u128 << host_bits) - 1);
    IpNet::new(u128_to_addr(family, start), bits - host_bits).expect("a valid prefix")
}

/// The block holding `address`.
pub fn block_of(address: IpAddr) -> IpNet {
    run_of(address, BLOCK_HOST_BITS)
}

/// The region label value of the block (or any address) holding `address`: named as blocks
/// are (`v4-10-0-0-0-20`), at most 46 characters, a valid label value.
pub fn region_of(address: IpAddr) -> String {
    block_name(&run_of(address, REGION_HOST_BITS))
}

/// Which IPBlocks a store follows.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum BlockScope {
    /// Every block of the cluster (the controller; an agent whose pools span too much).
    #[default]
    All,
    /// The blocks labelled with one of these regions.
    Regions(BTreeSet<String>),
}

impl BlockScope {
    /// The scope of `sets`: every region one of their addresses lies in, or [`BlockScope::All`]
    /// past [`MAX_REGIONS`].
    pub fn covering<'a>(sets: impl IntoIterator<Item = &'a AddrSet>) -> BlockScope {
        let mut regions = BTreeSet::new();
        let step = 1u128 << REGION_HOST_BITS;
        for set in sets {
            let family = set.family();
            for (first, last) in set.ranges() {
                let (first, last) = (addr_to_u128(first) & !(step - 1), addr_to_u128(last));
                let mut at = first;
                loop {
                    regions.insert(region_of(u128_to_addr(family, at)));
                    if regions.len() > MAX_REGIONS {
                        return BlockScope::All;
                    }
                    match at.checked_add(step) {
                        Some(next) if next <= last => at = next,
                        _ => break,
                    }
                }
            }
        }
        BlockScope::Regions(regions)
    }

    /// The blocks an agent of `node` (labelled `labels`) follows: those of every pool whose
    /// `nodeAffinity` and `nodeName` admit the node, and of every Subnet (whose auto-created
    /// pools any node may serve). A pool's `ips` as written count, excluded addresses included:
    /// a claim made before an exclusion stays in its block.
    pub fn of_node<'a>(
        pools: impl IntoIterator<Item = &'a Pool>,
        subnets: impl IntoIterator<Item = &'a Subnet>,
        node: &str,
        labels: &Labels,
    ) -> BlockScope {
        let sets = pools
            .into_iter()
            .filter(|p| {
                node_scope(p.spec.node_affinity.as_ref(), &p.spec.node_name).admits(node, labels)
            })
            .map(|p| &p.ips)
            .chain(subnets.into_iter().map(|s| &s.ips));
        BlockScope::covering(sets)
    }

    /// Both scopes' blocks.
    pub fn union(self, other: BlockScope) -> BlockScope {
        match (self, other) {
            (BlockScope::Regions(mut a), BlockScope::Regions(b)) => {
                a.extend(b);
                if a.len() > MAX_REGIONS {
                    BlockScope::All
                } else {
                    BlockScope::Regions(a)
                }
            }
            _ => BlockScope::All,
        }
    }

    /// The label selector of the scope (`None`: every block).
    pub fn selector(&self) -> Option<String> {
        match self {
            BlockScope::All => None,
            // An empty set selects nothing, and `in ()` is no valid selector: a value no block
            // carries selects the same.
            BlockScope::Regions(r) if r.is_empty() => Some(format!("{REGION_LABEL} in (none)")),
            BlockScope::Regions(r) => Some(format!(
                "{REGION_LABEL} in ({})",
                r.iter().cloned().collect::<Vec<_>>().join(",")
            )),
        }
    }

    /// Whether the scope holds the block holding `address`.
    pub fn holds(&self, address: IpAddr) -> bool {
        match self {
            BlockScope::All => true,
            BlockScope::Regions(r) => r.contains(&region_of(address)),
        }
    }
}

/// The object name of a block: `v4-10-0-0-64-26`, `v6-fd00-0000-…-0040-122` (every IPv6 group
/// written out, so that one block has one name).
pub fn block_name(block: &IpNet) -> String {
    match block {
        IpNet::V4(n) => {
            let o = n.network().octets();
            format!("v4-{}-{}-{}-{}-{}", o[0], o[1], o[2], o[3], n.prefix_len())
        }
        IpNet::V6(n) => {
            let groups: Vec<String> = n
                .network()
                .segments()
                .iter()
                .map(|g| format!("{g:04x}"))
                .collect();
            format!("v6-{}-{}", groups.join("-"), n.prefix_len())
        }
    }
}

/// The block an object name stands for, if it is a block's name ([`block_name`] read back).
pub fn block_named(name: &str) -> Option<IpNet> {
    let (family, rest) = name.split_once('-')?;
    let (address, len) = rest.rsplit_once('-')?;
    let len: u8 = len.parse().ok()?;
    let address: IpAddr = match family {
        "v4" => address.replace('-', ".").parse().ok()?,
        "v6" => address.replace('-', ":").parse().ok()?,
        _ => return None,
    };
    let block = IpNet::new(address, len).ok()?;
    (block_of(address) == block && block_name(&block) == name).then_some(block)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn set(entries: &[&str]) -> AddrSet {
        let family = IpFamily::of(ip(entries[0].split(['-', '/']).next().unwrap()));
        AddrSet::parse_entries(family, entries).unwrap()
    }

    fn regions(scope: &BlockScope) -> Vec<String> {
        match scope {
            BlockScope::All => panic!("every block"),
            BlockScope::Regions(r) => r.iter().cloned().collect(),
        }
    }

    #[test]
    fn a_region_is_the_aligned_run_of_64_blocks_named_as_blocks_are() {
        assert_eq!(region_of(ip("10.0.0.1")), "v4-10-0-0-0-20");
        assert_eq!(region_of(ip("10.0.15.255")), "v4-10-0-0-0-20");
        assert_eq!(region_of(ip("10.0.16.0")), "v4-10-0-16-0-20");
        assert_eq!(
            region_of(ip("2001:db8::fff")),
            "v6-2001-0db8-0000-0000-0000-0000-0000-0000-116"
        );
        // A label value: at most 63 characters, alphanumerics and dashes.
        let longest = region_of(ip("ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"));
        assert!(longest.len() <= 63, "{longest}");
        // Every address of a block is in the block's region.
        for a in ["10.0.15.192", "10.0.15.255"] {
            assert_eq!(region_of(block_of(ip(a)).network()), region_of(ip(a)));
        }
    }

    #[test]
    fn a_pools_scope_names_every_region_its_addresses_touch() {
        let small = set(&["198.51.100.10-198.51.100.20"]);
        assert_eq!(
            regions(&BlockScope::covering([&small])),
            ["v4-198-51-96-0-20"]
        );
        // A range across a region's edge, and a /16: two regions, then sixteen.
        let edge = set(&["198.51.111.250-198.51.112.5"]);
        assert_eq!(
            regions(&BlockScope::covering([&edge])),
            ["v4-198-51-112-0-20", "v4-198-51-96-0-20"]
        );
        let wide = set(&["10.1.0.0/16"]);
        assert_eq!(regions(&BlockScope::covering([&wide])).len(), 16);
        // Both families, and nothing at all.
        let v6 = set(&["2001:db8::/120"]);
        assert_eq!(regions(&BlockScope::covering([&small, &v6])).len(), 2);
        assert_eq!(
            BlockScope::covering([]).selector().unwrap(),
            "allot.dev/region in (none)"
        );
        // Past the cap, every block: a /8 spans 4,096 regions.
        let huge = set(&["10.0.0.0/8"]);
        assert_eq!(BlockScope::covering([&huge]), BlockScope::All);
        let top = set(&["255.255.255.0/24"]);
        assert_eq!(
            regions(&BlockScope::covering([&top])),
            ["v4-255-255-240-0-20"]
        );
    }

    #[test]
    fn a_nodes_scope_holds_the_pools_that_admit_it_and_every_subnet() {
        use crate::spec::{
            IpPoolSpec, LabelSelector, LabelSelectorRequirement, ObjectMeta, SelectorOperator,
            SubnetSpec,
        };
        let pool = |name: &str, ips: &str, spec: IpPoolSpec| {
            let meta = ObjectMeta {
                name: name.into(),
                ..Default::default()
            };
            let spec = IpPoolSpec {
                subnet: "10.0.0.0/8".into(),
                ips: vec![ips.into()],
                ..spec
            };
            Pool::from_spec(meta, spec).unwrap()
        };
        let rack = |v: &str| LabelSelector {
            match_expressions: vec![LabelSelectorRequirement {
                key: "rack".into(),
                operator: SelectorOperator::In,
                values: vec![v.into()],
            }],
            ..Default::default()
        };
        let pools = [
            pool("everywhere", "10.0.0.0/24", IpPoolSpec::default()),
            pool(
                "node-2-only",
                "10.0.16.0/24",
                IpPoolSpec {
                    node_name: vec!["node-2".into()],
                    ..Default::default()
                },
            ),
            pool(
                "rack-a",
                "10.0.32.0/24",
                IpPoolSpec {
                    node_affinity: Some(rack("a")),
                    ..Default::default()
                },
            ),
        ];
        let subnet = Subnet::from_spec(
            ObjectMeta {
                name: "apps".into(),
                ..Default::default()
            },
            SubnetSpec {
                subnet: "10.0.48.0/24".into(),
                ..Default::default()
            },
        )
        .unwrap();
        let labels = |rack: &str| Labels::from([("rack".to_string(), rack.to_string())]);
        let node_1 = BlockScope::of_node(&pools, [&subnet], "node-1", &labels("a"));
        assert_eq!(
            regions(&node_1),
            ["v4-10-0-0-0-20", "v4-10-0-32-0-20", "v4-10-0-48-0-20"]
        );
        let node_2 = BlockScope::of_node(&pools, [], "node-2", &labels("b"));
        assert_eq!(regions(&node_2), ["v4-10-0-0-0-20", "v4-10-0-16-0-20"]);
    }

    #[test]
    fn a_scope_selects_its_regions_and_holds_their_addresses() {
        let scope = BlockScope::covering([&set(&["198.51.100.0/24"])])
            .union(BlockScope::covering([&set(&["203.0.113.0/24"])]));
        assert_eq!(
            scope.selector().unwrap(),
            "allot.dev/region in (v4-198-51-96-0-20,v4-203-0-112-0-20)"
        );
        assert!(scope.holds(ip("198.51.100.7")));
        assert!(scope.holds(ip("198.51.111.7")), "the same region");
        assert!(!scope.holds(ip("192.0.2.7")));
        assert_eq!(scope.clone().union(BlockScope::All), BlockScope::All);
        assert!(BlockScope::All.holds(ip("192.0.2.7")));
        assert_eq!(BlockScope::All.selector(), None);
    }

    #[test]
    fn an_ipv4_address_is_in_its_aligned_slash_26() {
        assert_eq!(block_of(ip("10.0.0.0")).to_string(), "10.0.0.0/26");
        assert_eq!(block_of(ip("10.0.0.63")).to_string(), "10.0.0.0/26");
        assert_eq!(block_of(ip("10.0.0.64")).to_string(), "10.0.0.64/26");
        assert_eq!(block_of(ip("10.1.255.255")).to_string(), "10.1.255.192/26");
    }

    #[test]
    fn an_ipv6_address_is_in_its_aligned_slash_122() {
        assert_eq!(block_of(ip("fd00::1")).to_string(), "fd00::/122");
        assert_eq!(block_of(ip("fd00::40")).to_string(), "fd00::40/122");
        assert_eq!(block_of(ip("fd00::7f")).to_string(), "fd00::40/122");
    }

    #[test]
    fn block_names_are_distinct_per_block_and_valid_object_names() {
        let a = block_name(&block_of(ip("10.0.0.64")));
        assert_eq!(a, "v4-10-0-0-64-26");
        let b = block_name(&block_of(ip("fd00::41")));
        assert_eq!(b, "v6-fd00-0000-0000-0000-0000-0000-0000-0040-122");
        assert_ne!(
            block_name(&block_of(ip("fd00::1:0"))),
            block_name(&block_of(ip("fd00:0:0:1::")))
        );
        assert_eq!(block_named(&a), Some(block_of(ip("10.0.0.64"))));
        assert_eq!(block_named(&b), Some(block_of(ip("fd00::41"))));
        for bad in [
            "v4-10-0-0-65-26",
            "v4-10-0-0-64-24",
            "v6-fd00--40-122",
            "v4-10-0-0-64",
            "ipblock",
            "v5-10-0-0-64-26",
        ] {
            assert_eq!(block_named(bad), None, "{bad}");
        }
        for name in [a, b] {
            assert!(name.len() <= 253);
            assert!(
                name.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
            );
        }
    }
}
