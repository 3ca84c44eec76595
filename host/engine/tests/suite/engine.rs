//! The allocation engine against the in-memory store and a small policy: CNI defaults in
//! listed order, exhausted pools dropped (the default policy's own tests live with it).

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::net::IpAddr;
use std::sync::{Arc, Barrier};

use allot_core::policy::Owner;
use allot_core::spec::{ObjectMeta, ReservedIpSpec};
use allot_core::store::{
    Attachment, Changes, Claim, MemoryStore, PodRef, Reattach, Snapshot, Store, StoreError,
};
use allot_core::{IpFamily, PolicyErrorKind, Reserved};
use allot_engine::{AllocError, Engine, EngineConfig};

use crate::common::*;

#[test]
fn add_is_idempotent_per_attachment_and_del_releases_only_its_own() {
    let e = engine(vec![pool(
        "a",
        "10.0.0.0/24",
        &["10.0.0.10-10.0.0.20"],
        Some("10.0.0.1"),
    )]);
    let first = e.add(&add_req("c1", "eth0", &["a"], &[])).unwrap();
    assert_eq!(first.allocations.len(), 1);
    assert_eq!(first.allocations[0].cidr(), "10.0.0.10/24");
    assert_eq!(first.allocations[0].gateway, Some(ip("10.0.0.1")));
    let again = e.add(&add_req("c1", "eth0", &["a"], &[])).unwrap();
    assert!(again.repeated);
    assert_eq!(again.allocations, first.allocations);

    let other = e.add(&add_req("c2", "eth0", &["a"], &[])).unwrap();
    assert_eq!(other.allocations[0].address, ip("10.0.0.11"));

    assert_eq!(e.del(&att("c1", "eth0")).unwrap().len(), 1);
    assert!(
        e.del(&att("c1", "eth0")).unwrap().is_empty(),
        "DEL is idempotent"
    );
    assert_eq!(
        e.check(&att("c2", "eth0")).unwrap().allocations,
        other.allocations
    );
    assert!(matches!(
        e.check(&att("c1", "eth0")),
        Err(AllocError::UnknownAttachment(_))
    ));
}

#[test]
fn routes_carry_the_default_via_gateway_pool_routes_and_annotation_routes() {
    let mut p = pool("a", "10.0.0.0/24", &[], Some("10.0.0.1"));
    p.routes = vec![allot_core::pool::Route {
        dst: "172.16.0.0/12".parse().unwrap(),
        gw: ip("10.0.0.254"),
    }];
    let e = engine(vec![p]);
    let out = e.add(&add_req("c1", "eth0", &["a"], &[])).unwrap();
    let routes: Vec<String> = out
        .routes
        .iter()
        .map(|r| format!("{} via {}", r.dst, r.gw))
        .collect();
    assert_eq!(
        routes,
        [
            "0.0.0.0/0 via 10.0.0.1",
            "172.16.0.0/12 via 10.0.0.254",
            "192.0.2.0/24 via 10.0.0.1"
        ]
    );

    let mut clean = add_req("c2", "eth0", &["a"], &[]);
    clean
        .pod
        .annotations
        .insert("clean-gateway".into(), "yes".into());
    let out = e.add(&clean).unwrap();
    assert_eq!(out.allocations[0].gateway, None);
    assert!(
        out.routes.iter().all(|r| r.dst.prefix_len() != 0),
        "no default route"
    );
}

#[test]
fn dual_stack_gets_one_address_per_family_atomically() {
    let e = engine(vec![
        pool("v4", "10.0.0.0/24", &["10.0.0.10"], None),
        pool("v6", "fd00::/64", &["fd00::10-fd00::11"], None),
    ]);
    let out = e.add(&add_req("c1", "eth0", &["v4"], &["v6"])).unwrap();
    let addrs: Vec<String> = out.allocations.iter().map(|a| a.cidr()).collect();
    assert_eq!(addrs, ["10.0.0.10/24", "fd00::10/64"]);
    // v4 is now exhausted: the next dual-stack ADD fails whole, taking no v6 address.
    let err = e.add(&add_req("c2", "eth0", &["v4"], &["v6"])).unwrap_err();
    assert!(
        matches!(
            err,
            AllocError::NoPoolFits {
                family: IpFamily::V4,
                ..
            }
        ),
        "{err}"
    );
    let usage: BTreeMap<String, u64> = e.usage().into_iter().map(|u| (u.name, u.free)).collect();
    assert_eq!(usage["v6"], 1, "the failed ADD left the v6 pool untouched");
    assert!(e.store().claims_of(&att("c2", "eth0")).unwrap().is_empty());
}

#[test]
fn an_exhausted_pool_falls_through_to_the_next_candidate() {
    let e = engine(vec![
        pool("small", "10.0.0.0/24", &["10.0.0.10"], None),
        pool("big", "10.0.1.0/24", &[], None),
    ]);
    let a = e
        .add(&add_req("c1", "eth0", &["small", "big"], &[]))
        .unwrap();
    let b = e
        .add(&add_req("c2", "eth0", &["small", "big"], &[]))
        .unwrap();
    assert_eq!(a.allocations[0].pool, "small");
    assert_eq!(b.allocations[0].pool, "big");
    let err = e.add(&add_req("c3", "eth0", &["small"], &[])).unwrap_err();
    let AllocError::NoPoolFits { summary, trace, .. } = err else {
        panic!("{err}")
    };
    assert!(summary.contains("small exhausted"), "{summary}");
    assert!(
        trace.contains("dropped small: exhausted (no free address left of 1)"),
        "{trace}"
    );
}

#[test]
fn excluded_reserved_and_gateway_addresses_are_never_handed_out() {
    let mut p = pool("a", "10.0.0.0/24", &["10.0.0.1-10.0.0.6"], Some("10.0.0.1"));
    p.excluded = allot_core::AddrSet::parse_entries(IpFamily::V4, &["10.0.0.2"]).unwrap();
    let reserved = Reserved::from_spec(
        ObjectMeta {
            name: "r".into(),
            ..Default::default()
        },
        ReservedIpSpec {
            ip_version: Some(4),
            ips: vec!["10.0.0.4".into()],
        },
    )
    .unwrap();
    let e = Engine::new(MemoryStore::new(), CniDefaultsPolicy);
    e.load(vec![p], vec![], vec![reserved]).unwrap();
    let mut got = Vec::new();
    for i in 0..10 {
        match e.add(&add_req(&format!("c{i}"), "eth0", &["a"], &[])) {
            Ok(out) => got.push(out.allocations[0].address.to_string()),
            Err(AllocError::NoPoolFits { .. }) => break,
            Err(other) => panic!("{other}"),
        }
    }
    assert_eq!(got, ["10.0.0.3", "10.0.0.5", "10.0.0.6"]);
}

#[test]
fn multi_nic_attachments_are_independent() {
    let e = engine(vec![
        pool("a", "10.0.0.0/24", &["10.0.0.10"], None),
        pool("b", "10.0.1.0/24", &["10.0.1.10"], None),
    ]);
    let eth0 = e.add(&add_req("c1", "eth0", &["a"], &[])).unwrap();
    // net1's pool is exhausted by someone else: net1 fails, eth0 keeps its address.
    e.add(&add_req("other", "eth0", &["b"], &[])).unwrap();
    assert!(e.add(&add_req("c1", "net1", &["b"], &[])).is_err());
    assert!(
        e.add(&add_req("c1", "net1", &["b"], &[])).is_err(),
        "a retry neither leaks nor consumes"
    );
    assert_eq!(
        e.check(&att("c1", "eth0")).unwrap().allocations,
        eth0.allocations
    );
    assert_eq!(e.store().all().unwrap().len(), 2);
}

#[test]
fn a_statefulset_pod_gets_its_address_back_while_its_pool_is_unchanged() {
    let e = engine(vec![
        pool("a", "10.0.0.0/24", &["10.0.0.10-10.0.0.12"], None),
        pool("b", "10.0.1.0/24", &["10.0.1.10-10.0.1.12"], None),
    ]);
    let stateful = |container: &str, v4: &[&str]| {
        let mut r = add_req(container, "eth0", v4, &[]);
        r.pod.name = "web-0".into();
        r.pod.owner = Some(Owner {
            kind: "StatefulSet".into(),
            name: "web".into(),
        });
        r
    };
    e.add(&add_req("x", "eth0", &["a"], &[])).unwrap();
    let first = e.add(&stateful("c1", &["a"])).unwrap();
    assert_eq!(first.allocations[0].address, ip("10.0.0.11"));
    e.del(&att("c1", "eth0")).unwrap();
    assert_eq!(
        e.store().detached_of("ns", "web-0").unwrap().len(),
        1,
        "kept, not released"
    );
    // Another pod cannot take the kept address.
    let other = e.add(&add_req("y", "eth0", &["a"], &[])).unwrap();
    assert_ne!(other.allocations[0].address, ip("10.0.0.11"));
    // The pod comes back in a new sandbox: same address.
    let back = e.add(&stateful("c2", &["a"])).unwrap();
    assert_eq!(back.allocations[0].address, ip("10.0.0.11"));
    // Its pools change: a fresh address from the new pool; the kept one stays kept until GC.
    e.del(&att("c2", "eth0")).unwrap();
    let moved = e.add(&stateful("c3", &["b"])).unwrap();
    assert_eq!(moved.allocations[0].pool, "b");
}

#[test]
fn a_statefulset_pod_recreated_before_the_old_del_takes_its_address_over() {
    let e = engine(vec![pool(
        "a",
        "10.0.0.0/24",
        &["10.0.0.10-10.0.0.12"],
        None,
    )]);
    let stateful = |container: &str| {
        let mut r = add_req(container, "eth0", &["a"], &[]);
        r.pod.name = "web-0".into();
        r.pod.owner = Some(Owner {
            kind: "StatefulSet".into(),
            name: "web".into(),
        });
        r
    };
    let first = e.add(&stateful("c1")).unwrap();
    let second = e.add(&stateful("c2")).unwrap();
    assert_eq!(
        second.allocations, first.allocations,
        "the new sandbox takes the address over"
    );
    assert!(
        e.del(&att("c1", "eth0")).unwrap().is_empty(),
        "the late DEL of the old sandbox releases nothing"
    );
    assert_eq!(
        e.check(&att("c2", "eth0")).unwrap().allocations,
        first.allocations
    );
    assert_eq!(e.store().all().unwrap().len(), 1);
}

#[test]
fn concurrent_adds_of_one_attachment_get_one_address() {
    let e = Arc::new(engine(vec![pool(
        "a",
        "10.0.0.0/24",
        &["10.0.0.10-10.0.0.59"],
        None,
    )]));
    let barrier = Arc::new(Barrier::new(10));
    let threads: Vec<_> = (0..10)
        .map(|_| {
            let (e, barrier) = (e.clone(), barrier.clone());
            std::thread::spawn(move || {
                barrier.wait();
                e.add(&add_req("c1", "eth0", &["a"], &[]))
                    .unwrap()
                    .allocations
            })
        })
        .collect();
    let answers: HashSet<String> = threads
        .into_iter()
        .map(|t| format!("{:?}", t.join().unwrap()))
        .collect();
    assert_eq!(
        answers.len(),
        1,
        "every caller gets the same answer: {answers:?}"
    );
    assert_eq!(e.store().all().unwrap().len(), 1);
}

#[test]
fn gc_releases_every_claim_not_listed_as_valid() {
    let e = engine(vec![pool(
        "a",
        "10.0.0.0/24",
        &["10.0.0.10-10.0.0.20"],
        None,
    )]);
    for c in ["c1", "c2", "c3"] {
        e.add(&add_req(c, "eth0", &["a"], &[])).unwrap();
    }
    let mut elsewhere = add_req("c9", "net1", &["a"], &[]);
    elsewhere.network = "net-b".into();
    e.add(&elsewhere).unwrap();
    let valid = BTreeSet::from([att("c2", "eth0")]);
    let first = e.gc("net-a", &valid).unwrap();
    assert!(
        first.released.is_empty(),
        "a leak is released only when seen twice"
    );
    assert_eq!(first.suspects, 2);
    let released = e.gc("net-a", &valid).unwrap().released;
    let mut gone: Vec<String> = released
        .iter()
        .map(|c| c.attachment.clone().unwrap().container_id)
        .collect();
    gone.sort();
    assert_eq!(gone, ["c1", "c3"], "net-b's claim is not net-a's garbage");
    assert_eq!(e.store().all().unwrap().len(), 2);
    assert_eq!(e.usage()[0].free, 9);
}

/// Two nodes' agents share one store (etcd, the cluster's IPBlocks). Node A's runtime lists
/// only node A's attachments, so node A's GC must never judge node B's claims: before claims
/// recorded their node, A's second GC released B's live pods' addresses and handed them out.
#[test]
fn gc_on_a_shared_store_judges_its_own_nodes_claims_only() {
    let store = std::sync::Arc::new(MemoryStore::new());
    let pools = || vec![pool("a", "10.0.0.0/24", &["10.0.0.10-10.0.0.20"], None)];
    let shared = EngineConfig {
        single_node: false,
        ..quick()
    };
    let node_a = engine_on(store.clone(), pools(), shared).on_node("node-a");
    let node_b = engine_on(store.clone(), pools(), shared).on_node("node-b");
    let on_b = node_b.add(&add_req("b1", "eth0", &["a"], &[])).unwrap();
    node_a.add(&add_req("a1", "eth0", &["a"], &[])).unwrap();
    node_a.add(&add_req("a2", "eth0", &["a"], &[])).unwrap();
    let claims = store.all().unwrap();
    assert_eq!(
        claims.iter().filter(|c| c.node == "node-b").count(),
        1,
        "every claim names the node that made it: {claims:?}"
    );

    // Node A's runtime still runs a1; a2 is gone; it knows nothing of b1.
    let valid = BTreeSet::from([att("a1", "eth0")]);
    assert_eq!(node_a.gc("net-a", &valid).unwrap().suspects, 1);
    let released = node_a.gc("net-a", &valid).unwrap().released;
    let gone: Vec<&str> = released
        .iter()
        .map(|c| c.attachment.as_ref().unwrap().container_id.as_str())
        .collect();
    assert_eq!(gone, ["a2"], "node B's pod keeps its address");
    let b_address = on_b.allocations[0].address;
    assert!(
        store
            .all()
            .unwrap()
            .iter()
            .any(|c| c.address == b_address && c.node == "node-b"),
        "b1 still holds {b_address}"
    );
    // Node B's own GC, with b1 running, releases nothing.
    let valid = BTreeSet::from([att("b1", "eth0")]);
    node_b.gc("net-a", &valid).unwrap();
    assert!(node_b.gc("net-a", &valid).unwrap().released.is_empty());
}

/// Claims written before claims recorded their node: with the embedded store (one node) they
/// are that node's, and its GC releases them as before; with a shared store they may be any
/// node's, and no node's CNI GC judges them (the controller's GC does, from the pods).
#[test]
fn gc_of_claims_without_a_node_only_where_the_store_serves_one_node() {
    for single_node in [true, false] {
        let store = MemoryStore::new();
        store
            .claim(&[Claim {
                address: ip("10.0.0.10"),
                pool: "a".into(),
                network: "net-a".into(),
                attachment: Some(att("old", "eth0")),
                pod: PodRef::default(),
                node: String::new(),
                updated_at: 0,
            }])
            .unwrap();
        let config = EngineConfig {
            single_node,
            ..quick()
        };
        let e = engine_on(
            store,
            vec![pool("a", "10.0.0.0/24", &["10.0.0.10-10.0.0.11"], None)],
            config,
        )
        .on_node("node-a");
        let none = BTreeSet::new();
        e.gc("net-a", &none).unwrap();
        let released = e.gc("net-a", &none).unwrap().released.len();
        assert_eq!(
            released,
            usize::from(single_node),
            "single node: {single_node}"
        );
    }
}

#[test]
fn reload_keeps_claims_and_rebuilds_indexes_from_the_store() {
    let store = MemoryStore::new();
    store
        .claim(&[Claim {
            address: ip("10.0.0.10"),
            pool: "a".into(),
            network: "net-a".into(),
            attachment: Some(att("old", "eth0")),
            pod: PodRef::default(),
            node: String::new(),
            updated_at: 0,
        }])
        .unwrap();
    let e = Engine::with_config(
        store,
        CniDefaultsPolicy,
        quick(),
        allot_core::store::system_clock(),
    );
    e.load(
        vec![pool("a", "10.0.0.0/24", &["10.0.0.10-10.0.0.11"], None)],
        vec![],
        vec![],
    )
    .unwrap();
    let out = e.add(&add_req("c1", "eth0", &["a"], &[])).unwrap();
    assert_eq!(
        out.allocations[0].address,
        ip("10.0.0.11"),
        "the claimed .10 is not free"
    );
    // The pool is renamed: the claim on .10 still keeps it out of every index.
    e.load(
        vec![pool(
            "renamed",
            "10.0.0.0/24",
            &["10.0.0.10-10.0.0.12"],
            None,
        )],
        vec![],
        vec![],
    )
    .unwrap();
    let out = e.add(&add_req("c2", "eth0", &["renamed"], &[])).unwrap();
    assert_eq!(out.allocations[0].address, ip("10.0.0.12"));
}

/// A store shared with another (simulated) agent that already holds some addresses the engine's
/// index thinks are free.
struct RacingStore {
    inner: MemoryStore,
}

impl RacingStore {
    fn hidden(&self) -> BTreeSet<IpAddr> {
        self.inner
            .all()
            .unwrap()
            .into_iter()
            .filter(|c| c.pool == "other-agent")
            .map(|c| c.address)
            .collect()
    }
}

impl Store for RacingStore {
    fn claim_batch(
        &self,
        fresh: &[Claim],
        reattach: &[Reattach],
    ) -> Result<Vec<Claim>, StoreError> {
        self.inner.claim_batch(fresh, reattach)
    }
    fn release_attachment(&self, a: &Attachment) -> Result<Vec<Claim>, StoreError> {
        self.inner.release_attachment(a)
    }
    fn release(&self, addr: IpAddr, a: Option<&Attachment>) -> Result<bool, StoreError> {
        self.inner.release(addr, a)
    }
    fn release_unchanged(&self, claims: &[Claim]) -> Result<Vec<Claim>, StoreError> {
        self.inner.release_unchanged(claims)
    }
    fn detach(&self, a: &Attachment, now: u64) -> Result<Vec<Claim>, StoreError> {
        self.inner.detach(a, now)
    }
    fn quarantine(
        &self,
        addr: IpAddr,
        a: &Attachment,
        holder: &PodRef,
        now: u64,
    ) -> Result<Claim, StoreError> {
        self.inner.quarantine(addr, a, holder, now)
    }
    fn claims_of(&self, a: &Attachment) -> Result<Vec<Claim>, StoreError> {
        self.inner.claims_of(a)
    }
    fn claims_of_pod(&self, ns: &str, name: &str) -> Result<Vec<Claim>, StoreError> {
        self.inner.claims_of_pod(ns, name)
    }
    fn detached(&self) -> Result<Vec<Claim>, StoreError> {
        self.inner.detached()
    }
    fn all(&self) -> Result<Vec<Claim>, StoreError> {
        self.inner.all()
    }
    // The other agent's claims are invisible to the index: not in the snapshot, not in the feed.
    fn snapshot(&self, since: u64) -> Result<Snapshot, StoreError> {
        let hidden = self.hidden();
        let mut s = self.inner.snapshot(since)?;
        s.claims.retain(|c| !hidden.contains(&c.address));
        Ok(s)
    }
    fn changes_since(&self, revision: u64) -> Result<Changes, StoreError> {
        let hidden = self.hidden();
        Ok(match self.inner.changes_since(revision)? {
            Changes::Since {
                mut changes,
                revision,
            } => {
                changes.retain(|c| !hidden.contains(&c.address));
                Changes::Since { changes, revision }
            }
            Changes::Compacted => Changes::Compacted,
        })
    }
}

#[test]
fn lost_races_are_retried_with_other_addresses() {
    let inner = MemoryStore::new();
    let theirs: Vec<Claim> = ["10.0.0.10", "10.0.0.11"]
        .iter()
        .map(|a| Claim {
            address: ip(a),
            pool: "other-agent".into(),
            network: "net-a".into(),
            attachment: Some(att("theirs", a)),
            pod: PodRef::default(),
            node: String::new(),
            updated_at: 0,
        })
        .collect();
    inner.claim(&theirs).unwrap();
    let e = engine_on(
        RacingStore { inner },
        vec![pool("a", "10.0.0.0/24", &["10.0.0.10-10.0.0.12"], None)],
        quick(),
    );
    let out = e.add(&add_req("c1", "eth0", &["a"], &[])).unwrap();
    assert_eq!(out.allocations[0].address, ip("10.0.0.12"));
    assert!(
        e.add(&add_req("c2", "eth0", &["a"], &[])).is_err(),
        "nothing left"
    );
}

#[test]
fn concurrent_adds_get_distinct_addresses() {
    let e = Arc::new(engine(vec![pool("a", "10.0.0.0/16", &[], None)]));
    let barrier = Arc::new(Barrier::new(8));
    let threads: Vec<_> = (0..8)
        .map(|t| {
            let (e, barrier) = (e.clone(), barrier.clone());
            std::thread::spawn(move || {
                barrier.wait();
                (0..200)
                    .map(|i| {
                        e.add(&add_req(&format!("t{t}-{i}"), "eth0", &["a"], &[]))
                            .unwrap()
                            .allocations[0]
                            .address
                    })
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let mut all = HashSet::new();
    for t in threads {
        for a in t.join().unwrap() {
            assert!(all.insert(a), "{a} handed out twice");
        }
    }
    assert_eq!(all.len(), 1600);
}

#[test]
fn adds_before_pools_are_loaded_fail_clearly() {
    let e = Engine::new(MemoryStore::new(), CniDefaultsPolicy);
    assert!(matches!(
        e.add(&add_req("c1", "eth0", &["a"], &[])),
        Err(AllocError::NotLoaded)
    ));
}

#[test]
fn a_nic_the_policy_fails_fails_its_add_with_the_policys_error() {
    let e = engine(vec![pool("a", "10.0.0.0/24", &[], None)]);
    let mut req = add_req("c1", "eth0", &["a"], &[]);
    req.pod.annotations.insert("fail-nic".into(), "eth0".into());
    match e.add(&req) {
        Err(AllocError::Policy(err)) => {
            assert_eq!(err.kind, PolicyErrorKind::InvalidInput);
            assert_eq!(err.message, "IPPool ghost named for eth0 does not exist");
        }
        other => panic!("expected the policy's error, got {other:?}"),
    }
    assert!(e.store().claims_of(&att("c1", "eth0")).unwrap().is_empty());
}

#[test]
fn a_retried_add_keeps_serving_what_it_holds_when_the_policy_fails_the_nic() {
    let e = engine(vec![pool("a", "10.0.0.0/24", &[], None)]);
    let mut req = add_req("c1", "eth0", &["a"], &[]);
    let first = e.add(&req).unwrap();
    req.pod.annotations.insert("fail-nic".into(), "eth0".into());
    let retried = e.add(&req).unwrap();
    assert_eq!(retried.allocations, first.allocations);
    assert!(retried.repeated);
}
