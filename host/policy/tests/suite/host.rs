//! Loading, digests, the precompiled cache, the registry's hot swap and fallback, concurrency.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use allot_core::PolicyErrorKind;
use allot_core::policy::Policy;
use allot_policy::{
    FaultKey, Limits, LoadError, OnFailure, PolicyEngine, PolicyRegistry, PolicySource,
    PrecompiledCache, sha256_hex,
};

fn engine() -> PolicyEngine {
    PolicyEngine::new(Limits::default(), None).unwrap()
}

#[test]
fn digest_is_verified_before_loading() {
    let wasm = crate::common::hostile_wasm();
    let good = sha256_hex(&wasm);
    let e = engine();
    let err = e
        .load(&PolicySource::bytes("hostile", wasm.clone()).with_sha256("00".repeat(32)))
        .unwrap_err();
    assert!(matches!(err, LoadError::DigestMismatch { .. }), "{err}");
    assert!(err.to_string().contains(&good), "{err}");
    let loaded = e
        .load(&PolicySource::bytes("hostile", wasm).with_sha256(good.to_uppercase()))
        .unwrap();
    assert_eq!(loaded.sha256(), good);
}

#[test]
fn garbage_is_a_clear_load_error() {
    let err = engine()
        .load(&PolicySource::bytes(
            "garbage",
            b"\0asm\x01\0\0\0not really".to_vec(),
        ))
        .unwrap_err();
    assert!(matches!(err, LoadError::Compile { .. }), "{err}");
    assert!(
        err.to_string()
            .starts_with("policy garbage is not a valid component"),
        "{err}"
    );
    let err = PolicySource::file("/nonexistent/policy.wasm").unwrap_err();
    assert!(
        err.to_string().contains("/nonexistent/policy.wasm"),
        "{err}"
    );
}

#[test]
fn precompiled_cache_reloads_without_compiling() {
    let dir = tempfile::tempdir().unwrap();
    let cache_dir = dir.path().join("cache");
    let e = PolicyEngine::new(Limits::default(), Some(PrecompiledCache::new(&cache_dir))).unwrap();
    let first = e.load(&PolicySource::embedded_default()).unwrap();
    assert!(!first.from_cache());
    assert_eq!(
        std::fs::metadata(&cache_dir).unwrap().permissions().mode() & 0o777,
        0o700
    );
    let started = Instant::now();
    let second = e.load(&PolicySource::embedded_default()).unwrap();
    let reload = started.elapsed();
    assert!(second.from_cache());
    eprintln!("reload from cache took {reload:?}");
    let inv = crate::common::inventory(2);
    assert!(second.decide(&inv, &crate::common::request(&inv)).is_ok());

    // A cache directory others can write is not trusted.
    std::fs::set_permissions(&cache_dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    assert!(
        !e.load(&PolicySource::embedded_default())
            .unwrap()
            .from_cache()
    );
}

#[test]
fn a_corrupt_cache_entry_is_discarded_and_recompiled() {
    let dir = tempfile::tempdir().unwrap();
    let cache = PrecompiledCache::new(dir.path().join("c"));
    let e = PolicyEngine::new(Limits::default(), Some(cache.clone())).unwrap();
    e.load(&PolicySource::embedded_default()).unwrap();
    for entry in std::fs::read_dir(cache.dir()).unwrap() {
        std::fs::write(entry.unwrap().path(), b"corrupt").unwrap();
    }
    let again = e.load(&PolicySource::embedded_default()).unwrap();
    assert!(!again.from_cache());
}

fn installed(registry: &PolicyRegistry, cluster: &str) -> Arc<allot_policy::LoadedPolicy> {
    registry.get(cluster).unwrap().policy.clone()
}

fn hostile_mode(mode: &str) -> allot_core::policy::Request {
    let inv = crate::common::inventory(3);
    let mut req = crate::common::request(&inv);
    req.pod.annotations = BTreeMap::from([("hostile.allot.dev/mode".into(), mode.into())]);
    req
}

#[test]
fn registry_falls_back_to_the_default_only_when_asked_and_only_on_faults() {
    let e = engine();
    let default = Arc::new(e.load(&PolicySource::embedded_default()).unwrap());
    let hostile = Arc::new(
        e.load(&PolicySource::bytes(
            "hostile",
            crate::common::hostile_wasm(),
        ))
        .unwrap(),
    );
    let registry = PolicyRegistry::new(default);
    registry.install("strict", hostile.clone(), OnFailure::Fail);
    registry.install("lenient", hostile, OnFailure::FallBackToDefault);
    let inv = crate::common::inventory(3);

    let err = registry
        .decide("strict", &inv, &hostile_mode("panic"))
        .unwrap_err();
    assert_eq!(err.kind, PolicyErrorKind::Trap);

    let outcome = registry
        .decide("lenient", &inv, &hostile_mode("panic"))
        .unwrap();
    assert_eq!(outcome.decided_by, "default");
    assert_eq!(outcome.fallback_from.unwrap().kind, PolicyErrorKind::Trap);
    assert_eq!(outcome.decision.nics[0].families[0].order, vec![0, 1, 2]);

    // A verdict about the input is not a fault: no fallback.
    let err = registry
        .decide("lenient", &inv, &hostile_mode("error"))
        .unwrap_err();
    assert_eq!(err.kind, PolicyErrorKind::InvalidInput);

    // Faults are counted by kind and outcome (the agent's allot_policy_faults_total); the
    // verdict is not a fault.
    let trap = |fell_back| FaultKey {
        kind: "trap",
        fell_back,
    };
    assert_eq!(registry.faults(), vec![(trap(false), 1), (trap(true), 1)]);

    // The engine names the policy that decides for a cluster in its errors.
    let registry = Arc::new(registry);
    assert_eq!(Policy::name(&*installed(&registry, "strict")), "hostile");
    assert_eq!(Policy::name(&registry.for_cluster("other")), "default");
    assert_eq!(Policy::name(&registry.for_cluster("strict")), "hostile");

    // Unknown clusters use the default policy.
    assert_eq!(
        registry
            .decide("other", &inv, &crate::common::request(&inv))
            .unwrap()
            .decided_by,
        "default"
    );
}

#[test]
fn a_looping_custom_policy_under_load_never_starves_the_default() {
    // 4 slots: 1 reserved for the default, 3 for custom policies; twice as many callers of the
    // looping policy as it may have instances. (Few slots: each looping instance spins a core,
    // and the default's deadline is wall-clock time on the same two cores.)
    let e = PolicyEngine::new(
        Limits {
            deadline: Duration::from_millis(100),
            max_instances: 4,
            ..Limits::default()
        },
        None,
    )
    .unwrap();
    let default = Arc::new(e.load(&PolicySource::embedded_default()).unwrap());
    let hostile = Arc::new(
        e.load(&PolicySource::bytes(
            "hostile",
            crate::common::hostile_wasm(),
        ))
        .unwrap(),
    );
    let registry = Arc::new(PolicyRegistry::new(default));
    registry.install("loopy", hostile.clone(), OnFailure::FallBackToDefault);
    let inv = crate::common::inventory(3);
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));

    let callers: Vec<_> = (0..6)
        .map(|i| {
            let (registry, inv, stop) = (registry.clone(), inv.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut fell_back = 0;
                // Some callers also make sound calls, which keep warm instances of the custom
                // policy: those hold slots too.
                let modes = if i % 3 == 0 {
                    ["loop", "sound"]
                } else {
                    ["loop", "loop"]
                };
                let mut calls = 0;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let outcome = registry
                        .decide("loopy", &inv, &hostile_mode(modes[calls % 2]))
                        .unwrap_or_else(|e| panic!("a call of the looping policy failed: {e}"));
                    assert_eq!(outcome.decision.nics[0].families[0].order, vec![0, 1, 2]);
                    if outcome.decided_by == "default" {
                        fell_back += 1;
                        let fault = outcome.fallback_from.unwrap();
                        assert_eq!(fault.kind, PolicyErrorKind::Deadline, "{}", fault.message);
                    }
                    calls += 1;
                }
                fell_back
            })
        })
        .collect();

    // Meanwhile a cluster without a custom policy keeps deciding, correctly and without waiting
    // for the custom policy's instances.
    std::thread::sleep(Duration::from_millis(200));
    let started = Instant::now();
    let mut slowest = Duration::ZERO;
    let mut plain_calls = 0;
    while started.elapsed() < Duration::from_secs(1) {
        let call = Instant::now();
        let outcome = registry
            .decide("plain", &inv, &crate::common::request(&inv))
            .unwrap_or_else(|e| panic!("the default failed while the custom policy looped: {e}"));
        slowest = slowest.max(call.elapsed());
        assert_eq!(outcome.decided_by, "default");
        assert_eq!(outcome.decision.nics[0].families[0].order, vec![0, 1, 2]);
        plain_calls += 1;
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let fell_back: usize = callers.into_iter().map(|t| t.join().unwrap()).sum();
    assert!(fell_back > 0, "the looping policy never faulted");
    assert!(
        plain_calls > 10,
        "only {plain_calls} default decisions in 1 s"
    );
    // Far below a deadline's wait for a slot plus a deadline's run, which is what a default
    // sharing the custom policy's slots would take; generous for a loaded machine.
    assert!(
        slowest < Duration::from_millis(500),
        "a default decision took {slowest:?}"
    );
    // The custom policy kept within its share: 3 of the 4 slots.
    assert!(hostile.warm_instances() <= 3);
}

#[test]
fn hot_swap_lets_in_flight_calls_finish_on_the_old_policy() {
    // A deadline far above the busy call's length, so load on the machine cannot turn it into
    // a deadline error.
    let e = PolicyEngine::new(
        Limits {
            deadline: Duration::from_secs(10),
            ..Limits::default()
        },
        None,
    )
    .unwrap();
    let default = Arc::new(e.load(&PolicySource::embedded_default()).unwrap());
    let hostile = Arc::new(
        e.load(&PolicySource::bytes(
            "hostile",
            crate::common::hostile_wasm(),
        ))
        .unwrap(),
    );
    let registry = Arc::new(PolicyRegistry::new(default.clone()));
    registry.install("c1", hostile, OnFailure::Fail);
    let inv = crate::common::inventory(3);

    let started = Arc::new(std::sync::Barrier::new(2));
    let in_flight = {
        let (registry, inv, started) = (registry.clone(), inv.clone(), started.clone());
        std::thread::spawn(move || {
            started.wait();
            registry.decide("c1", &inv, &hostile_mode("busy-30ms"))
        })
    };
    started.wait();
    std::thread::sleep(Duration::from_millis(5));
    let old = registry.install("c1", default, OnFailure::Fail).unwrap();
    assert!(
        !in_flight.is_finished(),
        "the busy call must still be running when the swap happens"
    );
    assert_eq!(old.policy.name(), "hostile");
    let outcome = in_flight.join().unwrap().unwrap();
    assert_eq!(
        outcome.decided_by, "hostile",
        "the call that started on the old policy ends on it"
    );
    let after = registry
        .decide("c1", &inv, &crate::common::request(&inv))
        .unwrap();
    assert_eq!(after.decided_by, "default");
}

#[test]
fn concurrent_calls_each_get_an_instance() {
    let e = engine();
    let policy = Arc::new(e.load(&PolicySource::embedded_default()).unwrap());
    let inv = crate::common::inventory(50);
    let threads: Vec<_> = (0..8)
        .map(|_| {
            let (policy, inv) = (policy.clone(), inv.clone());
            std::thread::spawn(move || {
                for _ in 0..200 {
                    let d = policy.decide(&inv, &crate::common::request(&inv)).unwrap();
                    assert_eq!(d.nics[0].families[0].order.len(), 50);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert!((1..=8).contains(&policy.warm_instances()));
}

#[test]
fn free_counts_must_match_the_inventory() {
    let policy = engine().load(&PolicySource::embedded_default()).unwrap();
    let inv = crate::common::inventory(3);
    let mut req = crate::common::request(&inv);
    req.free_counts.pop();
    let err = policy.decide(&inv, &req).unwrap_err();
    assert_eq!(err.kind, PolicyErrorKind::Internal);
}
