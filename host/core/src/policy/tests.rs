//! The policy seam's checks, by example: which decisions `Decision::validate` accepts and
//! refuses, and the inventory's order (kept apart from the types they test).

use super::*;
use crate::spec::ObjectMeta;

fn pool(name: &str, subnet: &str) -> Pool {
    Pool::from_spec(
        ObjectMeta {
            name: name.into(),
            ..Default::default()
        },
        IpPoolSpec {
            subnet: subnet.into(),
            ..Default::default()
        },
    )
    .unwrap()
}

fn inventory() -> Inventory {
    Inventory::build(
        1,
        &[
            pool("b", "10.0.1.0/24"),
            pool("a", "10.0.0.0/24"),
            pool("c6", "fd00::/64"),
            Pool {
                spec: IpPoolSpec {
                    disable: true,
                    ..pool("d-off", "10.0.3.0/24").spec
                },
                ..pool("d-off", "10.0.3.0/24")
            },
            Pool {
                meta: ObjectMeta {
                    name: "e-gone".into(),
                    deletion_timestamp: Some("2026-01-01T00:00:00Z".into()),
                    ..Default::default()
                },
                ..pool("e-gone", "10.0.4.0/24")
            },
        ],
        &[],
        &[],
    )
}

fn request() -> Request {
    Request {
        nics: vec![Nic {
            interface: "eth0".into(),
            multus_name: String::new(),
        }],
        ..Default::default()
    }
}

fn decision(candidates: Vec<u32>, order: Vec<u32>) -> Decision {
    Decision {
        nics: vec![NicDecision {
            interface: "eth0".into(),
            error: None,
            clean_gateway: false,
            routes: vec![],
            families: vec![FamilyDecision {
                family: IpFamily::V4,
                rule: AcquisitionRule::ClusterDefault,
                source: String::new(),
                candidates,
                order,
                dropped: vec![],
                address: None,
            }],
        }],
    }
}

#[test]
fn inventory_is_sorted_by_name() {
    let inv = inventory();
    let names: Vec<_> = inv.pools.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(names, ["a", "b", "c6", "d-off", "e-gone"]);
    assert_eq!(inv.pool_index("b"), Some(1));
    assert_eq!(inv.pool_index("zz"), None);
}

#[test]
fn validate_accepts_a_failed_nic_only_without_pools() {
    let mut d = decision(vec![], vec![]);
    d.nics[0].families.clear();
    d.nics[0].error = Some(PolicyError::new(
        PolicyErrorKind::NotReady,
        "IPPool ghost does not exist",
    ));
    d.validate(&inventory(), &request()).unwrap();
    let mut both = decision(vec![0], vec![0]);
    both.nics[0].error = d.nics[0].error.clone();
    let err = both.validate(&inventory(), &request()).unwrap_err();
    assert_eq!(err.kind, PolicyErrorKind::BadOutput);
    assert!(
        err.message.contains("failed interface eth0"),
        "{}",
        err.message
    );
}

#[test]
fn validate_accepts_a_sound_decision() {
    decision(vec![1, 0], vec![0, 1])
        .validate(&inventory(), &request())
        .unwrap();
}

#[test]
fn validate_rejects_bogus_decisions() {
    let inv = inventory();
    let req = request();
    for (d, expect) in [
        (decision(vec![0, 7], vec![0]), "index 7"),
        (decision(vec![0], vec![0, 0]), "twice"),
        (decision(vec![0], vec![1]), "not among its candidates"),
        (decision(vec![2], vec![2]), "ipv6 pool c6 for ipv4"),
        (Decision::default(), "0 NICs"),
        (decision(vec![3], vec![3]), "pool d-off which is disabled"),
        (
            decision(vec![4], vec![4]),
            "pool e-gone which is terminating",
        ),
    ] {
        let err = d.validate(&inv, &req).unwrap_err();
        assert_eq!(err.kind, PolicyErrorKind::BadOutput);
        assert!(
            err.message.contains(expect),
            "{} does not contain {expect}",
            err.message
        );
    }
}
