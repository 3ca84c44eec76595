//! A hostile policy must never hurt the host: every misbehaviour ends in a clear error within
//! the deadline (plus scheduling slack), and the next call on the same host succeeds.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use allot_core::policy::{Inventory, Policy, Request};
use allot_core::{PolicyError, PolicyErrorKind};
use allot_policy::{Limits, LoadedPolicy, PolicyEngine, PolicySource};

/// The deadline for the tests of runaway loops.
const DEADLINE: Duration = Duration::from_millis(50);
/// The deadline for the tests of other faults: long enough that, on a loaded machine, the limit
/// under test (memory cap, output checks) is what stops the policy, not the clock.
const LONG: Duration = Duration::from_secs(10);
/// Generous: this asserts that a call is stopped at all, not how fast (that is measured and
/// recorded in docs/benchmarks.md).
const SLACK: Duration = Duration::from_millis(500);

fn hostile() -> LoadedPolicy {
    hostile_with(DEADLINE)
}

fn hostile_with(deadline: Duration) -> LoadedPolicy {
    let limits = Limits {
        memory_bytes: 32 << 20,
        deadline,
        max_instances: 16,
    };
    let engine = PolicyEngine::new(limits, None).unwrap();
    engine
        .load(&PolicySource::bytes(
            "hostile",
            crate::common::hostile_wasm(),
        ))
        .unwrap()
}

fn with_mode(inv: &Inventory, mode: &str) -> Request {
    let mut req = crate::common::request(inv);
    req.pod.annotations = BTreeMap::from([("hostile.allot.dev/mode".into(), mode.into())]);
    req
}

fn expect_fault(
    policy: &LoadedPolicy,
    inv: &Arc<Inventory>,
    mode: &str,
    kind: PolicyErrorKind,
) -> PolicyError {
    let started = Instant::now();
    let err = policy.decide(inv, &with_mode(inv, mode)).unwrap_err();
    let elapsed = started.elapsed();
    assert_eq!(err.kind, kind, "mode {mode}: {}", err.message);
    let deadline = if kind == PolicyErrorKind::Deadline {
        DEADLINE
    } else {
        LONG
    };
    assert!(elapsed < deadline + SLACK, "mode {mode} took {elapsed:?}");
    // The same host serves the next call.
    let ok = policy.decide(inv, &crate::common::request(inv)).unwrap();
    assert_eq!(ok.nics[0].families[0].order, vec![0, 1, 2], "after {mode}");
    err
}

#[test]
fn infinite_loop_is_stopped_at_the_deadline() {
    let policy = hostile();
    let inv = crate::common::inventory(3);
    let err = expect_fault(&policy, &inv, "loop", PolicyErrorKind::Deadline);
    assert!(
        err.message.contains("ran past its deadline of 50 ms"),
        "{}",
        err.message
    );
}

#[test]
fn memory_bomb_hits_the_cap() {
    let policy = hostile_with(LONG);
    let inv = crate::common::inventory(3);
    let err = expect_fault(&policy, &inv, "memory-bomb", PolicyErrorKind::MemoryLimit);
    assert!(
        err.message.contains("above the cap of 33554432 bytes"),
        "{}",
        err.message
    );
}

#[test]
fn panic_is_reported_with_its_message() {
    let policy = hostile_with(LONG);
    let inv = crate::common::inventory(3);
    let err = expect_fault(&policy, &inv, "panic", PolicyErrorKind::Trap);
    assert!(err.message.contains("panicked"), "{}", err.message);
    assert!(
        err.message.contains("hostile policy panics on purpose"),
        "{}",
        err.message
    );
}

#[test]
fn out_of_range_indices_are_rejected() {
    let policy = hostile_with(LONG);
    let inv = crate::common::inventory(3);
    let err = expect_fault(&policy, &inv, "bad-index", PolicyErrorKind::BadOutput);
    assert!(
        err.message.contains("inventory holds 3 pools"),
        "{}",
        err.message
    );
}

#[test]
fn huge_outputs_are_rejected() {
    let policy = hostile_with(LONG);
    let inv = crate::common::inventory(3);
    let err = expect_fault(&policy, &inv, "huge-output", PolicyErrorKind::BadOutput);
    assert!(
        err.message.contains("20000 dropped pools"),
        "{}",
        err.message
    );
    let err = expect_fault(&policy, &inv, "huge-detail", PolicyErrorKind::BadOutput);
    assert!(
        err.message.contains("drop detail of 8388608 bytes"),
        "{}",
        err.message
    );
    let err = expect_fault(&policy, &inv, "wrong-nics", PolicyErrorKind::BadOutput);
    assert!(
        err.message
            .contains("decided for 0 NICs but the request has 1"),
        "{}",
        err.message
    );
}

#[test]
fn a_loop_while_loading_the_inventory_is_stopped_too() {
    let policy = hostile();
    let mut pools: Vec<_> = (0..2)
        .map(|i| crate::common::pool(&format!("p{i}"), &format!("10.0.{i}.0/24"), true))
        .collect();
    pools.push(crate::common::pool(
        "hostile-loop-on-load",
        "10.9.0.0/24",
        true,
    ));
    let bad = Arc::new(Inventory::build(7, &pools, &[], &[]));
    let started = Instant::now();
    let err = policy
        .decide(&bad, &crate::common::request(&bad))
        .unwrap_err();
    assert_eq!(err.kind, PolicyErrorKind::Deadline, "{}", err.message);
    assert!(started.elapsed() < DEADLINE + SLACK);
    let good = crate::common::inventory(3);
    assert!(policy.decide(&good, &crate::common::request(&good)).is_ok());
}

#[test]
fn a_policy_verdict_keeps_the_instance_warm() {
    let policy = hostile_with(LONG);
    let inv = crate::common::inventory(3);
    let err = policy.decide(&inv, &with_mode(&inv, "error")).unwrap_err();
    assert_eq!(err.kind, PolicyErrorKind::InvalidInput);
    assert_eq!(err.message, "hostile policy refuses this pod");
    assert_eq!(policy.warm_instances(), 1);
    // A trap discards the instance it happened in.
    policy.decide(&inv, &with_mode(&inv, "panic")).unwrap_err();
    assert_eq!(policy.warm_instances(), 0);
}
