//! Declared addresses: which pod may take which, by example (kept apart from the rules).

use super::*;
use crate::spec::{ObjectMeta, ReservedIpSpec};

fn kept(owner: &For, family: IpFamily, ips: &[&str]) -> Kept {
    Kept {
        name: owner.reservation_name(family),
        owner: owner.clone(),
        ips: Some(AddrSet::parse_entries(family, ips).unwrap()),
        deleting: false,
    }
}

#[test]
fn a_declared_list_is_kept_while_its_statefulset_declares_it() {
    let db = For::statefulset("team-a", "db");
    let declared = BTreeMap::from([(
        db.clone(),
        [vec!["192.0.2.10-192.0.2.12".to_string()], vec![]],
    )]);
    // Nothing kept yet: one ReservedIP, for IPv4 only.
    let actions = plan(&declared, &[]);
    assert_eq!(actions.len(), 1);
    let Action::Apply(w) = &actions[0] else {
        panic!("{actions:?}")
    };
    assert_eq!(w.name, "statefulset.team-a.db.ipv4");
    assert_eq!(w.ips, vec!["192.0.2.10-192.0.2.12"]);
    // Kept as declared (however written): nothing to do (scaling the StatefulSet changes
    // nothing here).
    let now = [kept(
        &db,
        IpFamily::V4,
        &["192.0.2.10", "192.0.2.11-192.0.2.12"],
    )];
    assert!(plan(&declared, &now).is_empty());
    // The list changes: applied again.
    let grown = BTreeMap::from([(
        db.clone(),
        [vec!["192.0.2.10-192.0.2.14".to_string()], vec![]],
    )]);
    assert!(matches!(plan(&grown, &now)[..], [Action::Apply(_)]));
    // The StatefulSet is gone: its ReservedIP is deleted; an unrelated one never is.
    assert_eq!(
        plan(&BTreeMap::new(), &now),
        vec![Action::Delete {
            name: "statefulset.team-a.db.ipv4".into(),
            owner: db.clone()
        }]
    );
}

#[test]
fn only_the_statefulsets_own_pods_pass_its_reservation() {
    let db = For::statefulset("team-a", "db");
    let mut meta = ObjectMeta {
        name: db.reservation_name(IpFamily::V4),
        ..Default::default()
    };
    meta.labels = db.labels();
    let kept = Reserved::from_spec(
        meta,
        ReservedIpSpec {
            ip_version: Some(4),
            ips: vec!["192.0.2.10-192.0.2.12".into()],
        },
    )
    .unwrap();
    let other = Reserved::from_spec(
        ObjectMeta {
            name: "routers".into(),
            ..Default::default()
        },
        ReservedIpSpec {
            ip_version: Some(4),
            ips: vec!["192.0.2.12".into()],
        },
    )
    .unwrap();
    let a = |s: &str| s.parse().unwrap();
    let both = [kept.clone(), other];
    let db_pod = Some(("StatefulSet", "db"));
    assert!(reserved_for_pod(&both, a("192.0.2.10"), "team-a", db_pod));
    assert!(!reserved_for_pod(&both, a("192.0.2.10"), "team-b", db_pod));
    assert!(!reserved_for_pod(
        &both,
        a("192.0.2.10"),
        "team-a",
        Some(("StatefulSet", "web"))
    ));
    assert!(!reserved_for_pod(&both, a("192.0.2.10"), "team-a", None));
    // Also reserved by a ReservedIP of someone else's: nobody gets it.
    assert!(!reserved_for_pod(&both, a("192.0.2.12"), "team-a", db_pod));
    // Not reserved at all: not this rule's business.
    assert!(!reserved_for_pod(&both, a("192.0.2.50"), "team-a", db_pod));
}

#[test]
fn the_webhook_refuses_addresses_outside_the_pools_or_held_by_someone_else() {
    use crate::spec::IpPoolSpec;
    use crate::store::{Claim, PodRef};
    let pool = Pool::from_spec(
        ObjectMeta {
            name: "db-pool".into(),
            ..Default::default()
        },
        IpPoolSpec {
            subnet: "192.0.2.0/24".into(),
            ips: vec!["192.0.2.10-192.0.2.50".into()],
            exclude_ips: vec!["192.0.2.13".into()],
            gateway: Some("192.0.2.1".into()),
            ..Default::default()
        },
    )
    .unwrap();
    let db = For::statefulset("team-a", "db");
    let claim = |address: &str, pod: &str, owner: &str| Claim {
        address: address.parse().unwrap(),
        pool: "db-pool".into(),
        network: "net".into(),
        attachment: None,
        pod: PodRef {
            namespace: "team-a".into(),
            name: pod.into(),
            uid: String::new(),
            owner_kind: Some("StatefulSet".into()),
            owner_name: Some(owner.into()),
        },
        node: String::new(),
        updated_at: 0,
    };
    let claims = [
        claim("192.0.2.10", "db-0", "db"),
        claim("192.0.2.11", "web-0", "web"),
    ];
    let pools = [pool];
    let nothing_barred = BTreeMap::new();
    let against = Against {
        pools: &pools,
        reserved: &[],
        claims: &claims,
        allowed: None,
        barred: &nothing_barred,
    };
    let check = |list: &[&str]| {
        refusals(
            &db,
            &[(IpFamily::V4, list.iter().map(|s| s.to_string()).collect())],
            &against,
        )
    };
    // Its own pod's address is fine (a list re-applied while the StatefulSet runs).
    assert!(check(&["192.0.2.10", "192.0.2.20-192.0.2.22"]).is_empty());
    assert_eq!(
        check(&["192.0.2.11"]),
        ["192.0.2.11 is held by pod team-a/web-0"]
    );
    assert_eq!(check(&["198.51.100.7"]), ["198.51.100.7 is in no IPPool"]);
    assert!(check(&["192.0.2.13"])[0].contains("excluded by IPPool db-pool"));
    let named = ["other".to_string()];
    let only_other = Against {
        allowed: Some(&named),
        ..against
    };
    let r = refusals(
        &db,
        &[(IpFamily::V4, vec!["192.0.2.20".into()])],
        &only_other,
    );
    assert!(r[0].contains("does not allow"), "{r:?}");
    let r = refusals(
        &db,
        &[(IpFamily::V4, vec!["192.0.2.0-192.0.255.255".into()])],
        &only_other,
    );
    assert!(r[0].contains("at most 4096"), "{r:?}");
}

fn v4_pool(name: &str, ips: &str) -> Pool {
    Pool::from_spec(
        ObjectMeta {
            name: name.into(),
            ..Default::default()
        },
        crate::spec::IpPoolSpec {
            subnet: "192.0.2.0/24".into(),
            ips: vec![ips.into()],
            ..Default::default()
        },
    )
    .unwrap()
}

#[test]
fn the_webhook_refuses_addresses_in_pools_the_workloads_pods_may_not_use_once_per_pool() {
    let db = For::statefulset("team-a", "db");
    let pools = [
        v4_pool("team-a-v4", "192.0.2.10-192.0.2.19"),
        v4_pool("team-b-v4", "192.0.2.20-192.0.2.29"),
        v4_pool("web-only-v4", "192.0.2.30-192.0.2.39"),
    ];
    let barred = BTreeMap::from([
        (
            "team-b-v4".to_string(),
            Barred::NamespaceName(vec!["team-b".into()]),
        ),
        ("web-only-v4".to_string(), Barred::PodAffinity),
    ]);
    // The template names the foreign pool itself: its namespace still bars it.
    let named = ["team-a-v4".to_string(), "team-b-v4".to_string()];
    let against = Against {
        pools: &pools,
        reserved: &[],
        claims: &[],
        allowed: None,
        barred: &barred,
    };
    let check = |against: &Against, list: &[&str]| {
        refusals(
            &db,
            &[(IpFamily::V4, list.iter().map(|s| s.to_string()).collect())],
            against,
        )
    };
    assert!(check(&against, &["192.0.2.10-192.0.2.12"]).is_empty());
    let r = check(
        &against,
        &[
            "192.0.2.10",
            "192.0.2.20-192.0.2.22",
            "192.0.2.31",
            "198.51.100.1",
        ],
    );
    assert_eq!(r.len(), 3, "{r:?}");
    assert!(
        r[0].starts_with(
            "192.0.2.20-192.0.2.22 are in IPPool team-b-v4, which pods of StatefulSet \
             team-a/db may not use: its namespaceName [\"team-b\"] does not name namespace \
             team-a; declare addresses of a pool that serves team-a"
        ),
        "{r:?}"
    );
    assert!(
        r[1].starts_with(
            "192.0.2.31 is in IPPool web-only-v4, which pods of StatefulSet team-a/db may \
             not use: the labels of the pod template do not match its podAffinity"
        ),
        "{r:?}"
    );
    assert_eq!(r[2], "198.51.100.1 is in no IPPool");
    let r = check(
        &Against {
            allowed: Some(&named),
            ..against
        },
        &["192.0.2.25"],
    );
    assert!(r[0].contains("may not use"), "{r:?}");
}

#[test]
fn the_controller_reserves_nothing_in_a_pool_the_workloads_pods_may_not_use() {
    let db = For::statefulset("team-a", "db");
    let ours = AddrSet::parse_entries(IpFamily::V4, &["192.0.2.10-192.0.2.19"]).unwrap();
    let theirs = AddrSet::parse_entries(IpFamily::V4, &["192.0.2.20-192.0.2.29"]).unwrap();
    let broken = AddrSet::parse_entries(IpFamily::V4, &["192.0.2.30-192.0.2.39"]).unwrap();
    let judged = |theirs_tenancy: Tenancy| {
        vec![
            Judged {
                name: "team-a-v4",
                addresses: &ours,
                tenancy: Tenancy::Usable,
            },
            Judged {
                name: "team-b-v4",
                addresses: &theirs,
                tenancy: theirs_tenancy,
            },
            Judged {
                name: "broken",
                addresses: &broken,
                tenancy: Tenancy::Unknown("ips: `x` is not an address".into()),
            },
        ]
    };
    let declared = [
        vec![
            "192.0.2.12".to_string(),
            "192.0.2.10-192.0.2.11".to_string(),
            "192.0.2.20-192.0.2.21".to_string(),
        ],
        vec![],
    ];
    // Its pods may use both pools: reserved as written.
    let all = reservable(&db, &declared, &judged(Tenancy::Usable), &[]);
    assert_eq!(all.entries, declared);
    assert!(all.withheld.is_empty());
    // team-b-v4 serves only team-b: its addresses are left out, and said why.
    let barred = Tenancy::Barred(Barred::NamespaceName(vec!["team-b".into()]));
    let r = reservable(&db, &declared, &judged(barred.clone()), &[]);
    assert_eq!(
        r.entries,
        [vec!["192.0.2.10-192.0.2.12".to_string()], vec![]]
    );
    assert_eq!(r.withheld.len(), 1, "{r:?}");
    assert!(
        r.withheld[0].starts_with(
            "not reserved: 192.0.2.20-192.0.2.21 are in IPPool team-b-v4, which pods of \
             StatefulSet team-a/db may not use"
        ),
        "{r:?}"
    );
    // Reserved before the check existed: taken out all the same.
    let before = [kept(
        &db,
        IpFamily::V4,
        &["192.0.2.10-192.0.2.12", "192.0.2.20-192.0.2.21"],
    )];
    let r = reservable(&db, &declared, &judged(barred), &before);
    assert_eq!(r.entries[0], ["192.0.2.10-192.0.2.12"]);
    // Only its addresses in a barred pool: nothing of the family is reserved.
    let foreign_only = [vec!["192.0.2.20".to_string()], vec![]];
    let r = reservable(
        &db,
        &foreign_only,
        &judged(Tenancy::Barred(Barred::NamespaceAffinity)),
        &[],
    );
    assert!(r.entries[0].is_empty(), "{r:?}");
    assert!(r.withheld[0].contains("namespaceAffinity"), "{r:?}");
    // An invalid pool: whether its pods may use it cannot be told, so of its addresses only
    // what was reserved already stays reserved.
    let into_broken = [vec!["192.0.2.30-192.0.2.33".to_string()], vec![]];
    let r = reservable(&db, &into_broken, &judged(Tenancy::Usable), &[]);
    assert!(r.entries[0].is_empty(), "{r:?}");
    assert!(
        r.withheld[0].contains("IPPool broken, which is not valid"),
        "{r:?}"
    );
    let had = [kept(&db, IpFamily::V4, &["192.0.2.30-192.0.2.31"])];
    let r = reservable(&db, &into_broken, &judged(Tenancy::Usable), &had);
    assert_eq!(r.entries[0], ["192.0.2.30-192.0.2.31"]);
    assert!(
        r.withheld[0].starts_with("not reserved: 192.0.2.32-192.0.2.33 are"),
        "{r:?}"
    );
}
