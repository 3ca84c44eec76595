//! The default policy's vocabulary of given addresses (contract 0.3.0), through the embedded
//! component: a pod's own address, a StatefulSet's list indexed by ordinal, and Calico's
//! `ipAddrs` for clusters migrating from Calico IPAM.

use std::sync::Arc;

use allot_core::PolicyErrorKind;
use allot_core::policy::{Decision, Inventory, Nic, Owner, Policy, Request};
use allot_policy::{Limits, LoadedPolicy, PolicyEngine, PolicySource};

fn policy() -> LoadedPolicy {
    let engine = PolicyEngine::new(Limits::default(), None).unwrap();
    engine.load(&PolicySource::embedded_default()).unwrap()
}

fn inventory() -> Arc<Inventory> {
    let pools = vec![
        crate::common::pool("v4", "192.0.2.0/24", true),
        crate::common::pool("v6", "2001:db8::/64", true),
    ];
    Arc::new(Inventory::build(1, &pools, &[], &[]))
}

fn request(inv: &Inventory, annotations: &[(&str, &str)]) -> Request {
    let mut req = crate::common::request(inv);
    req.nics.push(Nic {
        interface: "net1".into(),
        multus_name: "kube-system/macvlan".into(),
    });
    for (k, v) in annotations {
        req.pod.annotations.insert(k.to_string(), v.to_string());
    }
    req
}

/// (interface, family, address) of every hint of the decision.
fn hints(d: &Decision) -> Vec<(String, String, String)> {
    d.nics
        .iter()
        .flat_map(|n| {
            n.families.iter().filter_map(|f| {
                let a = f.address.as_ref()?;
                Some((n.interface.clone(), f.family.to_string(), a.address.clone()))
            })
        })
        .collect()
}

fn h(i: &str, f: &str, a: &str) -> (String, String, String) {
    (i.into(), f.into(), a.into())
}

#[test]
fn a_pod_names_its_address_per_nic_and_family() {
    let policy = policy();
    let inv = inventory();
    for (annotations, expect) in [
        (
            vec![("ipam.allot.dev/ip", r#"{"ipv4":"192.0.2.10"}"#)],
            vec![h("eth0", "ipv4", "192.0.2.10")],
        ),
        (
            vec![(
                "ipam.allot.dev/ip",
                r#"{"interface":"net1","ipv4":"192.0.2.11","ipv6":"2001:db8::11"}"#,
            )],
            vec![
                h("net1", "ipv4", "192.0.2.11"),
                h("net1", "ipv6", "2001:db8::11"),
            ],
        ),
        (
            vec![(
                "ipam.allot.dev/ips",
                r#"[{"interface":"eth0","ipv6":"2001:db8::a"},{"interface":"net1","ipv4":"192.0.2.12"}]"#,
            )],
            vec![
                h("eth0", "ipv6", "2001:db8::a"),
                h("net1", "ipv4", "192.0.2.12"),
            ],
        ),
        // Calico's spelling: one address per family, for the primary interface.
        (
            vec![(
                "cni.projectcalico.org/ipAddrs",
                r#"["192.0.2.13","2001:db8::13"]"#,
            )],
            vec![
                h("eth0", "ipv4", "192.0.2.13"),
                h("eth0", "ipv6", "2001:db8::13"),
            ],
        ),
        // allot's own annotation wins over Calico's.
        (
            vec![
                ("cni.projectcalico.org/ipAddrs", r#"["192.0.2.13"]"#),
                ("ipam.allot.dev/ip", r#"{"ipv4":"192.0.2.14"}"#),
            ],
            vec![h("eth0", "ipv4", "192.0.2.14")],
        ),
    ] {
        let mut req = request(&inv, &annotations);
        // Dual-stack cluster defaults: both families are decided for each NIC.
        req.cni_defaults.ipv4 = vec!["v4".into()];
        req.cni_defaults.ipv6 = vec!["v6".into()];
        let d = policy.decide(&inv, &req).unwrap();
        assert_eq!(hints(&d), expect, "{annotations:?}");
    }
}

#[test]
fn a_statefulset_pod_gets_the_entry_of_its_ordinal() {
    let policy = policy();
    let inv = inventory();
    let list = r#"{"ipv4":["192.0.2.20-192.0.2.21","192.0.2.30"]}"#;
    let pod = |name: &str, index: Option<&str>| {
        let mut req = request(&inv, &[("ipam.allot.dev/ordinal-ips", list)]);
        req.pod.name = name.into();
        req.pod.owner = Some(Owner {
            kind: "StatefulSet".into(),
            name: "db".into(),
        });
        if let Some(i) = index {
            req.pod
                .labels
                .insert("apps.kubernetes.io/pod-index".into(), i.into());
        }
        req
    };
    for (name, index, expect) in [
        ("db-0", None, "192.0.2.20"),
        ("db-1", None, "192.0.2.21"),
        ("db-2", Some("2"), "192.0.2.30"),
    ] {
        let d = policy.decide(&inv, &pod(name, index)).unwrap();
        assert_eq!(hints(&d), vec![h("eth0", "ipv4", expect)], "{name}");
        let source = &d.nics[0].families[0].address.as_ref().unwrap().source;
        assert!(source.contains("ordinal"), "{source}");
    }
    // An ordinal past the list: eth0 fails, saying how many the list holds.
    let d = policy.decide(&inv, &pod("db-3", None)).unwrap();
    let err = d.nics[0].error.as_ref().expect("db-3 has no address");
    assert_eq!(err.kind, PolicyErrorKind::InvalidInput);
    assert!(
        err.message
            .contains("lists 3 ipv4 addresses, none for ordinal 3"),
        "{}",
        err.message
    );
    // A pod that is no StatefulSet's has no ordinal.
    let mut orphan = request(&inv, &[("ipam.allot.dev/ordinal-ips", list)]);
    orphan.pod.name = "db-0".into();
    let d = policy.decide(&inv, &orphan).unwrap();
    let err = d.nics[0].error.as_ref().expect("no ordinal");
    assert!(err.message.contains("has none"), "{}", err.message);
}

#[test]
fn malformed_given_addresses_fail_their_nic_naming_the_key() {
    let policy = policy();
    let inv = inventory();
    for (key, value, expect) in [
        (
            "ipam.allot.dev/ip",
            r#"{"ipv4":"192.0.2.999"}"#,
            "is not an IP address",
        ),
        (
            "ipam.allot.dev/ip",
            r#"{"ipv4":"2001:db8::1"}"#,
            "is not an ipv4 address",
        ),
        ("ipam.allot.dev/ip", r#"{}"#, "neither ipv4 nor ipv6"),
        (
            "ipam.allot.dev/ips",
            r#"[{"ipv4":"192.0.2.1"}]"#,
            "names its interface",
        ),
        (
            "cni.projectcalico.org/ipAddrs",
            r#"["192.0.2.1","192.0.2.2"]"#,
            "give one per family",
        ),
    ] {
        let d = policy
            .decide(&inv, &request(&inv, &[(key, value)]))
            .unwrap();
        let err = d.nics[0]
            .error
            .as_ref()
            .unwrap_or_else(|| panic!("{key} {value}"));
        assert_eq!(err.kind, PolicyErrorKind::InvalidInput);
        assert!(
            err.message.contains(&format!("annotation {key}")),
            "{}",
            err.message
        );
        assert!(err.message.contains(expect), "{}", err.message);
    }
}
