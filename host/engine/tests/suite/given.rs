//! Addresses a policy names (contract 0.3.0's address hints): a legacy application keeps the
//! address its firewall rules and DNS know; anything the host cannot honour fails the NIC with
//! the address and the reason, and never hands out another address instead.

use crate::common::*;
use allot_core::spec::{IpPoolSpec, ObjectMeta, ReservedIpSpec};
use allot_core::store::{MemoryStore, Store};
use allot_core::{PolicyErrorKind, Pool, Reserved};
use allot_engine::{AllocError, EngineConfig};

fn given(container: &str, v4: &[&str], address: &str) -> allot_engine::AddRequest {
    let mut r = add_req(container, "eth0", v4, &[]);
    r.pod
        .annotations
        .insert("given-ipv4".into(), address.into());
    r
}

/// The error of a refused given address: its kind and message.
fn refused(err: AllocError) -> (PolicyErrorKind, String) {
    match err {
        AllocError::Policy(p) => (p.kind, p.message),
        other => panic!("expected a refusal, got {other:?}"),
    }
}

fn pools() -> Vec<Pool> {
    let mut excluding = pool(
        "legacy",
        "10.0.0.0/24",
        &["10.0.0.10-10.0.0.60"],
        Some("10.0.0.1"),
    );
    excluding.excluded =
        allot_core::AddrSet::parse_entries(allot_core::IpFamily::V4, &["10.0.0.13".to_string()])
            .unwrap();
    vec![
        excluding,
        pool("other", "10.0.1.0/24", &["10.0.1.10-10.0.1.20"], None),
        pool("v6", "fd00::/64", &["fd00::10-fd00::20"], None),
    ]
}

#[test]
fn a_legacy_app_gets_the_address_its_annotation_gives_and_keeps_it_across_restarts() {
    let engine = engine(pools());
    let out = engine.add(&given("c1", &["legacy"], "10.0.0.50")).unwrap();
    assert_eq!(out.allocations[0].address, ip("10.0.0.50"));
    assert_eq!(out.allocations[0].pool, "legacy");
    assert_eq!(out.allocations[0].gateway, Some(ip("10.0.0.1")));

    // The pod is replaced (a Deployment's rollout): the new pod asks while the old one still
    // holds it, and is told to retry, with who holds it.
    let (kind, message) = refused(
        engine
            .add(&given("c2", &["legacy"], "10.0.0.50"))
            .unwrap_err(),
    );
    assert_eq!(kind, PolicyErrorKind::NotReady, "held: try again later");
    assert!(message.contains("cannot get 10.0.0.50"), "{message}");
    assert!(message.contains("held by pod ns/pod-c1"), "{message}");
    assert!(message.contains("pod annotation given-ipv4"), "{message}");
    assert!(message.contains("no other address"), "{message}");

    // The old pod goes: the new one gets the same address.
    engine.del(&att("c1", "eth0")).unwrap();
    let out = engine.add(&given("c2", &["legacy"], "10.0.0.50")).unwrap();
    assert_eq!(out.allocations[0].address, ip("10.0.0.50"));
    // A retried ADD of the same attachment is the same answer, not a conflict with itself.
    let again = engine.add(&given("c2", &["legacy"], "10.0.0.50")).unwrap();
    assert!(again.repeated);
    assert_eq!(again.allocations[0].address, ip("10.0.0.50"));
}

#[test]
fn a_pod_without_a_given_address_never_takes_one_given_to_another() {
    let engine = engine(vec![pool(
        "tiny",
        "10.0.0.0/24",
        &["10.0.0.10-10.0.0.11"],
        None,
    )]);
    engine.add(&given("c1", &["tiny"], "10.0.0.10")).unwrap();
    let out = engine.add(&add_req("c2", "eth0", &["tiny"], &[])).unwrap();
    assert_eq!(out.allocations[0].address, ip("10.0.0.11"));
    assert!(matches!(
        engine.add(&add_req("c3", "eth0", &["tiny"], &[])),
        Err(AllocError::NoPoolFits { .. })
    ));
}

#[test]
fn every_refusal_names_the_address_and_why_and_claims_nothing() {
    let reserved = Reserved::from_spec(
        ObjectMeta {
            name: "firewall-vip".into(),
            ..Default::default()
        },
        ReservedIpSpec {
            ip_version: Some(4),
            ips: vec!["10.0.0.14".into()],
        },
    )
    .unwrap();
    let engine = engine(pools());
    engine.load(pools(), vec![], vec![reserved]).unwrap();
    let free_before: u64 = engine.usage().iter().map(|u| u.free).sum();
    for (address, expect) in [
        ("10.0.0.1", "it is the gateway of IPPool legacy"),
        ("10.0.0.13", "IPPool legacy excludes it"),
        ("10.0.0.14", "reserved by ReservedIP firewall-vip"),
        // In a pool, but not one the policy allowed for this pod.
        (
            "10.0.1.15",
            "it is in IPPool other, which is not among the pools allowed for this pod",
        ),
        (
            "10.0.0.200",
            "in the subnet 10.0.0.0/24 of IPPool legacy but not among its ips",
        ),
        (
            "10.0.0.0",
            "in the subnet 10.0.0.0/24 of IPPool legacy but not among its ips",
        ),
        (
            "192.0.2.7",
            "it is in no IPPool; the pools allowed for this pod are legacy",
        ),
    ] {
        let (kind, message) = refused(engine.add(&given("c1", &["legacy"], address)).unwrap_err());
        assert_eq!(kind, PolicyErrorKind::InvalidInput, "{address}: {message}");
        assert!(
            message.contains(&format!("cannot get {address}")),
            "{address}: {message}"
        );
        assert!(message.contains(expect), "{address}: {message}");
    }
    // Not an address of the family: refused before anything is taken.
    let (kind, message) = refused(
        engine
            .add(&given("c1", &["legacy"], "fd00::11"))
            .unwrap_err(),
    );
    assert_eq!(kind, PolicyErrorKind::InvalidInput);
    assert!(message.contains("not an ipv4 address"), "{message}");
    let (_, message) = refused(engine.add(&given("c1", &["legacy"], "ten")).unwrap_err());
    assert!(message.contains("\"ten\""), "{message}");

    assert!(engine.store().all().unwrap().is_empty(), "nothing claimed");
    let free_after: u64 = engine.usage().iter().map(|u| u.free).sum();
    assert_eq!(
        free_before, free_after,
        "nothing taken out of the free index"
    );
    // And the pool still serves pods that give no address.
    engine
        .add(&add_req("c9", "eth0", &["legacy"], &[]))
        .unwrap();
}

#[test]
fn a_refused_family_gives_back_what_the_other_family_took() {
    let engine = engine(pools());
    let free_before: u64 = engine.usage().iter().map(|u| u.free).sum();
    let mut req = add_req("c1", "eth0", &["legacy"], &["v6"]);
    req.pod
        .annotations
        .insert("given-ipv6".into(), "fd00::99".into());
    let (kind, message) = refused(engine.add(&req).unwrap_err());
    assert_eq!(kind, PolicyErrorKind::InvalidInput);
    assert!(message.contains("cannot get fd00::99"), "{message}");
    assert!(engine.store().all().unwrap().is_empty());
    let free_after: u64 = engine.usage().iter().map(|u| u.free).sum();
    assert_eq!(
        free_before, free_after,
        "the IPv4 address taken first is free again"
    );

    // Dual stack: the given IPv6 address, and an IPv4 address the host picks.
    req.pod
        .annotations
        .insert("given-ipv6".into(), "fd00::12".into());
    let out = engine.add(&req).unwrap();
    assert_eq!(out.allocations.len(), 2);
    assert_eq!(out.allocations[0].pool, "legacy");
    assert_eq!(out.allocations[1].address, ip("fd00::12"));
}

#[test]
fn a_given_address_in_a_full_pool_is_refused_as_held_with_its_holder() {
    let engine = engine(vec![pool("one", "10.0.0.0/24", &["10.0.0.10"], None)]);
    engine.add(&add_req("c1", "eth0", &["one"], &[])).unwrap();
    let (kind, message) = refused(engine.add(&given("c2", &["one"], "10.0.0.10")).unwrap_err());
    assert_eq!(kind, PolicyErrorKind::NotReady);
    assert!(message.contains("held by pod ns/pod-c1"), "{message}");
}

#[test]
fn a_cooling_address_is_given_at_once_and_a_kept_one_goes_back_to_its_statefulset_pod() {
    let (clock, _now) = manual_clock(1_000);
    let config = EngineConfig {
        cooldown: 300,
        ..quick()
    };
    let engine =
        allot_engine::Engine::with_config(MemoryStore::new(), CniDefaultsPolicy, config, clock);
    engine.load(pools(), vec![], vec![]).unwrap();
    engine.add(&given("c1", &["legacy"], "10.0.0.20")).unwrap();
    engine.del(&att("c1", "eth0")).unwrap();
    // Released a moment ago, still cooling down: the pod that is given it gets it.
    let out = engine.add(&given("c2", &["legacy"], "10.0.0.20")).unwrap();
    assert_eq!(out.allocations[0].address, ip("10.0.0.20"));

    // A StatefulSet pod given its address keeps it across a restart (kept, then taken back).
    let mut db = stateful_req("s1", "db-0", "db", &["legacy"]);
    db.pod
        .annotations
        .insert("given-ipv4".into(), "10.0.0.30".into());
    assert_eq!(
        engine.add(&db).unwrap().allocations[0].address,
        ip("10.0.0.30")
    );
    engine.del(&att("s1", "eth0")).unwrap();
    let kept = engine.store().detached().unwrap();
    assert_eq!(kept.len(), 1, "kept for the pod");
    // Nobody else gets it meanwhile...
    let (kind, message) = refused(
        engine
            .add(&given("c3", &["legacy"], "10.0.0.30"))
            .unwrap_err(),
    );
    assert_eq!(kind, PolicyErrorKind::NotReady);
    assert!(message.contains("kept for pod ns/db-0"), "{message}");
    // ...and the restarted pod takes it back.
    db.attachment.container_id = "s2".into();
    assert_eq!(
        engine.add(&db).unwrap().allocations[0].address,
        ip("10.0.0.30")
    );
    assert!(engine.store().detached().unwrap().is_empty());
}

#[test]
fn a_given_address_is_honoured_only_in_a_serving_pool() {
    let mut disabled = pool("legacy", "10.0.0.0/24", &["10.0.0.10-10.0.0.60"], None);
    disabled.spec = IpPoolSpec {
        disable: true,
        ..disabled.spec
    };
    let engine = engine(vec![disabled]);
    // The test policy orders every pool with room; the host refuses a disabled one itself.
    let err = engine
        .add(&given("c1", &["legacy"], "10.0.0.20"))
        .unwrap_err();
    assert!(err.to_string().contains("disabled"), "{err}");
    assert!(engine.store().all().unwrap().is_empty());
}

/// A database StatefulSet declares three addresses (`ipam.allot.dev/ordinal-ips`); the
/// controller keeps them in a ReservedIP labelled for it. Scaled 3 → 1 → 3, it gets its same
/// three addresses, and nobody else gets them meanwhile.
#[test]
fn a_statefulset_scaled_3_1_3_gets_its_same_three_addresses_and_nobody_else_meanwhile() {
    use allot_core::declared::For;
    let db = For::statefulset("ns", "db");
    let mut meta = ObjectMeta {
        name: db.reservation_name(allot_core::IpFamily::V4),
        ..Default::default()
    };
    meta.labels = db.labels();
    let reservation = Reserved::from_spec(
        meta,
        ReservedIpSpec {
            ip_version: Some(4),
            ips: vec!["10.0.0.20-10.0.0.22".into()],
        },
    )
    .unwrap();
    let engine = engine(pools());
    engine.load(pools(), vec![], vec![reservation]).unwrap();
    let declared = ["10.0.0.20", "10.0.0.21", "10.0.0.22"];
    let pod = |ordinal: usize, container: &str| {
        let mut r = stateful_req(container, &format!("db-{ordinal}"), "db", &["legacy"]);
        r.pod
            .annotations
            .insert("given-ipv4".into(), declared[ordinal].into());
        r
    };
    for (n, want) in declared.iter().enumerate() {
        let out = engine.add(&pod(n, &format!("a{n}"))).unwrap();
        assert_eq!(out.allocations[0].address, ip(want));
    }
    // Scaled to 1: pods 1 and 2 are deleted for good (their ordinals are past the replicas).
    for n in [1, 2] {
        let mut del = allot_engine::DelRequest::new(att(&format!("a{n}"), "eth0"));
        del.owner_replicas = Some(1);
        engine.del_request(&del).unwrap();
    }
    assert_eq!(engine.store().all().unwrap().len(), 1, "released, not kept");
    // Meanwhile nobody else gets them: not by asking, not by chance.
    let (kind, message) = refused(
        engine
            .add(&given("x", &["legacy"], "10.0.0.21"))
            .unwrap_err(),
    );
    assert_eq!(kind, PolicyErrorKind::InvalidInput);
    assert!(
        message.contains("reserved by ReservedIP statefulset.ns.db.ipv4"),
        "{message}"
    );
    for n in 0..40 {
        let out = engine
            .add(&add_req(&format!("y{n}"), "eth0", &["legacy"], &[]))
            .unwrap();
        assert!(
            !declared.contains(&out.allocations[0].address.to_string().as_str()),
            "{:?}",
            out.allocations
        );
    }
    // Another StatefulSet's pod asking for one is refused too.
    let mut web = stateful_req("w0", "web-0", "web", &["legacy"]);
    web.pod
        .annotations
        .insert("given-ipv4".into(), "10.0.0.22".into());
    assert!(engine.add(&web).is_err());
    // Scaled back to 3: the same three addresses.
    for n in [1, 2] {
        let out = engine.add(&pod(n, &format!("b{n}"))).unwrap();
        assert_eq!(out.allocations[0].address, ip(declared[n]));
    }
}
