//! The address lifecycle and the engine's honesty about the store: indexes fed by the change
//! feed, retries that restore everything, terminating pools, GC past a grace period, kept
//! StatefulSet addresses that expire, late DELs, quarantines. Cooldowns and cursors are in
//! `cooldown`.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use allot_core::store::{
    Attachment, Changes, Claim, MemoryStore, PodRef, Reattach, Snapshot, Store, StoreError,
};
use allot_engine::{AllocError, DelRequest, Engine, EngineConfig, LoadError, PoolState};

use crate::common::*;

/// Two engines on one store (two agents, or an agent and `allotctl`) see each other's claims
/// and releases: a pool of 6 with 3 taken elsewhere reports 3 free and serves exactly 3.
#[test]
fn engines_sharing_a_store_keep_their_indexes_true() {
    let store = Arc::new(MemoryStore::new());
    let pools = || vec![pool("a", "10.0.0.0/24", &["10.0.0.10-10.0.0.15"], None)];
    let one = engine_on(store.clone(), pools(), quick());
    let two = engine_on(store.clone(), pools(), quick());
    for c in ["c1", "c2", "c3"] {
        one.add(&add_req(c, "eth0", &["a"], &[])).unwrap();
    }
    two.tick().unwrap();
    assert_eq!(two.usage()[0].free, 3, "the other engine's claims are used");
    let mut got = BTreeSet::new();
    for c in ["d1", "d2", "d3"] {
        got.extend(addresses(
            &two.add(&add_req(c, "eth0", &["a"], &[])).unwrap(),
        ));
    }
    assert_eq!(got.len(), 3);
    assert!(matches!(
        two.add(&add_req("d4", "eth0", &["a"], &[])),
        Err(AllocError::NoPoolFits { .. })
    ));
    // A release by one is free in the other.
    one.del(&att("c1", "eth0")).unwrap();
    two.tick().unwrap();
    assert_eq!(two.usage()[0].free, 1);
    two.add(&add_req("d4", "eth0", &["a"], &[])).unwrap();
    assert_eq!(store.all().unwrap().len(), 6);
}

/// Engines of different nodes sharing a store start each pool at places of their own: their
/// first allocations differ, where engines without a spread take the same first address.
#[test]
fn nodes_sharing_a_store_start_each_pool_at_a_place_of_their_own() {
    let pools = || vec![pool("a", "10.0.0.0/16", &[], None)];
    let first = |spread: Option<u64>| {
        let store = Arc::new(MemoryStore::new());
        let config = EngineConfig { spread, ..quick() };
        let e = engine_on(store, pools(), config);
        addresses(&e.add(&add_req("c1", "eth0", &["a"], &[])).unwrap())[0]
    };
    assert_eq!(first(None), first(None), "one order without a spread");
    let places: BTreeSet<_> = (1..=10).map(|node| first(Some(node))).collect();
    assert!(
        places.len() >= 9,
        "ten nodes in a /16 start at ten places, not {places:?}"
    );
    // A place of its own is kept: the same node starts at the same place again.
    assert_eq!(first(Some(7)), first(Some(7)));
}

/// A pool emptied and filled again within its cooldown has only cooling addresses to give:
/// engines of different nodes then take them in orders of their own (to within a few seconds of
/// release), where all would otherwise take the same one next and all but one lose the race for
/// it; an engine alone still takes the one released first.
#[test]
fn nodes_sharing_a_store_take_cooling_addresses_in_orders_of_their_own() {
    let first_cooling = |spread: Option<u64>| {
        let config = EngineConfig {
            cooldown: 30,
            spread,
            ..quick()
        };
        let (e, now) = clocked(config, 1000);
        e.load(
            vec![pool("a", "10.0.0.0/24", &["10.0.0.10-10.0.0.49"], None)],
            vec![],
            vec![],
        )
        .unwrap();
        for i in 0..40 {
            e.add(&add_req(&format!("c{i}"), "eth0", &["a"], &[]))
                .unwrap();
        }
        for i in 0..40 {
            // Ten per second, as a Deployment scaled to 0 goes.
            now.store(1000 + i / 10, Ordering::SeqCst);
            e.del(&att(&format!("c{i}"), "eth0")).unwrap();
        }
        now.store(1010, Ordering::SeqCst);
        let out = e.add(&add_req("again", "eth0", &["a"], &[])).unwrap();
        assert_eq!(
            e.usage()[0].cooldown_cut_short,
            1,
            "only cooling ones were left"
        );
        addresses(&out)[0]
    };
    assert_eq!(first_cooling(None), first_cooling(None));
    let places: BTreeSet<IpAddr> = (1..=10).map(|node| first_cooling(Some(node))).collect();
    assert!(
        places.len() >= 6,
        "ten nodes take ten different cooling addresses first, not {places:?}"
    );
    assert_eq!(
        first_cooling(Some(3)),
        first_cooling(Some(3)),
        "a node keeps its order"
    );
}

/// When the feed has been compacted past the engine's revision, it rebuilds from a snapshot.
#[test]
fn a_compacted_feed_falls_back_to_a_snapshot() {
    let store = Arc::new(MemoryStore::new());
    let pools = || vec![pool("a", "10.0.0.0/24", &["10.0.0.10-10.0.0.15"], None)];
    let one = engine_on(store.clone(), pools(), quick());
    let two = engine_on(store.clone(), pools(), quick());
    one.add(&add_req("c1", "eth0", &["a"], &[])).unwrap();
    one.add(&add_req("c2", "eth0", &["a"], &[])).unwrap();
    let Changes::Since { revision, .. } = store.changes_since(0).unwrap() else {
        panic!("young store");
    };
    store.compact(revision);
    two.tick().unwrap();
    assert_eq!(two.usage()[0].free, 4);
}

/// A retried dual-stack ADD whose IPv6 claim is missing (a partial failure) completes it
/// instead of returning IPv4 alone.
#[test]
fn a_retried_add_completes_missing_families() {
    let store = Arc::new(MemoryStore::new());
    let e = engine_on(
        store.clone(),
        vec![
            pool("v4", "10.0.0.0/24", &["10.0.0.10-10.0.0.15"], None),
            pool("v6", "fd00::/64", &["fd00::10-fd00::15"], None),
        ],
        quick(),
    );
    let req = add_req("c1", "eth0", &["v4"], &["v6"]);
    let first = e.add(&req).unwrap();
    assert_eq!(first.allocations.len(), 2);
    // The IPv6 claim is lost (its undo failed half-way, someone released it by hand, ...).
    let v6 = first.allocations[1].address;
    assert!(store.release(v6, Some(&att("c1", "eth0"))).unwrap());

    let retried = e.add(&req).unwrap();
    assert_eq!(retried.allocations.len(), 2, "both families: {retried:?}");
    assert_eq!(retried.allocations[0], first.allocations[0]);
    assert!(retried.allocations[1].address.is_ipv6());
    assert_eq!(store.claims_of(&att("c1", "eth0")).unwrap().len(), 2);
}

/// A StatefulSet pod coming back takes its kept address and gets the family it lacked, in one
/// batch: nothing is half-done.
#[test]
fn a_statefulset_pod_taking_its_address_back_gets_every_family() {
    let e = engine(vec![
        pool("v4", "10.0.0.0/24", &["10.0.0.10-10.0.0.15"], None),
        pool("v6", "fd00::/64", &["fd00::10-fd00::15"], None),
    ]);
    let first = e.add(&stateful_req("c1", "web-0", "web", &["v4"])).unwrap();
    e.del(&att("c1", "eth0")).unwrap();
    let mut back = stateful_req("c2", "web-0", "web", &["v4"]);
    back.cni_defaults.ipv6 = vec!["v6".into()];
    let out = e.add(&back).unwrap();
    assert_eq!(out.allocations[0], first.allocations[0], "the same IPv4");
    assert!(out.allocations[1].address.is_ipv6());
    assert!(e.store().detached().unwrap().is_empty());
}

/// A store that counts full scans and can fail releases on demand.
struct Watched {
    inner: MemoryStore,
    scans: AtomicUsize,
    release_calls: AtomicUsize,
    fail_releases_after: AtomicUsize,
    failing: AtomicBool,
}

impl Watched {
    fn new() -> Self {
        Watched {
            inner: MemoryStore::new(),
            scans: AtomicUsize::new(0),
            release_calls: AtomicUsize::new(0),
            fail_releases_after: AtomicUsize::new(usize::MAX),
            failing: AtomicBool::new(false),
        }
    }
}

impl Store for Watched {
    fn claim_batch(&self, f: &[Claim], r: &[Reattach]) -> Result<Vec<Claim>, StoreError> {
        self.inner.claim_batch(f, r)
    }
    fn release_attachment(&self, a: &Attachment) -> Result<Vec<Claim>, StoreError> {
        self.inner.release_attachment(a)
    }
    fn release(&self, addr: IpAddr, a: Option<&Attachment>) -> Result<bool, StoreError> {
        self.inner.release(addr, a)
    }
    fn release_unchanged(&self, claims: &[Claim]) -> Result<Vec<Claim>, StoreError> {
        let n = self.release_calls.fetch_add(1, Ordering::SeqCst);
        if n >= self.fail_releases_after.load(Ordering::SeqCst) {
            self.failing.store(true, Ordering::SeqCst);
            return Err(StoreError::unavailable("disk on fire"));
        }
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
        self.scans.fetch_add(1, Ordering::SeqCst);
        self.inner.all()
    }
    fn snapshot(&self, since: u64) -> Result<Snapshot, StoreError> {
        self.scans.fetch_add(1, Ordering::SeqCst);
        self.inner.snapshot(since)
    }
    fn changes_since(&self, revision: u64) -> Result<Changes, StoreError> {
        self.inner.changes_since(revision)
    }
}

fn foreign_claims(n: usize) -> Vec<Claim> {
    (0..n)
        .map(|i| Claim {
            address: IpAddr::from([10, 9, (i >> 8) as u8, i as u8]),
            pool: "elsewhere".into(),
            network: "net-a".into(),
            attachment: Some(att(&format!("f{i}"), "eth0")),
            pod: PodRef {
                namespace: "ns".into(),
                name: format!("f{i}"),
                uid: format!("u{i}"),
                ..Default::default()
            },
            node: String::new(),
            updated_at: 0,
        })
        .collect()
}

/// ADD, retried ADD, StatefulSet ADD, DEL and CHECK never read every claim: they use the
/// store's indexes (by attachment, by pod) and the change feed.
#[test]
fn requests_never_scan_every_claim() {
    let store = Arc::new(Watched::new());
    store.inner.claim(&foreign_claims(2000)).unwrap();
    let e = engine_on(
        store.clone(),
        vec![pool("a", "10.0.0.0/24", &["10.0.0.10-10.0.0.50"], None)],
        quick(),
    );
    let scans = store.scans.load(Ordering::SeqCst);
    e.add(&add_req("c1", "eth0", &["a"], &[])).unwrap();
    e.add(&add_req("c1", "eth0", &["a"], &[])).unwrap();
    e.check(&att("c1", "eth0")).unwrap();
    e.del(&att("c1", "eth0")).unwrap();
    e.add(&stateful_req("s1", "web-0", "web", &["a"])).unwrap();
    e.del(&att("s1", "eth0")).unwrap();
    e.add(&stateful_req("s2", "web-0", "web", &["a"])).unwrap();
    e.add(&stateful_req("s3", "web-0", "web", &["a"])).unwrap();
    assert_eq!(
        store.scans.load(Ordering::SeqCst),
        scans,
        "a request read every claim"
    );
}

/// A pool deleted while it holds claims keeps serving them (retried ADD and CHECK answer the
/// same), takes no new allocations, and shows as terminating until its claims are gone.
#[test]
fn a_deleted_pool_serves_its_claims_until_they_are_released() {
    let e = engine(vec![
        pool(
            "a",
            "10.0.0.0/24",
            &["10.0.0.10-10.0.0.15"],
            Some("10.0.0.1"),
        ),
        pool("b", "10.0.1.0/24", &["10.0.1.10-10.0.1.15"], None),
    ]);
    let req = add_req("c1", "eth0", &["a"], &[]);
    let first = e.add(&req).unwrap();
    let checked = e.check(&att("c1", "eth0")).unwrap();

    e.load(
        vec![pool("b", "10.0.1.0/24", &["10.0.1.10-10.0.1.15"], None)],
        vec![],
        vec![],
    )
    .unwrap();
    let usage = e.usage();
    let a = usage.iter().find(|u| u.name == "a").expect("a is listed");
    assert_eq!((a.state, a.claims), (PoolState::Terminating, 1));
    assert_eq!(e.check(&att("c1", "eth0")).unwrap(), checked);
    let retried = e.add(&req).unwrap();
    assert_eq!(retried.allocations, first.allocations);
    assert_eq!(retried.routes, first.routes);
    assert!(
        e.add(&add_req("c2", "eth0", &["a"], &[])).is_err(),
        "no new allocations"
    );
    e.del(&att("c1", "eth0")).unwrap();
    assert!(e.usage().iter().all(|u| u.name != "a"));
}

#[test]
fn loading_duplicate_names_is_an_error_not_a_panic() {
    let e = engine(vec![]);
    let err = e
        .load(
            vec![
                pool("a", "10.0.0.0/24", &["10.0.0.10"], None),
                pool("a", "10.0.1.0/24", &["10.0.1.10"], None),
            ],
            vec![],
            vec![],
        )
        .unwrap_err();
    assert!(matches!(err, LoadError::Duplicate { .. }), "{err}");
}

/// GC releases a leak only when seen twice at least the grace period apart, re-checked.
#[test]
fn gc_waits_for_the_grace_period() {
    let config = EngineConfig {
        gc_grace: 60,
        ..quick()
    };
    let (e, now) = clocked(config, 1000);
    e.load(
        vec![pool("a", "10.0.0.0/24", &["10.0.0.10-10.0.0.15"], None)],
        vec![],
        vec![],
    )
    .unwrap();
    e.add(&add_req("c1", "eth0", &["a"], &[])).unwrap();
    let none = BTreeSet::new();
    now.store(1100, Ordering::SeqCst);
    assert_eq!(e.gc("net-a", &none).unwrap().suspects, 1);
    now.store(1130, Ordering::SeqCst);
    assert!(
        e.gc("net-a", &none).unwrap().released.is_empty(),
        "within grace"
    );
    // Re-ADDed meanwhile by a new sandbox of the attachment: changed, so kept.
    now.store(1170, Ordering::SeqCst);
    assert_eq!(e.gc("net-a", &none).unwrap().released.len(), 1);
    assert!(e.store().all().unwrap().is_empty());
}

/// Thousands of leaks are released in batches, and a store failure mid-run loses nothing: what
/// was not released stays claimed, and the next run finishes the job.
#[test]
fn gc_releases_in_batches_and_survives_a_store_error() {
    let store = Arc::new(Watched::new());
    let e = engine_on(
        store.clone(),
        vec![pool("a", "10.0.0.0/20", &["10.0.0.10-10.0.15.200"], None)],
        quick(),
    );
    for i in 0..2500 {
        e.add(&add_req(&format!("c{i}"), "eth0", &["a"], &[]))
            .unwrap();
    }
    let none = BTreeSet::new();
    assert_eq!(e.gc("net-a", &none).unwrap().suspects, 2500);
    store.fail_releases_after.store(
        store.release_calls.load(Ordering::SeqCst) + 1,
        Ordering::SeqCst,
    );
    assert!(e.gc("net-a", &none).is_err(), "the second batch fails");
    assert_eq!(store.all().unwrap().len(), 1500, "one batch was committed");
    let free_after_error = e.usage()[0].free;
    store
        .fail_releases_after
        .store(usize::MAX, Ordering::SeqCst);
    let calls = store.release_calls.load(Ordering::SeqCst);
    let report = e.gc("net-a", &none).unwrap();
    assert_eq!(report.released.len(), 1500);
    assert_eq!(
        store.release_calls.load(Ordering::SeqCst) - calls,
        2,
        "1,500 releases in two transactions"
    );
    assert!(store.all().unwrap().is_empty());
    assert_eq!(e.usage()[0].free, free_after_error + 1500);
}

/// A kept StatefulSet address whose pod does not come back is released after the keep time;
/// a DEL that knows the set was scaled down releases at once.
#[test]
fn kept_statefulset_addresses_expire_and_scaled_down_ordinals_are_released() {
    let config = EngineConfig {
        stateful_keep: 100,
        ..quick()
    };
    let (e, now) = clocked(config, 1000);
    e.load(
        vec![pool("a", "10.0.0.0/24", &["10.0.0.10-10.0.0.15"], None)],
        vec![],
        vec![],
    )
    .unwrap();
    e.add(&stateful_req("c0", "web-0", "web", &["a"])).unwrap();
    e.add(&stateful_req("c1", "web-1", "web", &["a"])).unwrap();
    e.del(&att("c0", "eth0")).unwrap();
    now.store(1050, Ordering::SeqCst);
    assert!(e.expire_kept().unwrap().is_empty(), "within the keep time");
    now.store(1101, Ordering::SeqCst);
    assert_eq!(e.expire_kept().unwrap().len(), 1);

    // Scaled from 2 to 1: web-1 is gone for good.
    let released = e
        .del_request(&DelRequest {
            owner_replicas: Some(1),
            ..DelRequest::new(att("c1", "eth0"))
        })
        .unwrap();
    assert_eq!(released.len(), 1);
    assert!(e.store().all().unwrap().is_empty(), "released, not kept");
}

/// A DEL replayed from a journal is ordered with the attachment's ADDs by the attachment's
/// lock, not by comparing times: while its replayer holds the lock, an ADD of the attachment
/// waits, so the DEL releases the claims of the ADD before it, and the ADD after it gets fresh
/// ones. (Times cannot order them: a repeated ADD writes nothing, a re-ADD may fall in the
/// DEL's second, and clocks step.)
#[test]
fn a_journaled_del_holding_the_lock_comes_before_a_later_add() {
    let (e, now) = clocked(quick(), 1000);
    let e = Arc::new(e);
    e.load(
        vec![pool("a", "10.0.0.0/24", &["10.0.0.10-10.0.0.15"], None)],
        vec![],
        vec![],
    )
    .unwrap();
    e.add(&add_req("c1", "eth0", &["a"], &[])).unwrap();
    // Issued in the same second as the claim, and with a clock stepped back since.
    now.store(990, Ordering::SeqCst);
    let journaled = DelRequest {
        issued_at: Some(1000),
        ..DelRequest::new(att("c1", "eth0"))
    };
    let lock = e.serialize(&att("c1", "eth0"));
    let readd = {
        let e = e.clone();
        std::thread::spawn(move || e.add(&add_req("c1", "eth0", &["a"], &[])).unwrap())
    };
    std::thread::sleep(std::time::Duration::from_millis(50));
    assert!(!readd.is_finished(), "the ADD waits for the DEL");
    assert_eq!(e.del_serialized(&lock, &journaled).unwrap().len(), 1);
    drop(lock);
    let after = readd.join().unwrap();
    assert!(!after.repeated, "the ADD after the DEL claims afresh");
    assert_eq!(
        e.store().all().unwrap().len(),
        1,
        "the re-ADD holds its address"
    );
}

/// A policy that orders every pool, whatever its state: the host must not trust it.
struct OrdersEverything;

impl allot_core::policy::Policy for OrdersEverything {
    fn decide(
        &self,
        inv: &Arc<allot_core::policy::Inventory>,
        req: &allot_core::policy::Request,
    ) -> Result<allot_core::policy::Decision, allot_core::policy::PolicyError> {
        use allot_core::policy::{AcquisitionRule, Decision, FamilyDecision, NicDecision};
        let all: Vec<u32> = (0..inv.pools.len() as u32).collect();
        Ok(Decision {
            nics: req
                .nics
                .iter()
                .map(|n| NicDecision {
                    interface: n.interface.clone(),
                    error: None,
                    clean_gateway: false,
                    routes: vec![],
                    families: vec![FamilyDecision {
                        family: allot_core::IpFamily::V4,
                        rule: AcquisitionRule::CniDefault,
                        source: "test".into(),
                        candidates: all.clone(),
                        order: all.clone(),
                        dropped: vec![],
                        address: None,
                    }],
                })
                .collect(),
        })
    }

    fn name(&self) -> String {
        "orders-everything".into()
    }
}

#[test]
fn a_policy_ordering_a_disabled_pool_is_refused_by_the_host() {
    let mut off = pool("off", "10.0.0.0/24", &["10.0.0.10-10.0.0.15"], None);
    off.spec.disable = true;
    let e = Engine::with_config(
        MemoryStore::new(),
        OrdersEverything,
        quick(),
        allot_core::store::system_clock(),
    );
    e.load(vec![off], vec![], vec![]).unwrap();
    let err = e.add(&add_req("c1", "eth0", &["off"], &[])).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, AllocError::Policy(_)), "{err:?}");
    assert!(
        msg.contains("orders-everything") && msg.contains("off") && msg.contains("disabled"),
        "{msg}"
    );
    assert!(e.store().all().unwrap().is_empty(), "nothing was claimed");
}

/// An address found in use on the link is quarantined: the attachment gets the next address in
/// the same call, the quarantined one stays claimed by the conflict (never by GC's leak
/// verdict, never by the StatefulSet keep time), and is released only once its quarantine
/// has expired, then cools down like any release.
#[test]
fn a_quarantined_address_is_replaced_kept_from_gc_and_expires() {
    let config = EngineConfig {
        gc_grace: 0,
        cooldown: 30,
        stateful_keep: 10,
        ..quick()
    };
    let (e, now) = clocked(config, 1000);
    e.load(
        vec![pool("a", "10.0.0.0/24", &["10.0.0.10-10.0.0.12"], None)],
        vec![],
        vec![],
    )
    .unwrap();
    let req = add_req("c1", "eth0", &["a"], &[]);
    let first = addresses(&e.add(&req).unwrap());
    assert_eq!(first, [ip("10.0.0.10")]);

    now.store(1010, Ordering::SeqCst);
    let mac = "02:00:00:00:00:99".to_string();
    let (quarantined, outcome) = e
        .quarantine(&req, &[(first[0], mac.clone())], true)
        .unwrap();
    assert_eq!(quarantined.len(), 1);
    assert!(quarantined[0].is_quarantined(), "{quarantined:?}");
    assert_eq!(quarantined[0].pod.conflict_mac(), Some(mac.as_str()));
    assert_eq!(quarantined[0].updated_at, 1010);
    let outcome = outcome.unwrap();
    assert_eq!(addresses(&outcome), [ip("10.0.0.11")], "the next address");
    assert_eq!(outcome.claimed, [ip("10.0.0.11")]);
    assert_eq!(e.usage()[0].free, 1, "10.0.0.10 stays claimed");

    // Quarantining again what the attachment no longer holds is stale, and changes nothing.
    assert!(matches!(
        e.quarantine(&req, &[(first[0], mac.clone())], true),
        Err(AllocError::Store(StoreError::Stale(_)))
    ));

    // GC (no attachment is valid any more) and the StatefulSet keep time leave it alone.
    let none = BTreeSet::new();
    now.store(2000, Ordering::SeqCst);
    e.gc("net-a", &none).unwrap();
    let report = e.gc("net-a", &none).unwrap();
    assert_eq!(
        report
            .released
            .iter()
            .map(|c| c.address)
            .collect::<Vec<_>>(),
        [ip("10.0.0.11")],
        "GC releases the leaked attachment only"
    );
    assert!(e.expire_kept().unwrap().is_empty());

    // Not yet expired, then expired: released and cooling, not free at once.
    let (released, kept) = e.expire_quarantined(3600).unwrap();
    assert!(released.is_empty());
    assert_eq!(kept.len(), 1);
    now.store(1010 + 3600, Ordering::SeqCst);
    let (released, kept) = e.expire_quarantined(3600).unwrap();
    assert_eq!(
        released.iter().map(|c| c.address).collect::<Vec<_>>(),
        [ip("10.0.0.10")]
    );
    assert!(kept.is_empty());
    assert!(e.store().all().unwrap().is_empty());
    e.tick().unwrap();
    let usage = &e.usage()[0];
    assert_eq!(
        (usage.free, usage.cooling),
        (3, 1),
        "10.0.0.10 cools down, the others are free (and it counts as free for capacity)"
    );
}

/// A quarantine without replacement (the plugin's last round) quarantines and claims nothing
/// new; the attachment keeps its other families.
#[test]
fn a_quarantine_without_replacement_claims_nothing() {
    let e = engine_on(
        MemoryStore::new(),
        vec![
            pool("v4", "10.0.0.0/24", &["10.0.0.10-10.0.0.15"], None),
            pool("v6", "fd00::/64", &["fd00::10-fd00::15"], None),
        ],
        quick(),
    );
    let req = add_req("c1", "eth0", &["v4"], &["v6"]);
    let got = addresses(&e.add(&req).unwrap());
    let (q, outcome) = e
        .quarantine(&req, &[(got[1], "02:00:00:00:00:01".into())], false)
        .unwrap();
    assert_eq!(q[0].address, got[1]);
    assert!(outcome.is_none());
    let held: Vec<IpAddr> = e
        .store()
        .claims_of(&att("c1", "eth0"))
        .unwrap()
        .iter()
        .map(|c| c.address)
        .collect();
    assert_eq!(held, [got[0]]);
    assert_eq!(e.store().all().unwrap().len(), 2);
}
