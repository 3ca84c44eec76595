//! The auto-pool planner, pass by pass: create, grow, shrink around claims, delete or keep,
//! refusals, and two workloads from one Subnet.

use std::collections::{BTreeMap, BTreeSet};

use allot_core::autopool::{
    Action, Inputs, IpNumber, MANAGED_BY, MANAGER, PoolView, RECLAIM_LABEL, SubnetWant, Wants,
    Workload, labels, plan, pool_name,
};
use allot_core::policy::Application;
use allot_core::spec::{IpPoolSpec, ObjectMeta, RouteSpec, SubnetSpec, auto_pool_labels};
use allot_core::{AddrSet, IpFamily, Pool, Subnet};

fn app(name: &str) -> Application {
    Application {
        kind: "Deployment".into(),
        namespace: "team-a".into(),
        name: name.into(),
    }
}

fn v4(entries: &[&str]) -> AddrSet {
    AddrSet::parse_entries(IpFamily::V4, entries).unwrap()
}

fn subnet_a() -> Subnet {
    Subnet::from_spec(
        ObjectMeta {
            name: "subnet-a".into(),
            ..Default::default()
        },
        SubnetSpec {
            subnet: "10.10.0.0/24".into(),
            ips: vec!["10.10.0.10-10.10.0.29".into()],
            exclude_ips: vec!["10.10.0.12".into()],
            gateway: Some("10.10.0.1".into()),
            routes: vec![RouteSpec {
                dst: "10.99.0.0/16".into(),
                gw: "10.10.0.1".into(),
            }],
            ..Default::default()
        },
    )
    .unwrap()
}

fn subnets() -> BTreeMap<String, Result<Subnet, String>> {
    BTreeMap::from([("subnet-a".to_string(), Ok(subnet_a()))])
}

fn workload(name: &str, replicas: u64) -> Workload {
    Workload {
        app: app(name),
        replicas,
        deleting: false,
        wants: Ok(Wants {
            subnets: vec![SubnetWant {
                subnet: "subnet-a".into(),
                family: IpFamily::V4,
                nics: 1,
            }],
            ip_number: IpNumber::default(),
            reclaim: true,
        }),
    }
}

/// The auto pool of `name` as the controller would have written it, holding `ips`.
fn auto_pool(name: &str, ips: &[&str], reclaim: bool) -> PoolView {
    let spec = IpPoolSpec {
        ip_version: Some(4),
        subnet: "10.10.0.0/24".into(),
        ips: ips.iter().map(|s| s.to_string()).collect(),
        gateway: Some("10.10.0.1".into()),
        routes: vec![RouteSpec {
            dst: "10.99.0.0/16".into(),
            gw: "10.10.0.1".into(),
        }],
        ..Default::default()
    };
    view(
        &pool_name(&app(name), "subnet-a", IpFamily::V4),
        labels(&app(name), "subnet-a", reclaim),
        spec,
    )
}

fn view(name: &str, labels: BTreeMap<String, String>, spec: IpPoolSpec) -> PoolView {
    let pool = Pool::from_spec(
        ObjectMeta {
            name: name.into(),
            labels: labels.clone(),
            ..Default::default()
        },
        spec.clone(),
    )
    .unwrap();
    PoolView {
        name: name.into(),
        resource_version: "7".into(),
        labels,
        terminating: false,
        addresses: Some(pool.ips),
        spec: Ok(spec),
    }
}

/// The kinds every pass here follows (the controller's built-in ones).
fn followed() -> BTreeSet<String> {
    [
        "Deployment",
        "StatefulSet",
        "ReplicaSet",
        "Job",
        "DaemonSet",
        "CronJob",
    ]
    .map(String::from)
    .into()
}

fn run(workloads: &[Workload], pools: &[PoolView], claimed: &AddrSet) -> Vec<Action> {
    run_following(workloads, pools, claimed, &followed())
}

fn run_following(
    workloads: &[Workload],
    pools: &[PoolView],
    claimed: &AddrSet,
    followed_kinds: &BTreeSet<String>,
) -> Vec<Action> {
    let subnets = subnets();
    let empty = AddrSet::empty(IpFamily::V4);
    let empty6 = AddrSet::empty(IpFamily::V6);
    let inputs = Inputs {
        workloads,
        subnets: &subnets,
        pools,
        reserved_v4: &empty,
        reserved_v6: &empty6,
        pending: &[],
        followed_kinds,
    };
    plan(&inputs, &mut |current| current.intersection(claimed))
}

fn none() -> AddrSet {
    AddrSet::empty(IpFamily::V4)
}

#[test]
fn a_new_workload_gets_replicas_plus_one_with_the_subnets_gateway_and_routes() {
    let actions = run(&[workload("web", 2)], &[], &none());
    let [
        Action::Create {
            name, labels, spec, ..
        },
    ] = actions.as_slice()
    else {
        panic!("{actions:?}")
    };
    assert_eq!(name, &pool_name(&app("web"), "subnet-a", IpFamily::V4));
    // 10.10.0.12 is excluded: the shortest run that fits is .13-.29, 17 long; .10-.11 is too
    // short.
    assert_eq!(spec.ips, ["10.10.0.13-10.10.0.15"]);
    assert_eq!(spec.gateway.as_deref(), Some("10.10.0.1"));
    assert_eq!(spec.routes.len(), 1);
    assert_eq!(spec.subnet, "10.10.0.0/24");
    assert_eq!(labels[auto_pool_labels::OWNER_SUBNET], "subnet-a");
    assert_eq!(labels[auto_pool_labels::APPLICATION_KIND], "Deployment");
    assert_eq!(labels[auto_pool_labels::APPLICATION_NAMESPACE], "team-a");
    assert_eq!(labels[auto_pool_labels::APPLICATION_NAME], "web");
    assert_eq!(labels[MANAGED_BY], MANAGER);
    assert_eq!(labels[RECLAIM_LABEL], "true");
}

#[test]
fn scaling_up_grows_the_pool_next_to_what_it_has() {
    let pools = [auto_pool("web", &["10.10.0.13-10.10.0.15"], true)];
    let actions = run(&[workload("web", 5)], &pools, &none());
    let [
        Action::Update {
            spec,
            resource_version,
            added,
            removed,
            ..
        },
    ] = actions.as_slice()
    else {
        panic!("{actions:?}")
    };
    assert_eq!(spec.ips, ["10.10.0.13-10.10.0.18"]);
    assert_eq!((*added, *removed), (3, 0));
    assert_eq!(resource_version, "7");
    // Nothing changes: no action.
    let pools = [auto_pool("web", &["10.10.0.13-10.10.0.18"], true)];
    assert_eq!(run(&[workload("web", 5)], &pools, &none()), []);
}

#[test]
fn scaling_down_returns_only_free_addresses() {
    let pools = [auto_pool("web", &["10.10.0.13-10.10.0.18"], true)];
    let claimed = v4(&["10.10.0.14", "10.10.0.16", "10.10.0.18"]);
    let actions = run(&[workload("web", 1)], &pools, &claimed);
    let [
        Action::Update {
            spec,
            removed,
            unreturned,
            ..
        },
    ] = actions.as_slice()
    else {
        panic!("{actions:?}")
    };
    // Wants 2, claims hold 3: every free address goes, one too many stays.
    assert_eq!(spec.ips, ["10.10.0.14", "10.10.0.16", "10.10.0.18"]);
    assert_eq!((*removed, *unreturned), (3, 1));
    // Once released, the next pass returns it.
    let pools = [auto_pool(
        "web",
        &["10.10.0.14", "10.10.0.16", "10.10.0.18"],
        true,
    )];
    let actions = run(&[workload("web", 1)], &pools, &v4(&["10.10.0.16"]));
    let [
        Action::Update {
            spec,
            unreturned: 0,
            ..
        },
    ] = actions.as_slice()
    else {
        panic!("{actions:?}")
    };
    assert_eq!(spec.ips, ["10.10.0.14", "10.10.0.16"]);
}

#[test]
fn a_pool_still_over_size_because_of_claims_waits_without_a_write() {
    let pools = [auto_pool(
        "web",
        &["10.10.0.14", "10.10.0.16", "10.10.0.18"],
        true,
    )];
    let claimed = v4(&["10.10.0.14", "10.10.0.16", "10.10.0.18"]);
    let actions = run(&[workload("web", 1)], &pools, &claimed);
    assert!(
        matches!(actions.as_slice(), [Action::Wait { .. }]),
        "{actions:?}"
    );
}

#[test]
fn a_pool_goes_with_its_workload_unless_reclaim_is_false() {
    let pools = [
        auto_pool("gone", &["10.10.0.13-10.10.0.15"], true),
        auto_pool("kept", &["10.10.0.16-10.10.0.18"], false),
    ];
    let actions = run(&[], &pools, &none());
    let [
        Action::Delete {
            name,
            resource_version,
            ..
        },
    ] = actions.as_slice()
    else {
        panic!("{actions:?}")
    };
    assert_eq!(name, &pools[0].name);
    assert_eq!(resource_version, "7");
    // A workload being deleted counts as gone.
    let mut deleting = workload("gone", 3);
    deleting.deleting = true;
    let actions = run(&[deleting], &pools, &none());
    assert!(
        matches!(actions.as_slice(), [Action::Delete { .. }]),
        "{actions:?}"
    );
}

/// The pool of a deleted workload whose last pods still hold addresses is not deleted yet (the
/// admission webhook would refuse it): the controller waits and asks again.
#[test]
fn a_gone_workloads_pool_waits_for_its_last_claims_before_it_is_deleted() {
    let pools = [auto_pool("gone", &["10.10.0.13-10.10.0.15"], true)];
    let actions = run(&[], &pools, &v4(&["10.10.0.14"]));
    assert!(
        matches!(actions.as_slice(), [Action::WaitForRelease { name, held: 1, .. }] if *name == pools[0].name),
        "{actions:?}"
    );
    let actions = run(&[], &pools, &none());
    assert!(
        matches!(actions.as_slice(), [Action::Delete { .. }]),
        "released, it goes: {actions:?}"
    );
}

/// An auto pool of a kind the controller does not follow (a CloneSet while Kruise's API is
/// not served, or not readable by the controller) is not taken for an orphan: its pods may be
/// running from it.
#[test]
fn a_pool_of_a_kind_not_followed_is_left_alone_until_the_kind_is() {
    let cloneset = Application {
        kind: "CloneSet".into(),
        namespace: "team-a".into(),
        name: "web".into(),
    };
    let mut pool = auto_pool("web", &["10.10.0.13-10.10.0.15"], true);
    pool.name = pool_name(&cloneset, "subnet-a", IpFamily::V4);
    pool.labels = labels(&cloneset, "subnet-a", true);
    let pools = [pool];
    assert_eq!(run(&[], &pools, &none()), []);
    let mut with_clonesets = followed();
    with_clonesets.insert("CloneSet".into());
    let actions = run_following(&[], &pools, &none(), &with_clonesets);
    assert!(
        matches!(actions.as_slice(), [Action::Delete { name, .. }] if *name == pools[0].name),
        "followed and gone, it goes: {actions:?}"
    );
}

#[test]
fn a_pool_goes_when_its_workload_no_longer_names_the_subnet() {
    let pools = [auto_pool("web", &["10.10.0.13-10.10.0.15"], true)];
    let mut w = workload("web", 2);
    w.wants.as_mut().unwrap().subnets.clear();
    let actions = run(std::slice::from_ref(&w), &pools, &none());
    assert!(
        matches!(actions.as_slice(), [Action::Delete { .. }]),
        "{actions:?}"
    );
    // With reclaim "false" on the workload now, it stays (the label said true).
    w.wants.as_mut().unwrap().reclaim = false;
    assert_eq!(run(&[w], &pools, &none()), []);
}

#[test]
fn an_unreadable_annotation_changes_nothing_and_is_refused() {
    let pools = [auto_pool("web", &["10.10.0.13-10.10.0.15"], true)];
    let mut w = workload("web", 9);
    w.wants = Err("annotation ipam.allot.dev/ippool-ip-number is malformed".into());
    let actions = run(&[w], &pools, &none());
    let [
        Action::Refuse {
            subnet: None,
            reason,
            ..
        },
    ] = actions.as_slice()
    else {
        panic!("{actions:?}")
    };
    assert!(reason.contains("malformed"), "{reason}");
}

#[test]
fn a_subnet_too_small_is_refused_and_nothing_is_created_or_grown() {
    let actions = run(&[workload("web", 30)], &[], &none());
    let [
        Action::Refuse {
            subnet: Some(s),
            reason,
            ..
        },
    ] = actions.as_slice()
    else {
        panic!("{actions:?}")
    };
    assert_eq!(s, "subnet-a");
    assert!(reason.contains("is not created"), "{reason}");
    assert!(
        reason.contains("19 free ipv4 addresses, 31 more are needed"),
        "{reason}"
    );
    let pools = [auto_pool("web", &["10.10.0.13-10.10.0.15"], true)];
    let actions = run(&[workload("web", 30)], &pools, &none());
    let [Action::Refuse { reason, .. }] = actions.as_slice() else {
        panic!("{actions:?}")
    };
    assert!(reason.contains("is not grown to 31 addresses"), "{reason}");
}

#[test]
fn two_workloads_from_one_subnet_never_overlap_and_avoid_other_pools() {
    let manual = view(
        "manual",
        BTreeMap::new(),
        IpPoolSpec {
            subnet: "10.10.0.0/24".into(),
            ips: vec!["10.10.0.13-10.10.0.20".into()],
            ..Default::default()
        },
    );
    let actions = run(
        &[workload("web", 4), workload("api", 5)],
        &[manual],
        &none(),
    );
    let sets: Vec<AddrSet> = actions
        .iter()
        .map(|a| match a {
            Action::Create { spec, .. } => {
                v4(&spec.ips.iter().map(String::as_str).collect::<Vec<_>>())
            }
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(sets.len(), 2);
    assert!(!sets[0].overlaps(&sets[1]));
    for set in &sets {
        assert!(!set.overlaps(&v4(&["10.10.0.13-10.10.0.20", "10.10.0.12"])));
    }
    assert_eq!(sets[0].len() + sets[1].len(), 11);
}

#[test]
fn pending_writes_are_never_carved_again() {
    let subnets = subnets();
    let empty = none();
    let empty6 = AddrSet::empty(IpFamily::V6);
    let pending = [v4(&["10.10.0.13-10.10.0.29"])];
    let inputs = Inputs {
        workloads: &[workload("web", 1)],
        subnets: &subnets,
        pools: &[],
        reserved_v4: &empty,
        reserved_v6: &empty6,
        pending: &pending,
        followed_kinds: &followed(),
    };
    let actions = plan(&inputs, &mut |_| none());
    let [Action::Create { spec, .. }] = actions.as_slice() else {
        panic!("{actions:?}")
    };
    assert_eq!(spec.ips, ["10.10.0.10-10.10.0.11"]);
}

#[test]
fn a_missing_subnet_or_a_foreign_pool_of_the_same_name_is_refused_and_kept() {
    let mut w = workload("web", 1);
    w.wants.as_mut().unwrap().subnets[0].subnet = "subnet-x".into();
    let actions = run(&[w], &[], &none());
    let [Action::Refuse { reason, .. }] = actions.as_slice() else {
        panic!("{actions:?}")
    };
    assert!(
        reason.contains("Subnet subnet-x does not exist"),
        "{reason}"
    );

    let name = pool_name(&app("web"), "subnet-a", IpFamily::V4);
    let foreign = view(
        &name,
        BTreeMap::new(),
        IpPoolSpec {
            subnet: "10.10.0.0/24".into(),
            ips: vec!["10.10.0.20".into()],
            ..Default::default()
        },
    );
    let actions = run(&[workload("web", 1)], &[foreign], &none());
    let [Action::Refuse { reason, .. }] = actions.as_slice() else {
        panic!("{actions:?}")
    };
    assert!(
        reason.contains("is not this workload's auto pool"),
        "{reason}"
    );
}

#[test]
fn a_terminating_pool_is_waited_for() {
    let mut pool = auto_pool("web", &["10.10.0.13-10.10.0.15"], true);
    pool.terminating = true;
    let actions = run(&[workload("web", 2)], std::slice::from_ref(&pool), &none());
    assert!(
        matches!(actions.as_slice(), [Action::Wait { .. }]),
        "{actions:?}"
    );
    // A terminating pool of a gone workload is not deleted twice.
    assert_eq!(run(&[], &[pool], &none()), []);
}

#[test]
fn the_subnets_gateway_follows_and_a_users_disable_stays() {
    let mut pool = auto_pool("web", &["10.10.0.13-10.10.0.15"], true);
    if let Ok(spec) = &mut pool.spec {
        spec.gateway = Some("10.10.0.2".into());
        spec.disable = true;
    }
    pool.labels.insert("team".into(), "blue".into());
    let actions = run(&[workload("web", 2)], &[pool], &none());
    let [
        Action::Update {
            spec,
            labels,
            added: 0,
            removed: 0,
            ..
        },
    ] = actions.as_slice()
    else {
        panic!("{actions:?}")
    };
    assert_eq!(spec.gateway.as_deref(), Some("10.10.0.1"));
    assert!(spec.disable);
    assert_eq!(labels["team"], "blue");
}

#[test]
fn a_family_mismatch_is_refused() {
    let mut w = workload("web", 1);
    w.wants.as_mut().unwrap().subnets[0].family = IpFamily::V6;
    let actions = run(&[w], &[], &none());
    let [Action::Refuse { reason, .. }] = actions.as_slice() else {
        panic!("{actions:?}")
    };
    assert!(
        reason.contains("holds ipv4 addresses but the annotation names it under ipv6"),
        "{reason}"
    );
}

#[test]
fn a_pool_whose_subnet_nests_with_the_subnets_is_refused_before_carving() {
    let wide = view(
        "wide",
        BTreeMap::new(),
        IpPoolSpec {
            subnet: "10.10.0.0/16".into(),
            ips: vec!["10.10.5.1".into()],
            ..Default::default()
        },
    );
    let actions = run(&[workload("web", 1)], &[wide], &none());
    let [Action::Refuse { reason, .. }] = actions.as_slice() else {
        panic!("{actions:?}")
    };
    assert!(
        reason.contains("IPPool wide has subnet 10.10.0.0/16"),
        "{reason}"
    );
}
