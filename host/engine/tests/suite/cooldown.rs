//! Cooling down: a released address is handed out after every other free one, never refused;
//! a retried sandbox gets its address back at once; a pool of one serves the next pod at once;
//! cursors and cooldowns survive a restart; engines sharing a store see each other's releases
//! as cooling. (Apart from `lifecycle`, which was past 900 lines.)

use std::sync::Arc;
use std::sync::atomic::Ordering;

use allot_core::store::MemoryStore;
use allot_engine::{AllocError, EngineConfig};

use crate::common::*;

/// A just-released address cools down: every other free address is handed out before it, and
/// when only cooling ones are left the one released longest ago is handed out rather than the
/// pod refused, and counted.
#[test]
fn cooling_addresses_are_handed_out_last_never_refused() {
    let config = EngineConfig {
        cooldown: 30,
        ..quick()
    };
    let (e, now) = clocked(config, 1000);
    e.load(
        vec![pool("a", "10.0.0.0/24", &["10.0.0.10-10.0.0.13"], None)],
        vec![],
        vec![],
    )
    .unwrap();
    for c in ["c1", "c2", "c3"] {
        e.add(&add_req(c, "eth0", &["a"], &[])).unwrap();
    }
    e.del(&att("c1", "eth0")).unwrap();
    now.store(1005, Ordering::SeqCst);
    e.del(&att("c2", "eth0")).unwrap();
    let usage = &e.usage()[0];
    assert_eq!(
        (usage.free, usage.cooling),
        (3, 2),
        "cooling addresses count as free for capacity"
    );
    let out = e.add(&add_req("c4", "eth0", &["a"], &[])).unwrap();
    assert_eq!(addresses(&out), [ip("10.0.0.13")], "a cooled address first");
    let out = e.add(&add_req("c5", "eth0", &["a"], &[])).unwrap();
    assert_eq!(
        addresses(&out),
        [ip("10.0.0.10")],
        "then the one released longest ago"
    );
    let out = e.add(&add_req("c6", "eth0", &["a"], &[])).unwrap();
    assert_eq!(addresses(&out), [ip("10.0.0.11")]);
    assert_eq!(e.usage()[0].cooldown_cut_short, 2);
    assert!(
        matches!(
            e.add(&add_req("c7", "eth0", &["a"], &[])),
            Err(AllocError::NoPoolFits { .. })
        ),
        "a full pool is full"
    );
}

/// A sandbox torn down after a failed setup and retried by the runtime (a new container of the
/// same pod) gets the address its NIC released, cooling or not, each time; another pod still
/// gets the cooling address last; another network or interface of the pod is not given it.
#[test]
fn a_retried_sandbox_gets_back_the_address_its_pod_released() {
    let config = EngineConfig {
        cooldown: 30,
        ..quick()
    };
    let (e, now) = clocked(config, 1000);
    e.load(
        vec![pool("a", "10.0.0.0/24", &["10.0.0.10-10.0.0.13"], None)],
        vec![],
        vec![],
    )
    .unwrap();
    let retry = |container: &str| {
        let mut req = add_req(container, "eth0", &["a"], &[]);
        req.pod.name = "pod-two-nics".into();
        req.pod.uid = "uid-two-nics".into();
        req
    };
    let first = addresses(&e.add(&retry("try-1")).unwrap());
    for t in 2..=20u64 {
        e.del(&att(&format!("try-{}", t - 1), "eth0")).unwrap();
        now.store(1000 + t, Ordering::SeqCst);
        let got = addresses(&e.add(&retry(&format!("try-{t}"))).unwrap());
        assert_eq!(got, first, "try {t}");
    }
    assert_eq!(
        e.usage()[0].cooldown_cut_short,
        0,
        "no cooldown was cut short"
    );
    e.del(&att("try-20", "eth0")).unwrap();
    let other = addresses(&e.add(&add_req("other", "eth0", &["a"], &[])).unwrap());
    assert_ne!(
        other, first,
        "another pod gets an address that is not cooling down first"
    );
    // The same pod on another interface or network is another NIC: no preference.
    let mut net1 = retry("try-21");
    net1.attachment.interface = "net1".into();
    assert_ne!(addresses(&e.add(&net1).unwrap()), first);

    // An address a ReservedIP takes out of the pool while the pod holds it is not handed back.
    assert_eq!(addresses(&e.add(&retry("try-22")).unwrap()), first);
    let reservation = allot_core::Reserved::from_spec(
        allot_core::spec::ObjectMeta {
            name: "routers".into(),
            ..Default::default()
        },
        allot_core::spec::ReservedIpSpec {
            ip_version: None,
            ips: vec![first[0].to_string()],
        },
    )
    .expect("valid reservation");
    e.load(
        vec![pool("a", "10.0.0.0/24", &["10.0.0.10-10.0.0.13"], None)],
        vec![],
        vec![reservation],
    )
    .unwrap();
    e.del(&att("try-22", "eth0")).unwrap();
    let got = addresses(&e.add(&retry("try-23")).unwrap());
    assert_ne!(got, first, "a reserved address is never handed back");
}

/// A pool of one address serves the DEL-then-ADD of a rolling update at once, not after the
/// cooldown.
#[test]
fn a_pool_of_one_address_serves_the_next_pod_at_once() {
    let config = EngineConfig {
        cooldown: 30,
        ..quick()
    };
    let (e, _now) = clocked(config, 1000);
    e.load(
        vec![pool("one", "10.0.0.0/24", &["10.0.0.10"], None)],
        vec![],
        vec![],
    )
    .unwrap();
    e.add(&add_req("old", "eth0", &["one"], &[])).unwrap();
    e.del(&att("old", "eth0")).unwrap();
    let out = e.add(&add_req("new", "eth0", &["one"], &[])).unwrap();
    assert_eq!(addresses(&out), [ip("10.0.0.10")]);
    assert_eq!(e.usage()[0].cooldown_cut_short, 1);
}

/// Across the pools of one order, an address that is not cooling comes first, wherever it is.
#[test]
fn a_cooled_address_of_a_later_pool_beats_a_cooling_one_of_an_earlier_pool() {
    let config = EngineConfig {
        cooldown: 30,
        ..quick()
    };
    let (e, _now) = clocked(config, 1000);
    e.load(
        vec![
            pool("first", "10.0.0.0/24", &["10.0.0.10"], None),
            pool("second", "10.0.1.0/24", &["10.0.1.10"], None),
        ],
        vec![],
        vec![],
    )
    .unwrap();
    e.add(&add_req("old", "eth0", &["first"], &[])).unwrap();
    e.del(&att("old", "eth0")).unwrap();
    let out = e
        .add(&add_req("new", "eth0", &["first", "second"], &[]))
        .unwrap();
    assert_eq!(addresses(&out), [ip("10.0.1.10")]);
    assert_eq!(e.usage()[0].cooldown_cut_short, 0);
}

/// Two engines sharing a store (two nodes): a release by one is, for the other, a cooling
/// address it can still hand out, not an exhausted pool.
#[test]
fn another_engines_release_cools_but_does_not_exhaust() {
    let (clock, now) = manual_clock(1000);
    let store = Arc::new(MemoryStore::with_clock(clock));
    let config = EngineConfig {
        cooldown: 30,
        ..quick()
    };
    let pools = || vec![pool("one", "10.0.0.0/24", &["10.0.0.10"], None)];
    let a = clocked_on(store.clone(), &now, config);
    let b = clocked_on(store.clone(), &now, config);
    a.load(pools(), vec![], vec![]).unwrap();
    b.load(pools(), vec![], vec![]).unwrap();
    a.add(&add_req("old", "eth0", &["one"], &[])).unwrap();
    a.del(&att("old", "eth0")).unwrap();
    let out = b.add(&add_req("new", "eth0", &["one"], &[])).unwrap();
    assert_eq!(addresses(&out), [ip("10.0.0.10")]);
}

/// The cooldown and the round-robin cursor survive a restart (a new engine on the same store).
#[test]
fn cursor_and_cooldown_survive_a_restart() {
    let (clock, now) = manual_clock(1000);
    let store = Arc::new(MemoryStore::with_clock(clock));
    let pools = || vec![pool("a", "10.0.0.0/24", &["10.0.0.10-10.0.0.19"], None)];
    let config = EngineConfig {
        cooldown: 30,
        ..quick()
    };
    {
        let e = clocked_on(store.clone(), &now, config);
        e.load(pools(), vec![], vec![]).unwrap();
        for c in ["c1", "c2", "c3"] {
            e.add(&add_req(c, "eth0", &["a"], &[])).unwrap();
        }
        for c in ["c1", "c2", "c3"] {
            e.del(&att(c, "eth0")).unwrap();
        }
    }
    now.store(1010, Ordering::SeqCst);
    let e = clocked_on(store.clone(), &now, config);
    e.load(pools(), vec![], vec![]).unwrap();
    assert_eq!(e.usage()[0].cooling, 3, "still cooling after the restart");
    let out = e.add(&add_req("c4", "eth0", &["a"], &[])).unwrap();
    assert_eq!(
        addresses(&out),
        [ip("10.0.0.13")],
        "round robin goes on after the last address handed out"
    );
    now.store(1031, Ordering::SeqCst);
    for c in ["c5", "c6", "c7", "c8", "c9", "c10"] {
        e.add(&add_req(c, "eth0", &["a"], &[])).unwrap();
    }
    let out = e.add(&add_req("c11", "eth0", &["a"], &[])).unwrap();
    assert_eq!(
        addresses(&out),
        [ip("10.0.0.10")],
        "wrapped around, cooled down"
    );
}
