//! The host runs components of every released contract version: the default policy as built
//! against allot:policy@0.1.0 (a committed fixture) decides exactly as it did, and the current
//! default (0.2.0) can fail one NIC while deciding the others.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;

use allot_core::PolicyErrorKind;
use allot_core::policy::{DropReason, Inventory, Nic, Policy, PoolRef, Request};
use allot_policy::{Limits, LoadedPolicy, PolicyEngine, PolicySource};

fn policies() -> (LoadedPolicy, LoadedPolicy) {
    let engine = PolicyEngine::new(Limits::default(), None).unwrap();
    let fixture = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/default-policy-0.1.0/default_policy.wasm");
    let old = engine.load(&PolicySource::file(fixture).unwrap()).unwrap();
    let current = engine.load(&PolicySource::embedded_default()).unwrap();
    (old, current)
}

fn inventory() -> Arc<Inventory> {
    let pools = vec![
        common::pool("pool-a", "10.6.1.0/24", true),
        common::pool("pool-b", "10.6.2.0/24", true),
        common::pool("pool-c", "10.6.3.0/24", false),
    ];
    Arc::new(Inventory::build(1, &pools, &[], &[]))
}

fn two_nics(inv: &Inventory, annotations: &[(&str, &str)]) -> Request {
    let mut req = common::request(inv);
    req.nics.push(Nic {
        interface: "net1".into(),
        multus_name: "kube-system/macvlan".into(),
    });
    req.pod.annotations = annotations
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect::<BTreeMap<_, _>>();
    req
}

#[test]
fn each_component_is_bound_by_the_contract_version_it_exports() {
    let (old, current) = policies();
    assert_eq!(old.contract_version(), "0.1.0");
    assert_eq!(current.contract_version(), "0.2.0");
}

#[test]
fn a_0_1_0_component_decides_as_the_current_default_where_the_behaviour_did_not_change() {
    let (old, current) = policies();
    let inv = inventory();
    for annotations in [
        vec![],
        vec![(
            "ipam.spidernet.io/ippool",
            r#"{"ipv4":["pool-c","pool-a"]}"#,
        )],
        vec![(
            "ipam.allot.dev/ippools",
            r#"[{"interface":"eth0","ipv4":["pool-b"]},{"interface":"net1","ipv4":["pool-c"],"cleangateway":true}]"#,
        )],
        vec![("ipam.allot.dev/ippool", "not json")],
    ] {
        let req = two_nics(&inv, &annotations);
        let (was, is) = (old.decide(&inv, &req), current.decide(&inv, &req));
        assert_eq!(was, is, "annotations {annotations:?}");
    }
    // The malformed annotation is still a verdict on the whole request, from both.
    let req = two_nics(&inv, &[("ipam.allot.dev/ippool", "not json")]);
    assert_eq!(
        old.decide(&inv, &req).unwrap_err().kind,
        PolicyErrorKind::InvalidInput
    );
}

#[test]
fn a_missing_named_pool_fails_only_its_nic_under_0_2_0_and_is_a_trace_line_under_0_1_0() {
    let (old, current) = policies();
    let inv = inventory();
    let req = two_nics(
        &inv,
        &[(
            "ipam.spidernet.io/ippool",
            r#"{"ipv4":["pool-ghost","pool-c"]}"#,
        )],
    );

    let decision = current.decide(&inv, &req).unwrap();
    let eth0 = &decision.nics[0];
    let error = eth0.error.as_ref().expect("eth0 fails");
    assert_eq!(error.kind, PolicyErrorKind::NotReady);
    assert!(
        error.message.contains("IPPool pool-ghost does not exist"),
        "{}",
        error.message
    );
    assert!(eth0.families.is_empty());
    let net1 = &decision.nics[1];
    assert!(net1.error.is_none());
    assert_eq!(net1.families[0].order, vec![0, 1], "cluster defaults");

    // The 0.1.0 component behaves as it always did: pool-c is chosen, the ghost is a trace line.
    let decision = old.decide(&inv, &req).unwrap();
    let eth0 = &decision.nics[0];
    assert!(eth0.error.is_none());
    assert_eq!(eth0.families[0].order, vec![2]);
    assert_eq!(
        eth0.families[0].dropped[0].pool,
        PoolRef::Missing("pool-ghost".into())
    );
    assert_eq!(eth0.families[0].dropped[0].reason, DropReason::NotFound);
}
