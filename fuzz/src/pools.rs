//! Target `pools`: pool, subnet and reservation objects through the one conversion every loader
//! uses (`Pool::from_spec`, `Subnet::from_spec`, `Reserved::from_spec`, which parse addresses
//! with `AddrSet::parse_entries`), then the cross-pool checks (`check_pools`) and the policy
//! inventory built from what survives.
//!
//! Input: a JSON array of objects shaped as the standalone loader's documents,
//! `{"kind": "IPPool" | "Subnet" | "ReservedIP", "metadata": {...}, "spec": {...}}` (JSON rather
//! than YAML so that the fuzzer spends its time in allot's code, not in a YAML parser; the specs
//! are the same serde types). Elements that do not deserialize are skipped.
//!
//! Invariants beyond "no panic":
//! - every address set of an accepted object round-trips through `to_entries`, and the set
//!   algebra on a pool's sets is consistent (difference, intersection, union, counts);
//! - an accepted pool's addresses and gateway lie in its subnet, the gateway is never
//!   allocatable, and its routes are of its family;
//! - `check_pools` accepts or rejects every pool, and what it accepts has unique names, subnets
//!   of one family identical or disjoint, and no address in two pools;
//! - the inventory lists the accepted pools by name, finds each by name, and its counts are
//!   consistent.

use allot_core::Inventory;
use allot_core::addr::{AddrSet, IpFamily};
use allot_core::pool::{self, Pool, Reserved, Subnet};
use allot_core::spec::{IpPoolSpec, ObjectMeta, ReservedIpSpec, SubnetSpec};
use serde::Deserialize;
use serde_json::Value;

#[derive(Deserialize)]
struct Object {
    kind: String,
    metadata: ObjectMeta,
    spec: Value,
}

pub fn run(data: &[u8]) {
    let Ok(objects) = serde_json::from_slice::<Vec<Value>>(data) else {
        return;
    };
    let (mut pools, mut subnets, mut reserved) = (Vec::new(), Vec::new(), Vec::new());
    for object in objects {
        let Ok(Object {
            kind,
            metadata,
            spec,
        }) = serde_json::from_value(object)
        else {
            continue;
        };
        match kind.as_str() {
            "IPPool" => {
                if let Ok(spec) = serde_json::from_value::<IpPoolSpec>(spec)
                    && let Ok(pool) = Pool::from_spec(metadata, spec)
                {
                    check_pool(&pool);
                    pools.push(pool);
                }
            }
            "Subnet" => {
                if let Ok(spec) = serde_json::from_value::<SubnetSpec>(spec)
                    && let Ok(subnet) = Subnet::from_spec(metadata, spec)
                {
                    check_set(&subnet.ips);
                    assert!(subnet.ips.is_subset(&AddrSet::from_net(&subnet.subnet)));
                    subnets.push(subnet);
                }
            }
            "ReservedIP" => {
                if let Ok(spec) = serde_json::from_value::<ReservedIpSpec>(spec)
                    && let Ok(r) = Reserved::from_spec(metadata, spec)
                {
                    check_set(&r.ips);
                    assert!(!r.ips.is_empty() && r.ips.family() == r.family);
                    reserved.push(r);
                }
            }
            _ => {}
        }
    }
    let given = pools.len();
    let (accepted, errors) = pool::check_pools(pools);
    assert_eq!(accepted.len() + errors.len(), given);
    for (i, a) in accepted.iter().enumerate() {
        for b in &accepted[..i] {
            assert_ne!(a.name(), b.name());
            if a.family != b.family {
                continue;
            }
            assert!(
                a.subnet == b.subnet
                    || !AddrSet::from_net(&a.subnet).overlaps(&AddrSet::from_net(&b.subnet)),
                "{} and {} overlap",
                a.subnet,
                b.subnet
            );
            assert!(!a.ips.overlaps(&b.ips), "{} and {}", a.name(), b.name());
        }
    }
    check_inventory(&accepted, &subnets, &reserved);
}

fn check_pool(pool: &Pool) {
    assert!(!pool.name().is_empty());
    assert_eq!(pool.family, IpFamily::of_net(&pool.subnet));
    assert_eq!(
        pool.subnet,
        pool.subnet.trunc(),
        "the subnet is stored truncated"
    );
    check_set(&pool.ips);
    check_set(&pool.excluded);
    check_algebra(&pool.ips, &pool.excluded);
    assert!(pool.ips.is_subset(&AddrSet::from_net(&pool.subnet)));
    let allocatable = pool.allocatable();
    assert!(allocatable.is_subset(&pool.ips));
    assert!(!allocatable.overlaps(&pool.excluded));
    if let Some(gw) = pool.gateway {
        assert!(pool.subnet.contains(&gw));
        assert!(!allocatable.contains(gw));
    }
    for route in &pool.routes {
        assert_eq!(IpFamily::of_net(&route.dst), pool.family);
        assert_eq!(IpFamily::of(route.gw), pool.family);
    }
}

/// A set written back as entries parses to the same set.
fn check_set(set: &AddrSet) {
    let entries = set.to_entries();
    let again = AddrSet::parse_entries(set.family(), &entries)
        .unwrap_or_else(|e| panic!("{entries:?} does not parse again: {e}"));
    assert_eq!(&again, set);
    assert_eq!(set.is_empty(), entries.is_empty());
    assert_eq!(set.first(), set.ranges().next().map(|(lo, _)| lo));
    for (lo, hi) in set.ranges() {
        assert!(lo <= hi && set.contains(lo) && set.contains(hi));
    }
}

fn check_algebra(a: &AddrSet, b: &AddrSet) {
    let (union, inter, diff) = (a.union(b), a.intersection(b), a.difference(b));
    assert!(inter.is_subset(a) && inter.is_subset(b));
    assert!(diff.is_subset(a) && !diff.overlaps(b));
    assert!(a.is_subset(&union) && b.is_subset(&union));
    assert_eq!(diff.union(&inter), *a);
    // Counts saturate at u64::MAX (an IPv6 /0); compare them only where none can.
    const SMALL: u64 = 1 << 62;
    if union.len() < SMALL {
        assert_eq!(union.len() + inter.len(), a.len() + b.len());
        assert_eq!(diff.len() + inter.len(), a.len());
    }
    for set in [&union, &inter, &diff] {
        check_set(set);
    }
}

fn check_inventory(pools: &[Pool], subnets: &[Subnet], reserved: &[Reserved]) {
    let inventory = Inventory::build(1, pools, subnets, reserved);
    assert_eq!(inventory.pools.len(), pools.len());
    assert!(inventory.pools.is_sorted_by(|a, b| a.name <= b.name));
    for pool in pools {
        let i = inventory
            .pool_index(pool.name())
            .unwrap_or_else(|| panic!("{} is not in the inventory", pool.name()));
        let listed = &inventory.pools[i as usize];
        assert_eq!(listed.family, pool.family);
        assert_eq!(listed.total_count, pool.allocatable().len());
        assert!(!(listed.all_reserved && listed.total_count == 0));
        let same_family = reserved.iter().filter(|r| r.family == pool.family);
        let reserved_set = pool::reserved_set(pool.family, same_family);
        let facts = pool.facts(&reserved_set, 0);
        assert!(facts.free <= facts.total);
        assert_eq!(facts.free, pool.assignable(&reserved_set).len());
    }
}
