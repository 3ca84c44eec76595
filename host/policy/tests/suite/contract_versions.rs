//! The host runs components of every released contract version: the default policy as built
//! against allot:policy@0.1.0 and @0.2.0 (committed fixtures) decides exactly as it did, 0.2.0
//! and later can fail one NIC while deciding the others, and the current default (0.3.0) names
//! the address a pod is given, while being sent its namespace and node only when they change.

use std::collections::BTreeMap;
use std::sync::Arc;

use allot_core::PolicyErrorKind;
use allot_core::policy::{DropReason, Inventory, Nic, Policy, PoolRef, Request};
use allot_policy::{Limits, LoadedPolicy, PolicyEngine, PolicySource};

fn fixture(engine: &PolicyEngine, version: &str) -> LoadedPolicy {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(format!(
        "../../tests/fixtures/default-policy-{version}/default_policy.wasm"
    ));
    engine.load(&PolicySource::file(path).unwrap()).unwrap()
}

/// The default policy as built against 0.1.0, and the current one.
fn policies() -> (LoadedPolicy, LoadedPolicy) {
    let engine = PolicyEngine::new(Limits::default(), None).unwrap();
    let old = fixture(&engine, "0.1.0");
    let current = engine.load(&PolicySource::embedded_default()).unwrap();
    (old, current)
}

/// The default policy as built against 0.2.0, and the current one.
fn policies_0_2() -> (LoadedPolicy, LoadedPolicy) {
    let engine = PolicyEngine::new(Limits::default(), None).unwrap();
    let old = fixture(&engine, "0.2.0");
    let current = engine.load(&PolicySource::embedded_default()).unwrap();
    (old, current)
}

fn inventory() -> Arc<Inventory> {
    let pools = vec![
        crate::common::pool("pool-a", "10.6.1.0/24", true),
        crate::common::pool("pool-b", "10.6.2.0/24", true),
        crate::common::pool("pool-c", "10.6.3.0/24", false),
    ];
    Arc::new(Inventory::build(1, &pools, &[], &[]))
}

fn two_nics(inv: &Inventory, annotations: &[(&str, &str)]) -> Request {
    let mut req = crate::common::request(inv);
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
    assert_eq!(current.contract_version(), "0.3.0");
    let (old, _) = policies_0_2();
    assert_eq!(old.contract_version(), "0.2.0");
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
fn a_missing_named_pool_fails_only_its_nic_since_0_2_0_and_is_a_trace_line_under_0_1_0() {
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

#[test]
fn a_0_2_0_component_decides_as_the_current_default_for_pods_given_no_address() {
    let (old, current) = policies_0_2();
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
        vec![(
            "ipam.spidernet.io/ippool",
            r#"{"ipv4":["pool-ghost","pool-c"]}"#,
        )],
    ] {
        let req = two_nics(&inv, &annotations);
        assert_eq!(
            old.decide(&inv, &req),
            current.decide(&inv, &req),
            "annotations {annotations:?}"
        );
    }
}

#[test]
fn the_0_3_0_default_names_the_given_address_and_older_components_never_do() {
    let (old, current) = policies_0_2();
    let inv = inventory();
    let req = two_nics(
        &inv,
        &[(
            "ipam.allot.dev/ips",
            r#"[{"interface":"net1","ipv4":"10.6.2.40"}]"#,
        )],
    );
    let decision = current.decide(&inv, &req).unwrap();
    assert_eq!(
        decision.nics[0].families[0].address, None,
        "eth0 is not given one"
    );
    let hint = decision.nics[1].families[0].address.as_ref().unwrap();
    assert_eq!(hint.address, "10.6.2.40");
    assert_eq!(hint.source, "pod annotation ipam.allot.dev/ips");

    // Calico's spelling, for a cluster migrating from Calico IPAM.
    let req = two_nics(
        &inv,
        &[("cni.projectcalico.org/ipAddrs", r#"["10.6.1.9"]"#)],
    );
    let decision = current.decide(&inv, &req).unwrap();
    let hint = decision.nics[0].families[0].address.as_ref().unwrap();
    assert_eq!(hint.address, "10.6.1.9");
    assert_eq!(hint.source, "pod annotation cni.projectcalico.org/ipAddrs");
    assert_eq!(
        decision.nics[1].families[0].address, None,
        "Calico's applies to eth0"
    );

    // A 0.2.0 component knows nothing of it: the host picks, as before.
    let decision = old.decide(&inv, &req).unwrap();
    assert!(
        decision
            .nics
            .iter()
            .all(|n| n.families[0].address.is_none())
    );

    // A malformed given address fails that NIC alone, naming the key.
    let req = two_nics(&inv, &[("ipam.allot.dev/ip", r#"{"ipv4":"10.6.1.x"}"#)]);
    let decision = current.decide(&inv, &req).unwrap();
    let error = decision.nics[0].error.as_ref().expect("eth0 fails");
    assert_eq!(error.kind, PolicyErrorKind::InvalidInput);
    assert!(
        error.message.contains("ipam.allot.dev/ip is malformed"),
        "{}",
        error.message
    );
    assert!(decision.nics[1].error.is_none());
}

/// 0.3.0 sends the namespace and node only when they differ from the instance's last call: an
/// instance must still decide for the namespace and node of each request, whatever came before,
/// across inventory generations too.
#[test]
fn namespaces_and_nodes_sent_only_on_change_still_decide_each_request() {
    let (_, current) = policies();
    let pinned = |name: &str, subnet: &str, ns: &[&str], nodes: &[&str]| {
        let mut p = crate::common::pool(name, subnet, true);
        p.spec.namespace_name = ns.iter().map(|s| s.to_string()).collect();
        p.spec.node_name = nodes.iter().map(|s| s.to_string()).collect();
        p
    };
    let pools = vec![
        pinned("a-team", "10.6.1.0/24", &["team-a"], &[]),
        pinned("b-team", "10.6.2.0/24", &["team-b"], &[]),
        pinned("n1-only", "10.6.3.0/24", &[], &["node-1"]),
    ];
    let order = |inv: &Arc<Inventory>, ns: &str, node: &str| -> Vec<String> {
        let mut req = crate::common::request(inv);
        req.pod.namespace = ns.into();
        req.namespace.name = ns.into();
        req.node.name = node.into();
        let d = current.decide(inv, &req).unwrap();
        d.nics[0].families[0]
            .order
            .iter()
            .map(|&i| inv.pools[i as usize].name.clone())
            .collect()
    };
    // (Sorted as the default sorts: a nodeName pool before a namespaceName one.)
    let inv = Arc::new(Inventory::build(1, &pools, &[], &[]));
    for _ in 0..3 {
        assert_eq!(order(&inv, "team-a", "node-1"), ["n1-only", "a-team"]);
        assert_eq!(order(&inv, "team-a", "node-1"), ["n1-only", "a-team"]);
        assert_eq!(order(&inv, "team-b", "node-1"), ["n1-only", "b-team"]);
        assert_eq!(order(&inv, "team-b", "node-2"), ["b-team"]);
        assert_eq!(order(&inv, "team-a", "node-2"), ["a-team"]);
    }
    // A new inventory generation: the instance is not sent the unchanged namespace and node
    // again, and still knows them.
    let inv2 = Arc::new(Inventory::build(2, &pools, &[], &[]));
    assert_eq!(order(&inv2, "team-a", "node-2"), ["a-team"]);
    assert_eq!(order(&inv2, "team-b", "node-1"), ["n1-only", "b-team"]);
}
