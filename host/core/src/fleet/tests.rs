//! The behaviours of Kubermatic's multi-cluster IPAM proposal (`kubermatic/kubermatic`
//! `docs/proposals/multi-cluster-ipam.md`) and of KKP's IPAMPool and IPAMAllocation as users know
//! them, one test each.

use super::*;

fn range(per_cluster: u128) -> FleetKind {
    FleetKind::Range { per_cluster }
}

fn prefix(len: u8) -> FleetKind {
    FleetKind::Prefix { len }
}

fn pool(kind: FleetKind, cidr: &str) -> FleetPool {
    FleetPool::parse::<&str>(kind, cidr, &[], &[]).unwrap()
}

fn excluding(kind: FleetKind, cidr: &str, ranges: &[&str], prefixes: &[&str]) -> FleetPool {
    FleetPool::parse(kind, cidr, ranges, prefixes).unwrap()
}

/// Allocates for each new cluster in turn, as the controller does, and returns every allocation.
fn fill(pool: &FleetPool, clusters: &[&str]) -> Vec<(String, Allocation)> {
    let mut existing = Vec::new();
    for &c in clusters {
        let a = allocate(pool, &existing, c, None).unwrap();
        existing.push((c.to_string(), a));
    }
    existing
}

fn addresses(a: &Allocation) -> Vec<String> {
    a.addresses()
}

fn net(s: &str) -> Allocation {
    Allocation::parse_cidr(s).unwrap()
}

#[test]
fn a_new_cluster_gets_the_lowest_free_run_of_allocation_range_addresses() {
    let p = pool(range(10), "192.168.1.0/24");
    let all = fill(&p, &["xyz", "abc"]);
    assert_eq!(addresses(&all[0].1), ["192.168.1.1-192.168.1.10"]);
    assert_eq!(addresses(&all[1].1), ["192.168.1.11-192.168.1.20"]);
}

#[test]
fn the_ipv4_network_and_broadcast_addresses_are_never_handed_out() {
    let p = pool(range(254), "192.168.1.0/24");
    let all = fill(&p, &["all"]);
    assert_eq!(addresses(&all[0].1), ["192.168.1.1-192.168.1.254"]);
    let err = allocate(&p, &all, "next", None).unwrap_err();
    assert!(
        matches!(err, FleetError::Exhausted { free: 0, .. }),
        "{err}"
    );
    let edge = Allocation::parse_addresses(&["192.168.1.0-192.168.1.3"]).unwrap();
    assert_eq!(
        check_allocation(&p, &[], "migrated", &edge)
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>(),
        ["192.168.1.0 are poolCidr 192.168.1.0/24's network or broadcast address"]
    );
}

#[test]
fn a_prefix_pool_hands_out_every_aligned_prefix_the_first_and_last_too() {
    // A /23 split into /24s serves two clusters: the subnets are the clusters' to use, so the
    // pool's network and broadcast addresses rule nothing out.
    let p = pool(prefix(24), "10.0.0.0/23");
    let all = fill(&p, &["a", "b"]);
    assert_eq!(all[0].1, net("10.0.0.0/24"));
    assert_eq!(all[1].1, net("10.0.1.0/24"));
    assert!(matches!(
        allocate(&p, &all, "c", None),
        Err(FleetError::NoFreePrefix { .. })
    ));
    let p = pool(prefix(26), "10.0.0.0/24");
    let all = fill(&p, &["a", "b", "c", "d"]);
    let got: Vec<String> = all.iter().map(|(_, a)| a.to_string()).collect();
    assert_eq!(
        got,
        [
            "10.0.0.0/26",
            "10.0.0.64/26",
            "10.0.0.128/26",
            "10.0.0.192/26"
        ]
    );
    // The pool's first prefix, held by a cluster migrating in (as Kubermatic hands it out), is
    // consistent with the pool and kept.
    let first = net("10.0.0.0/26");
    let held = vec![("migrated".to_string(), first.clone())];
    assert!(check_allocation(&p, &[], "migrated", &first).is_empty());
    assert_eq!(allocate(&p, &held, "migrated", Some(&first)), Ok(first));
    assert_eq!(allocate(&p, &held, "next", None), Ok(net("10.0.0.64/26")));
}

#[test]
fn point_to_point_and_host_pools_hand_out_every_address() {
    let all = fill(&pool(range(2), "10.0.0.0/31"), &["p2p"]);
    assert_eq!(addresses(&all[0].1), ["10.0.0.0-10.0.0.1"]);
    let all = fill(&pool(prefix(32), "10.0.0.7/32"), &["one"]);
    assert_eq!(all[0].1, net("10.0.0.7/32"));
}

#[test]
fn ipv6_pools_hand_out_from_the_first_address_and_prefixes_in_order() {
    let all = fill(&pool(range(16), "fd00:1::/64"), &["a", "b"]);
    assert_eq!(addresses(&all[0].1), ["fd00:1::-fd00:1::f"]);
    assert_eq!(addresses(&all[1].1), ["fd00:1::10-fd00:1::1f"]);
    let p = excluding(prefix(64), "fd00:2::/48", &[], &["fd00:2::/63"]);
    let all = fill(&p, &["a", "b"]);
    assert_eq!(all[0].1, net("fd00:2:0:2::/64"));
    assert_eq!(all[1].1, net("fd00:2:0:3::/64"));
}

#[test]
fn a_range_stays_in_one_run_when_some_free_run_holds_it() {
    // .1-.4 are free but too few: the cluster gets one run higher up rather than two.
    let p = excluding(range(6), "10.0.0.0/24", &["10.0.0.5"], &[]);
    let all = fill(&p, &["a", "b"]);
    assert_eq!(addresses(&all[0].1), ["10.0.0.6-10.0.0.11"]);
    assert_eq!(addresses(&all[1].1), ["10.0.0.12-10.0.0.17"]);
    // A smaller request still uses the low hole.
    let small = p.with_kind(range(4)).unwrap();
    let got = allocate(&small, &all, "c", None).unwrap();
    assert_eq!(addresses(&got), ["10.0.0.1-10.0.0.4"]);
}

#[test]
fn a_fragmented_pool_hands_out_several_disjoint_runs() {
    let p = excluding(
        range(6),
        "10.0.0.0/28",
        &["10.0.0.3-10.0.0.4", "10.0.0.8"],
        &["10.0.0.12/30"],
    );
    let all = fill(&p, &["a"]);
    assert_eq!(
        addresses(&all[0].1),
        [
            "10.0.0.1-10.0.0.2",
            "10.0.0.5-10.0.0.7",
            "10.0.0.9-10.0.0.9"
        ]
    );
    assert_eq!(all[0].1.len(), 6);
}

#[test]
fn exclusions_match_by_overlap_not_by_string() {
    // Kubermatic skips only a prefix written exactly like the candidate; here a /27, a single
    // address and a range each take out every /26 they touch.
    let p = excluding(
        prefix(26),
        "10.0.0.0/22",
        &["10.0.1.70", "10.0.1.190-10.0.1.200"],
        &["10.0.0.64/27"],
    );
    let all = fill(&p, &["a", "b", "c", "d", "e"]);
    let got: Vec<String> = all.iter().map(|(_, a)| a.to_string()).collect();
    assert_eq!(
        got,
        [
            "10.0.0.0/26",
            "10.0.0.128/26",
            "10.0.0.192/26",
            "10.0.1.0/26",
            "10.0.2.0/26"
        ]
    );
    assert!(
        all.iter()
            .all(|(c, a)| check_allocation(&p, &all, c, a).is_empty())
    );
}

#[test]
fn an_existing_allocation_is_kept_as_it_is() {
    let p = pool(range(10), "192.168.1.0/24");
    let mut all = fill(&p, &["a", "b"]);
    // Even when it is not where a fresh allocation would go.
    all[0].1 = Allocation::parse_addresses(&["192.168.1.240-192.168.1.249"]).unwrap();
    for (cluster, current) in &all {
        assert_eq!(
            allocate(&p, &all, cluster, Some(current)).as_ref(),
            Ok(current)
        );
    }
    let p = pool(prefix(28), "10.0.0.0/24");
    let current = net("10.0.0.208/28");
    let all = vec![("a".to_string(), current.clone())];
    assert_eq!(allocate(&p, &all, "a", Some(&current)), Ok(current));
}

#[test]
fn deleting_a_cluster_releases_its_addresses() {
    let p = pool(range(10), "192.168.1.0/24");
    let mut all = fill(&p, &["a", "b", "c"]);
    let (_, freed) = all.remove(1);
    assert_eq!(allocate(&p, &all, "d", None), Ok(freed));
}

#[test]
fn datacenters_sharing_a_pool_cidr_allocate_independently() {
    let hamburg = pool(range(10), "192.168.1.0/24");
    let berlin = pool(range(10), "192.168.1.0/24");
    let in_hamburg = fill(&hamburg, &["a"]);
    let in_berlin = fill(&berlin, &["b"]);
    assert_eq!(in_hamburg[0].1, in_berlin[0].1);
}

#[test]
fn raising_allocation_range_appends_runs_and_keeps_the_old_ones() {
    let p = pool(range(10), "192.168.1.0/24");
    let all = fill(&p, &["a", "b"]);
    let grown = p.with_kind(range(15)).unwrap();
    let a = allocate(&grown, &all, "a", Some(&all[0].1)).unwrap();
    // The old run is untouched, even though the new one could not follow it.
    assert_eq!(
        addresses(&a),
        ["192.168.1.1-192.168.1.10", "192.168.1.21-192.168.1.25"]
    );
    let all = vec![all[1].clone(), ("a".to_string(), a)];
    let b = allocate(&grown, &all, "b", Some(&all[0].1)).unwrap();
    // Adjacent to the old run, but written as its own entry: existing entries never change.
    assert_eq!(
        addresses(&b),
        ["192.168.1.11-192.168.1.20", "192.168.1.26-192.168.1.30"]
    );
    assert_eq!(
        b.to_string(),
        "192.168.1.11-192.168.1.20,192.168.1.26-192.168.1.30"
    );
}

#[test]
fn growing_in_a_fragmented_pool_appends_several_runs() {
    let p = excluding(range(4), "10.0.0.0/27", &["10.0.0.7", "10.0.0.10"], &[]);
    let all = fill(&p, &["a"]);
    assert_eq!(addresses(&all[0].1), ["10.0.0.1-10.0.0.4"]);
    let grown = p.with_kind(range(9)).unwrap();
    let a = allocate(&grown, &all, "a", Some(&all[0].1)).unwrap();
    // 5 more: the lowest free run that holds all 5 is .11-.15.
    assert_eq!(addresses(&a), ["10.0.0.1-10.0.0.4", "10.0.0.11-10.0.0.15"]);
    let grown = p.with_kind(range(25)).unwrap();
    let a = allocate(&grown, &all, "a", Some(&all[0].1)).unwrap();
    assert_eq!(
        addresses(&a),
        [
            "10.0.0.1-10.0.0.4",
            "10.0.0.5-10.0.0.6",
            "10.0.0.8-10.0.0.9",
            "10.0.0.11-10.0.0.27"
        ]
    );
    assert_eq!(a.len(), 25);
}

#[test]
fn lowering_allocation_range_leaves_clusters_their_addresses() {
    let p = pool(range(10), "192.168.1.0/24");
    let all = fill(&p, &["a"]);
    let lowered = p.with_kind(range(3)).unwrap();
    assert_eq!(
        allocate(&lowered, &all, "a", Some(&all[0].1)),
        Ok(all[0].1.clone())
    );
    assert!(check_edit(Some(&p), Some(&lowered), &all).is_empty());
}

#[test]
fn a_shorter_prefix_length_is_refused_and_the_cluster_keeps_its_prefix() {
    let p = pool(prefix(28), "10.0.0.0/24");
    let all = fill(&p, &["a"]);
    let wider = p.with_kind(prefix(27)).unwrap();
    let err = allocate(&wider, &all, "a", Some(&all[0].1)).unwrap_err();
    assert_eq!(
        err.to_string(),
        "cluster a keeps 10.0.0.0/28: allocationPrefix 27 asks for a larger subnet, and a prefix \
         cannot grow without moving the cluster; set allocationPrefix back to 28 (it is immutable)"
    );
    // A longer one needs less than the cluster holds: it keeps its prefix.
    let narrower = p.with_kind(prefix(29)).unwrap();
    assert_eq!(
        allocate(&narrower, &all, "a", Some(&all[0].1)),
        Ok(all[0].1.clone())
    );
}

#[test]
fn a_changed_type_is_refused_and_the_cluster_keeps_its_allocation() {
    let p = pool(range(10), "192.168.1.0/24");
    let all = fill(&p, &["a"]);
    let as_prefix = p.with_kind(prefix(28)).unwrap();
    let err = allocate(&as_prefix, &all, "a", Some(&all[0].1)).unwrap_err();
    assert!(matches!(err, FleetError::TypeChanged { .. }), "{err}");
    assert!(
        err.to_string()
            .contains("keeps its range allocation 192.168.1.1-192.168.1.10"),
        "{err}"
    );
}

#[test]
fn an_allocation_outside_a_changed_pool_is_kept_and_reported() {
    let all = fill(&pool(range(10), "192.168.1.0/24"), &["a"]);
    let moved = pool(range(20), "192.168.2.0/24");
    let err = allocate(&moved, &all, "a", Some(&all[0].1)).unwrap_err();
    assert!(matches!(err, FleetError::OutsidePool { .. }), "{err}");
    let v6 = pool(range(20), "fd00::/120");
    assert!(matches!(
        allocate(&v6, &all, "a", Some(&all[0].1)),
        Err(FleetError::OutsidePool { .. })
    ));
}

#[test]
fn an_exhausted_pool_says_how_much_is_left() {
    let p = pool(range(100), "10.0.0.0/25");
    let all = fill(&p, &["a"]);
    let err = allocate(&p, &all, "b", None).unwrap_err();
    assert_eq!(
        err.to_string(),
        "cluster b: poolCidr 10.0.0.0/25 has 26 free addresses, the cluster needs 100 more: widen the \
         pool with another IPAMPool, or release clusters"
    );
    let grown = p.with_kind(range(126)).unwrap();
    assert_eq!(
        allocate(&grown, &all, "a", Some(&all[0].1)).map(|a| a.len()),
        Ok(126)
    );
}

#[test]
fn other_families_and_the_clusters_own_entry_do_not_count_as_taken() {
    let p = pool(range(10), "10.0.0.0/24");
    let mine = Allocation::parse_addresses(&["10.0.0.1-10.0.0.10"]).unwrap();
    let existing = vec![
        ("a".to_string(), mine.clone()),
        ("v6".to_string(), net("fd00::/64")),
        ("elsewhere".to_string(), net("10.9.0.0/24")),
    ];
    assert_eq!(allocate(&p, &existing, "a", Some(&mine)), Ok(mine.clone()));
    let b = allocate(&p, &existing, "b", None).unwrap();
    assert_eq!(addresses(&b), ["10.0.0.11-10.0.0.20"]);
}

#[test]
fn huge_pools_cost_allocations_not_addresses() {
    // A /8 nearly whole, then grown by one: Kubermatic would expand 16 million addresses.
    let p = pool(range((1 << 24) - 3), "10.0.0.0/8");
    let all = fill(&p, &["a"]);
    assert_eq!(addresses(&all[0].1), ["10.0.0.1-10.255.255.253"]);
    let grown = p.with_kind(range((1 << 24) - 2)).unwrap();
    let a = allocate(&grown, &all, "a", Some(&all[0].1)).unwrap();
    assert_eq!(addresses(&a)[1], "10.255.255.254-10.255.255.254");

    // 2^40 addresses per cluster from an IPv6 /32, a thousand /64s from another, the whole
    // IPv6 space at once.
    let p = pool(range(1 << 40), "2001:db8::/32");
    let all = fill(&p, &["a", "b", "c"]);
    assert_eq!(
        addresses(&all[2].1),
        ["2001:db8::200:0:0-2001:db8::2ff:ffff:ffff"]
    );
    let p = excluding(prefix(64), "2001:db8::/32", &["2001:db8::5"], &[]);
    let names: Vec<String> = (0..1000).map(|i| format!("c{i}")).collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let all = fill(&p, &names);
    assert_eq!(all[999].1, net("2001:db8:0:3e8::/64"));
    let all = fill(&pool(range(u128::MAX), "::/0"), &["everything"]);
    assert_eq!(
        addresses(&all[0].1),
        ["::-ffff:ffff:ffff:ffff:ffff:ffff:ffff:fffe"]
    );
}

#[test]
fn pool_settings_errors_say_what_is_wrong_and_what_to_do() {
    let err = |kind, cidr: &str, ranges: &[&str], prefixes: &[&str]| {
        FleetPool::parse(kind, cidr, ranges, prefixes)
            .unwrap_err()
            .to_string()
    };
    assert_eq!(
        err(range(8), "192.168.1.0/33", &[], &[]),
        "poolCidr `192.168.1.0/33` is not a CIDR such as 10.6.0.0/16 or fd00:6::/48"
    );
    assert_eq!(
        err(range(0), "10.0.0.0/24", &[], &[]),
        "allocationRange must be at least 1: set how many addresses each cluster gets"
    );
    assert!(
        err(range(15), "10.0.0.0/28", &["10.0.0.1"], &[]).starts_with(
            "allocationRange 15 exceeds the 13 addresses poolCidr 10.0.0.0/28 can hand out"
        )
    );
    assert_eq!(
        err(prefix(63), "2001:db8:abcd:12::/64", &[], &[]),
        "allocationPrefix 63 does not fit poolCidr 2001:db8:abcd:12::/64: use a length from 64 to 128"
    );
    assert!(err(prefix(33), "10.0.0.0/24", &[], &[]).contains("from 24 to 32"));
    assert_eq!(
        err(prefix(29), "10.0.0.0/28", &["10.0.0.3", "10.0.0.12"], &[]),
        "no /29 of poolCidr 10.0.0.0/28 is free of the exclusions, so no cluster could get one: \
         use a longer allocationPrefix, a wider poolCidr or fewer exclusions"
    );
    assert_eq!(
        err(range(8), "10.0.0.0/24", &["10.0.0.9-10.0.0.1"], &[]),
        "excludeRanges entry `10.0.0.9-10.0.0.1` ends before it starts: write the lower address first"
    );
    assert_eq!(
        err(range(8), "10.0.0.0/24", &["10.0.0.x"], &[]),
        "excludeRanges entry `10.0.0.x` is not an address or a \"first-last\" range"
    );
    assert_eq!(
        err(range(8), "10.0.0.0/24", &["10.1.0.5"], &[]),
        "excludeRanges entry `10.1.0.5` lies outside poolCidr 10.0.0.0/24, so it excludes nothing: \
         fix or remove it"
    );
    assert_eq!(
        err(range(8), "10.0.0.0/24", &[], &["fd00::/64"]),
        "excludePrefixes entry `fd00::/64` is not ipv4 like poolCidr 10.0.0.0/24"
    );
    assert!(err(range(8), "10.0.0.0/24", &[], &["10.0.0/28"]).contains("is not a CIDR"));
}

#[test]
fn a_pool_cidr_with_host_bits_means_its_network() {
    let p = pool(range(8), "192.168.0.1/19");
    assert_eq!(p.cidr().to_string(), "192.168.0.0/19");
    // Partly overlapping exclusions are fine: they exclude what lies inside.
    let p = excluding(range(8), "10.0.0.0/24", &["9.255.255.250-10.0.0.8"], &[]);
    assert_eq!(p.usable(), 254 - 8);
}

#[test]
fn allocation_addresses_are_checked_when_read() {
    let err = |entries: &[&str]| {
        Allocation::parse_addresses(entries)
            .unwrap_err()
            .to_string()
    };
    assert_eq!(
        err(&["10.0.0.1-10.0.0.5", "10.0.0.5-10.0.0.9"]),
        "addresses entry `10.0.0.5-10.0.0.9` overlaps entry 10.0.0.1-10.0.0.5: list each address once"
    );
    assert_eq!(
        err(&["10.0.0.1", "fd00::1"]),
        "addresses entry `fd00::1` is ipv6 but the first entry is ipv4"
    );
    assert_eq!(
        err(&["10.0.0.1-fd00::1"]),
        "addresses entry `10.0.0.1-fd00::1` mixes IPv4 and IPv6: write both ends in one family"
    );
    assert_eq!(
        err(&[]),
        "an allocation of type range needs addresses: list \"first-last\" runs"
    );
    assert!(Allocation::parse_cidr("10.0.0.0/40").is_err());
    assert_eq!(net("10.0.0.5/28"), net("10.0.0.0/28"));
}

#[test]
fn pool_cidr_type_and_prefix_length_are_immutable() {
    let p = pool(prefix(28), "10.0.0.0/24");
    let all = fill(&p, &["a"]);
    let reasons = |new: &FleetPool| -> Vec<String> {
        check_edit(Some(&p), Some(new), &all)
            .iter()
            .map(ToString::to_string)
            .collect()
    };
    assert_eq!(
        reasons(&pool(prefix(28), "10.0.0.0/23")),
        [
            "poolCidr is immutable (10.0.0.0/24 → 10.0.0.0/23): clusters hold addresses of \
          10.0.0.0/24; for other addresses create another IPAMPool"
        ]
    );
    assert_eq!(
        reasons(&p.with_kind(range(16)).unwrap()),
        [
            "type is immutable (prefix → range): clusters hold prefix allocations; for range \
          allocations create another IPAMPool"
        ]
    );
    assert_eq!(
        reasons(&p.with_kind(prefix(27)).unwrap()),
        [
            "allocationPrefix is immutable (28 → 27): clusters hold /28 prefixes, which cannot be \
          resized in place; for /27 prefixes create another IPAMPool"
        ]
    );
    // Immutable even before any cluster holds an allocation.
    assert_eq!(
        check_edit(Some(&p), Some(&p.with_kind(prefix(29)).unwrap()), &[]).len(),
        1
    );
    assert!(check_edit(Some(&p), Some(&p), &all).is_empty());
}

#[test]
fn an_exclusion_covering_allocated_addresses_is_refused() {
    let p = pool(range(10), "192.168.1.0/24");
    let all = fill(&p, &["a", "b"]);
    let new = excluding(
        range(10),
        "192.168.1.0/24",
        &["192.168.1.8-192.168.1.12"],
        &[],
    );
    let reasons: Vec<String> = check_edit(Some(&p), Some(&new), &all)
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(
        reasons,
        [
            "cluster a holds 192.168.1.8-192.168.1.10, which the new exclusions cover: release \
             or move that cluster first, or exclude other addresses",
            "cluster b holds 192.168.1.11-192.168.1.12, which the new exclusions cover: release \
             or move that cluster first, or exclude other addresses",
        ]
    );
    // By overlap: a prefix covering one allocated address is refused too.
    let new = excluding(range(10), "192.168.1.0/24", &[], &["192.168.1.16/28"]);
    assert_eq!(check_edit(Some(&p), Some(&new), &all).len(), 1);
    // Free addresses may be excluded.
    let new = excluding(
        range(10),
        "192.168.1.0/24",
        &["192.168.1.21-192.168.1.30"],
        &[],
    );
    assert!(check_edit(Some(&p), Some(&new), &all).is_empty());
}

#[test]
fn an_exclusion_already_in_force_is_not_refused_again() {
    // An allocation that predates an exclusion (made before the webhook existed) does not
    // block unrelated edits; only newly excluded addresses count.
    let old = excluding(range(10), "192.168.1.0/24", &["192.168.1.5"], &[]);
    let all = vec![(
        "legacy".to_string(),
        Allocation::parse_addresses(&["192.168.1.1-192.168.1.10"]).unwrap(),
    )];
    let new = excluding(
        range(10),
        "192.168.1.0/24",
        &["192.168.1.5", "192.168.1.200"],
        &[],
    );
    assert!(check_edit(Some(&old), Some(&new), &all).is_empty());
    // Creating a pool over existing allocations counts every exclusion as new.
    assert_eq!(check_edit(None, Some(&new), &all).len(), 1);
}

#[test]
fn removing_a_datacenter_pool_is_refused_while_clusters_hold_allocations() {
    let p = pool(range(10), "192.168.1.0/24");
    let all = fill(&p, &["b", "a", "d", "c"]);
    let reasons: Vec<String> = check_edit(Some(&p), None, &all)
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(
        reasons,
        [
            "clusters a, b, c, … still hold allocations from this datacenter's pool: delete those \
          clusters (or their allocations) first"
        ]
    );
    assert!(check_edit(Some(&p), None, &[]).is_empty());
}

#[test]
fn the_consistency_check_names_every_conflict() {
    let p = excluding(range(10), "10.0.0.0/24", &["10.0.0.50"], &[]);
    let all = fill(&p, &["a"]);
    let bad = Allocation::parse_addresses(&["10.0.0.0-10.0.0.2", "10.0.0.50", "10.0.1.1"]).unwrap();
    let problems: Vec<String> = check_allocation(&p, &all, "b", &bad)
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(
        problems,
        [
            "10.0.1.1 lie outside poolCidr 10.0.0.0/24",
            "10.0.0.50 are excluded by the pool",
            "10.0.0.0 are poolCidr 10.0.0.0/24's network or broadcast address",
            "10.0.0.1-10.0.0.2 are also held by cluster a",
        ]
    );
    assert!(check_allocation(&p, &all, "a", &all[0].1).is_empty());
    let problems = check_allocation(&p, &all, "b", &net("10.0.0.64/26"));
    assert!(matches!(problems[0], AllocationProblem::WrongType { .. }));
}
