//! The checks an edit of an IPPool, Subnet or ReservedIP must pass before it is stored (what the
//! admission webhook runs): immutability, overlaps, addresses in use, auto pools inside their
//! Subnet, deletions of what holds addresses.

use std::collections::BTreeMap;

use allot_core::edit::{
    Existing, Refusal, check_pool, check_pool_deletion, check_subnet, check_subnet_deletion,
    default_version_pool, default_version_reserved, held_by_pool, reserved_in_use,
};
use allot_core::spec::{
    IpPoolSpec, ObjectMeta, ReservedIpSpec, SubnetSpec, auto_pool_labels::OWNER_SUBNET,
};
use allot_core::store::{Attachment, Claim, PodRef};
use allot_core::{Pool, Reserved, Subnet};

fn meta(name: &str) -> ObjectMeta {
    ObjectMeta {
        name: name.into(),
        ..Default::default()
    }
}

fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| s.to_string()).collect()
}

fn spec(subnet: &str, ips: &[&str]) -> IpPoolSpec {
    IpPoolSpec {
        subnet: subnet.into(),
        ips: strings(ips),
        ..Default::default()
    }
}

fn pool(name: &str, spec: IpPoolSpec) -> Pool {
    Pool::from_spec(meta(name), spec).expect("a valid pool")
}

fn carved(name: &str, subnet: &str, spec: IpPoolSpec) -> Pool {
    let mut m = meta(name);
    m.labels.insert(OWNER_SUBNET.into(), subnet.into());
    Pool::from_spec(m, spec).expect("a valid pool")
}

fn subnet(name: &str, cidr: &str, ips: &[&str], exclude: &[&str]) -> Subnet {
    Subnet::from_spec(
        meta(name),
        SubnetSpec {
            subnet: cidr.into(),
            ips: strings(ips),
            exclude_ips: strings(exclude),
            ..Default::default()
        },
    )
    .expect("a valid subnet")
}

fn claim(address: &str, pool: &str, pod: &str) -> Claim {
    Claim {
        address: address.parse().unwrap(),
        pool: pool.into(),
        network: "net".into(),
        attachment: Some(Attachment {
            container_id: pod.into(),
            interface: "eth0".into(),
        }),
        pod: PodRef {
            namespace: "web".into(),
            name: pod.into(),
            uid: format!("uid-{pod}"),
            ..Default::default()
        },
        node: String::new(),
        updated_at: 0,
    }
}

fn existing(pools: Vec<Pool>, subnets: Vec<Subnet>, claims: &[Claim]) -> Existing {
    Existing {
        pools,
        subnets,
        held: held_by_pool(claims.to_vec()),
    }
}

fn messages(refusals: &[Refusal]) -> Vec<String> {
    refusals.iter().map(|r| r.to_string()).collect()
}

#[test]
fn subnet_and_ip_version_are_immutable_but_a_cosmetic_rewrite_is_not_a_change() {
    let old = spec("10.0.0.0/24", &[]);
    let none = Existing::default();
    let moved = pool("a", spec("10.1.0.0/24", &[]));
    let refused = messages(&check_pool(Some(&old), &moved, &none));
    assert_eq!(refused.len(), 1, "{refused:?}");
    assert!(
        refused[0].contains("IPPool a: subnet is immutable (10.0.0.0/24 → 10.1.0.0/24)"),
        "{refused:?}"
    );

    let six = pool("a", spec("fd00::/64", &[]));
    let refused = messages(&check_pool(Some(&old), &six, &none));
    assert!(
        refused
            .iter()
            .any(|m| m.contains("ipVersion is immutable (4 → 6)")),
        "{refused:?}"
    );

    // Same network written with a host part, and an ipVersion made explicit: no change.
    let mut same = spec("10.0.0.7/24", &[]);
    same.ip_version = Some(4);
    assert!(check_pool(Some(&old), &pool("a", same), &none).is_empty());
    // An old version whose subnet never parsed held nothing: it may be fixed.
    let broken = spec("10.0.0.0/33", &[]);
    assert!(check_pool(Some(&broken), &moved, &none).is_empty());
}

#[test]
fn pools_overlapping_another_pool_are_refused_naming_it_as_the_agent_would_leave_them_out() {
    let a = pool("a", spec("10.0.0.0/24", &["10.0.0.10-10.0.0.20"]));
    let all = existing(vec![a.clone()], vec![], &[]);
    let shares = pool("b", spec("10.0.0.0/24", &["10.0.0.15-10.0.0.30"]));
    let refused = messages(&check_pool(None, &shares, &all));
    assert_eq!(refused.len(), 1);
    assert!(
        refused[0].contains("addresses 10.0.0.15-10.0.0.20 are also in IPPool a"),
        "{refused:?}"
    );
    let wider = pool("c", spec("10.0.0.0/16", &["10.0.5.1"]));
    let refused = messages(&check_pool(None, &wider, &all));
    assert!(
        refused[0].contains("subnet 10.0.0.0/16 overlaps subnet 10.0.0.0/24 of IPPool a"),
        "{refused:?}"
    );
    // Disjoint ranges of one subnet, another family, and the pool itself: fine.
    let beside = pool("d", spec("10.0.0.0/24", &["10.0.0.100"]));
    assert!(check_pool(None, &beside, &all).is_empty());
    let six = pool("e", spec("fd00::/64", &[]));
    assert!(check_pool(None, &six, &all).is_empty());
    assert!(check_pool(Some(&a.spec), &a, &all).is_empty());
}

#[test]
fn an_address_in_use_cannot_be_removed_excluded_or_made_the_gateway() {
    let old = spec("10.0.0.0/24", &["10.0.0.10-10.0.0.20"]);
    let claims = [
        claim("10.0.0.12", "a", "web-0"),
        claim("10.0.0.13", "a", "web-1"),
    ];
    let all = existing(vec![pool("a", old.clone())], vec![], &claims);

    let shrunk = pool("a", spec("10.0.0.0/24", &["10.0.0.13-10.0.0.20"]));
    let refused = messages(&check_pool(Some(&old), &shrunk, &all));
    assert_eq!(refused.len(), 1, "{refused:?}");
    assert!(
        refused[0]
            .contains("removes 10.0.0.12 from ips, but they are in use: 10.0.0.12 (web/web-0)"),
        "{refused:?}"
    );

    let mut excluding = old.clone();
    excluding.exclude_ips = strings(&["10.0.0.11-10.0.0.13"]);
    let refused = messages(&check_pool(Some(&old), &pool("a", excluding), &all));
    assert!(
        refused[0].contains("adds 10.0.0.12-10.0.0.13 to excludeIPs")
            && refused[0].contains("10.0.0.12 (web/web-0), 10.0.0.13 (web/web-1)"),
        "{refused:?}"
    );

    let mut gateway = old.clone();
    gateway.gateway = Some("10.0.0.13".into());
    let refused = messages(&check_pool(Some(&old), &pool("a", gateway), &all));
    assert!(
        refused[0].contains("makes 10.0.0.13 the gateway"),
        "{refused:?}"
    );

    // Free addresses may go; so may everything else about the pool.
    let mut fine = spec("10.0.0.0/24", &["10.0.0.12-10.0.0.13"]);
    fine.disable = true;
    fine.node_name = strings(&["n1"]);
    assert!(check_pool(Some(&old), &pool("a", fine), &all).is_empty());
}

#[test]
fn a_claim_already_outside_the_pool_does_not_block_unrelated_edits() {
    // 10.0.0.50 was claimed from `a` before an edit that the webhook did not see took it out.
    let old = spec("10.0.0.0/24", &["10.0.0.10-10.0.0.20"]);
    let claims = [claim("10.0.0.50", "a", "old")];
    let all = existing(vec![], vec![], &claims);
    let mut labelled = old.clone();
    labelled.default = true;
    assert!(check_pool(Some(&old), &pool("a", labelled), &all).is_empty());
    // But an old version that is not valid offered nothing certain: every claim must stay.
    let broken = spec("10.0.0.0/24", &["10.0.0.x"]);
    let refused = check_pool(Some(&broken), &pool("a", old.clone()), &all);
    assert!(
        matches!(refused[..], [Refusal::InUse { .. }]),
        "{refused:?}"
    );
}

#[test]
fn a_pool_may_not_offer_addresses_that_another_pools_claims_hold() {
    // `gone` was deleted around the webhook while pods still held its addresses.
    let claims = [claim("10.0.0.30", "gone", "db-0")];
    let all = existing(vec![], vec![], &claims);
    let new = pool("b", spec("10.0.0.0/24", &["10.0.0.25-10.0.0.35"]));
    let refused = messages(&check_pool(None, &new, &all));
    assert_eq!(refused.len(), 1);
    assert!(
        refused[0].contains("10.0.0.30 (web/db-0) are held by claims of IPPool gone"),
        "{refused:?}"
    );
    let beside = pool("b", spec("10.0.0.0/24", &["10.0.0.40"]));
    assert!(check_pool(None, &beside, &all).is_empty());
}

#[test]
fn a_pool_with_claims_cannot_be_deleted_and_the_refusal_counts_them() {
    let claims: Vec<Claim> = (10..15)
        .map(|i| claim(&format!("10.0.0.{i}"), "a", &format!("web-{i}")))
        .chain([claim("10.0.1.1", "other", "x")])
        .collect();
    let all = existing(vec![], vec![], &claims);
    let refused = messages(&check_pool_deletion("a", &all));
    assert_eq!(refused.len(), 1);
    assert!(
        refused[0].contains(
            "IPPool a holds 5 address(es): 10.0.0.10 (web/web-10), 10.0.0.11 (web/web-11), 10.0.0.12 (web/web-12), … 2 more"
        ),
        "{refused:?}"
    );
    assert!(refused[0].contains("disable: true"), "{refused:?}");
    assert!(check_pool_deletion("empty", &all).is_empty());
}

#[test]
fn a_quarantined_address_counts_as_held_and_says_by_whom() {
    let mut quarantined = claim("10.0.0.9", "a", "x");
    quarantined.attachment = None;
    quarantined.pod = PodRef::conflict("02:00:00:00:00:09");
    let all = existing(vec![], vec![], &[quarantined]);
    let refused = messages(&check_pool_deletion("a", &all));
    assert!(
        refused[0].contains("10.0.0.9 (quarantined: host 02:00:00:00:00:09 answered for it)"),
        "{refused:?}"
    );
}

#[test]
fn a_pool_carved_from_a_subnet_must_fit_inside_it() {
    let s = subnet("s", "10.0.0.0/24", &["10.0.0.10-10.0.0.50"], &["10.0.0.40"]);
    let all = existing(vec![], vec![s], &[]);
    let inside = carved(
        "auto-web",
        "s",
        spec("10.0.0.0/24", &["10.0.0.10-10.0.0.12"]),
    );
    assert!(check_pool(None, &inside, &all).is_empty());

    let outside = carved(
        "auto-web",
        "s",
        spec("10.0.0.0/24", &["10.0.0.38-10.0.0.60"]),
    );
    let refused = messages(&check_pool(None, &outside, &all));
    assert!(
        refused[0].contains("it offers 10.0.0.40, 10.0.0.51-10.0.0.60, which the Subnet does not"),
        "{refused:?}"
    );
    let other_cidr = carved("auto-web", "s", spec("10.0.1.0/24", &["10.0.1.1"]));
    let refused = messages(&check_pool(None, &other_cidr, &all));
    assert!(
        refused[0].contains("its subnet 10.0.1.0/24 is not the Subnet's 10.0.0.0/24"),
        "{refused:?}"
    );
    let orphan = carved("auto-web", "nope", spec("10.0.0.0/24", &["10.0.0.10"]));
    let refused = messages(&check_pool(None, &orphan, &all));
    assert!(
        refused[0].contains("Subnet nope does not exist"),
        "{refused:?}"
    );
}

#[test]
fn subnets_are_immutable_disjoint_and_cannot_shrink_under_their_pools() {
    let s = subnet("s", "10.0.0.0/24", &["10.0.0.10-10.0.0.50"], &[]);
    let pool_of_s = carved(
        "auto-web",
        "s",
        spec("10.0.0.0/24", &["10.0.0.20-10.0.0.25"]),
    );
    let claims = [claim("10.0.0.21", "auto-web", "web-0")];
    let all = existing(vec![pool_of_s], vec![s.clone()], &claims);

    let overlapping = subnet("t", "10.0.0.0/23", &[], &[]);
    let refused = messages(&check_subnet(None, &overlapping, &all));
    assert!(
        refused[0].contains("subnet 10.0.0.0/23 overlaps subnet 10.0.0.0/24 of Subnet s"),
        "{refused:?}"
    );
    let sharing = subnet("t", "10.0.0.0/24", &["10.0.0.50-10.0.0.60"], &[]);
    let refused = messages(&check_subnet(None, &sharing, &all));
    assert!(
        refused[0].contains("addresses 10.0.0.50 are also in Subnet s"),
        "{refused:?}"
    );
    let beside = subnet("t", "10.0.0.0/24", &["10.0.0.51-10.0.0.60"], &[]);
    assert!(check_subnet(None, &beside, &all).is_empty());

    let moved = subnet("s", "10.0.1.0/24", &[], &[]);
    let refused = messages(&check_subnet(Some(&s.spec), &moved, &all));
    assert!(
        refused
            .iter()
            .any(|m| m.contains("Subnet s: subnet is immutable")),
        "{refused:?}"
    );

    let shrunk = subnet("s", "10.0.0.0/24", &["10.0.0.10-10.0.0.22"], &[]);
    let refused = messages(&check_subnet(Some(&s.spec), &shrunk, &all));
    assert_eq!(refused.len(), 1, "{refused:?}");
    assert!(
        refused[0].contains("IPPool auto-web is carved from it and offers 10.0.0.23-10.0.0.25"),
        "{refused:?}"
    );
    let excluding = subnet("s", "10.0.0.0/24", &["10.0.0.10-10.0.0.50"], &["10.0.0.20"]);
    assert_eq!(check_subnet(Some(&s.spec), &excluding, &all).len(), 1);
    let grown = subnet("s", "10.0.0.0/24", &["10.0.0.10-10.0.0.60"], &[]);
    assert!(check_subnet(Some(&s.spec), &grown, &all).is_empty());
}

#[test]
fn a_subnet_whose_pools_hold_addresses_cannot_be_deleted() {
    let s = subnet("s", "10.0.0.0/24", &[], &[]);
    let busy = carved(
        "auto-web",
        "s",
        spec("10.0.0.0/24", &["10.0.0.20-10.0.0.25"]),
    );
    let idle = carved("auto-db", "s", spec("10.0.0.0/24", &["10.0.0.30"]));
    let claims = [claim("10.0.0.21", "auto-web", "web-0")];
    let all = existing(vec![busy, idle.clone()], vec![s.clone()], &claims);
    let refused = messages(&check_subnet_deletion("s", &all));
    assert!(
        refused[0].contains("Subnet s: pools carved from it hold addresses (auto-web: 1)"),
        "{refused:?}"
    );
    let quiet = existing(vec![idle], vec![s], &[]);
    assert!(check_subnet_deletion("s", &quiet).is_empty());
}

#[test]
fn reserving_an_address_in_use_is_allowed_with_a_warning() {
    let r = Reserved::from_spec(
        meta("r"),
        ReservedIpSpec {
            ip_version: None,
            ips: strings(&["10.0.0.12-10.0.0.14"]),
        },
    )
    .unwrap();
    let all = existing(vec![], vec![], &[claim("10.0.0.13", "a", "web-0")]);
    let warnings = reserved_in_use(&r, &all);
    assert_eq!(warnings.len(), 1);
    assert!(
        warnings[0].contains("ReservedIP r: 10.0.0.13 (web/web-0) of IPPool a in use"),
        "{warnings:?}"
    );
    assert!(reserved_in_use(&r, &Existing::default()).is_empty());
}

#[test]
fn ip_version_defaults_only_on_objects_that_are_valid_without_it() {
    let valid = Pool::from_spec(meta("a"), spec("fd00::/64", &[]));
    assert_eq!(default_version_pool(&valid), Some(6));
    let mut said = spec("10.0.0.0/24", &[]);
    said.ip_version = Some(4);
    assert_eq!(
        default_version_pool(&Pool::from_spec(meta("a"), said)),
        None
    );
    // A v6 range in a v4 subnet stays invalid: no default is guessed for it.
    let invalid = Pool::from_spec(meta("a"), spec("10.0.0.0/24", &["fd00::1"]));
    assert_eq!(default_version_pool(&invalid), None);

    let mixed = ReservedIpSpec {
        ip_version: None,
        ips: strings(&["10.0.0.1", "fd00::1"]),
    };
    let checked = Reserved::from_spec(meta("r"), mixed.clone());
    assert_eq!(default_version_reserved(&checked, mixed.ip_version), None);
    let six = ReservedIpSpec {
        ip_version: None,
        ips: strings(&["fd00::1-fd00::9"]),
    };
    let checked = Reserved::from_spec(meta("r"), six.clone());
    assert_eq!(default_version_reserved(&checked, six.ip_version), Some(6));
}

#[test]
fn held_sets_come_from_many_claims_in_one_pass() {
    let claims: Vec<Claim> = (0..20_000u32)
        .map(|i| {
            let a = std::net::Ipv4Addr::from(0x0a00_0000 + i);
            claim(&a.to_string(), "big", "p")
        })
        .collect();
    let held = held_by_pool(claims);
    let big = &held["big"];
    assert_eq!(big.count(), 20_000);
    assert_eq!(
        big.of(allot_core::IpFamily::V4).to_entries(),
        ["10.0.0.0-10.0.78.31"]
    );
    let _: &BTreeMap<_, _> = &held;
}
