//! The audit's table, by example and by property (kept apart from the table it tests).

use std::net::IpAddr;

use proptest::prelude::*;

use super::*;
use crate::gc::{Keep, NotBefore};
use crate::store::{Attachment, PodRef};

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn claim(address: &str, pod: &str, uid: &str) -> Claim {
    Claim {
        address: ip(address),
        pool: "p".into(),
        network: "n".into(),
        attachment: Some(Attachment {
            container_id: format!("c-{pod}"),
            interface: "eth0".into(),
        }),
        pod: PodRef {
            namespace: "web".into(),
            name: pod.into(),
            uid: uid.into(),
            owner_kind: None,
            owner_name: None,
        },
        node: "node-1".into(),
        updated_at: 100,
    }
}

fn pod(name: &str, uid: &str, addresses: &[&str]) -> PodUse {
    PodUse {
        namespace: "web".into(),
        name: name.into(),
        uid: uid.into(),
        addresses: addresses
            .iter()
            .map(|a| PodAddress {
                address: ip(a),
                interface: Some("eth0".into()),
            })
            .collect(),
        virtual_machine: None,
    }
}

fn endpoint(name: &str, uid: &str, addresses: &[&str]) -> EndpointUse {
    EndpointUse {
        namespace: "web".into(),
        name: name.into(),
        uid: uid.into(),
        addresses: addresses.iter().map(|a| (ip(a), "eth0".into())).collect(),
    }
}

fn pools(status_allocated: u64) -> Vec<PoolCounts> {
    vec![PoolCounts {
        name: "p".into(),
        listed: AddrSet::parse_entries(IpFamily::V4, &["192.0.2.10-192.0.2.19"]).unwrap(),
        total: 10,
        status_allocated: Some(status_allocated),
        status_total: Some(10),
    }]
}

/// The GC table as a cluster where exactly `pods` live (by name and UID).
fn run(
    claims: &[Claim],
    pods: &[PodUse],
    endpoints: &[EndpointUse],
    pool: &[PoolCounts],
) -> Report {
    let verdict = |c: &Claim| {
        if pods
            .iter()
            .any(|p| p.name == c.pod.name && p.uid == c.pod.uid)
        {
            Verdict::Keep(Keep::InUse)
        } else {
            Verdict::Leak {
                reason: LeakReason::PodDeleted,
                not_before: NotBefore::AfterFirstSighting(0),
            }
        }
    };
    check(&Inputs {
        claims,
        pods,
        endpoints,
        pools: pool,
        verdict: &verdict,
    })
}

fn clean_cluster() -> (Vec<Claim>, Vec<PodUse>, Vec<EndpointUse>) {
    (
        vec![
            claim("192.0.2.10", "a", "ua"),
            claim("192.0.2.11", "b", "ub"),
        ],
        vec![
            pod("a", "ua", &["192.0.2.10"]),
            pod("b", "ub", &["192.0.2.11"]),
        ],
        vec![
            endpoint("a", "ua", &["192.0.2.10"]),
            endpoint("b", "ub", &["192.0.2.11"]),
        ],
    )
}

#[test]
fn a_clean_cluster_has_no_findings() {
    let (claims, pods, endpoints) = clean_cluster();
    let report = run(&claims, &pods, &endpoints, &pools(2));
    assert!(report.is_clean(), "{report:?}");
    assert_eq!(report.counts(), [0; 6]);
}

#[test]
fn each_kind_of_drift_is_found_with_the_objects_involved() {
    let (mut claims, mut pods, mut endpoints) = clean_cluster();
    // A leak: the pod is gone.
    claims.push(claim("192.0.2.12", "gone", "ug"));
    // A pod using an address nobody claims.
    pods.push(pod("c", "uc", &["192.0.2.13"]));
    // Pod d's Endpoint records a's address.
    pods.push(pod("d", "ud", &[]));
    endpoints.push(endpoint("d", "ud", &["192.0.2.10"]));
    // A stale Endpoint.
    endpoints.push(endpoint("e", "ue", &["192.0.2.14"]));
    // A pod holding a second claim it does not use.
    claims.push(claim("192.0.2.15", "b", "ub"));
    let report = run(&claims, &pods, &endpoints, &pools(2));
    let text: Vec<String> = report.findings.iter().map(|f| f.to_string()).collect();
    assert_eq!(report.counts(), [2, 1, 1, 1, 0, 1], "{text:#?}");
    assert_eq!(
        text,
        [
            "192.0.2.12 (IPPool p) is claimed for web/gone (uid ug) but leaked: pod-deleted: the pod no longer exists",
            "192.0.2.15 (IPPool p) is claimed for web/b (uid ub) but leaked: not-used-by-its-pod: the pod uses 192.0.2.11 on that interface instead",
            "192.0.2.13 (IPPool p) is used by pod web/c (uid uc) on eth0 but nobody claims it: it may be handed out again",
            "192.0.2.10 is held by more than one pod: claimed for web/a (uid ua) (IPPool p); recorded by Endpoint web/a (uid ua) (eth0); recorded by Endpoint web/d (uid ud) (eth0); used by pod web/a (uid ua) on eth0",
            "192.0.2.14 is recorded by Endpoint web/e (uid ue) (eth0) but neither claimed nor used",
            "IPPool p says 2 allocated of 10, the claims and its spec say 4 of 10",
        ]
    );
}

#[test]
fn a_claim_of_an_earlier_pod_of_the_name_in_use_by_the_new_one_is_two_holders_not_a_leak() {
    let claims = vec![claim("192.0.2.10", "a", "old")];
    let pods = vec![pod("a", "new", &["192.0.2.10"])];
    let report = run(&claims, &pods, &[], &pools(1));
    assert_eq!(report.counts(), [0, 0, 1, 0, 0, 0], "{report:?}");
    assert_eq!(
        report.leaked().count(),
        0,
        "releasing it would free an address in use"
    );
}

/// A live migration: the source and the target launcher pods of one virtual machine both
/// report its address, the claim names the target: one holder, no drift. A launcher pod of
/// another VM reporting it is a second holder.
#[test]
fn launcher_pods_of_one_virtual_machine_hold_its_address_as_one() {
    let launcher = |name: &str, vm: &str| PodUse {
        virtual_machine: Some(vm.into()),
        ..pod(name, &format!("u-{name}"), &["192.0.2.10"])
    };
    let mut target_claim = claim(
        "192.0.2.10",
        "virt-launcher-db-bbbbb",
        "u-virt-launcher-db-bbbbb",
    );
    target_claim.pod.owner_kind = Some("VirtualMachine".into());
    target_claim.pod.owner_name = Some("db".into());
    let source = launcher("virt-launcher-db-aaaaa", "db");
    let target = launcher("virt-launcher-db-bbbbb", "db");
    let endpoints = [
        endpoint(
            "virt-launcher-db-aaaaa",
            "u-virt-launcher-db-aaaaa",
            &["192.0.2.10"],
        ),
        endpoint(
            "virt-launcher-db-bbbbb",
            "u-virt-launcher-db-bbbbb",
            &["192.0.2.10"],
        ),
    ];
    let claims = [target_claim];
    let report = run(
        &claims,
        &[source.clone(), target.clone()],
        &endpoints,
        &pools(1),
    );
    assert!(report.is_clean(), "{report:?}");

    let other = launcher("virt-launcher-web-ccccc", "web");
    let report = run(&claims, &[source, target, other], &endpoints, &pools(1));
    assert_eq!(
        report.counts()[KINDS.iter().position(|k| *k == "claimed-twice").unwrap()],
        1,
        "{report:?}"
    );
}

#[test]
fn quarantined_claims_and_addresses_outside_allot_pools_are_not_findings() {
    let mut claims = vec![claim("192.0.2.10", "a", "ua")];
    let mut q = claim("192.0.2.16", "x", "");
    q.pod = PodRef::conflict("02:00:00:00:00:01");
    q.attachment = None;
    claims.push(q);
    let pods = vec![pod("a", "ua", &["192.0.2.10", "10.1.0.5"])];
    let report = run(
        &claims,
        &pods,
        &[endpoint("a", "ua", &["192.0.2.10"])],
        &pools(2),
    );
    assert!(report.is_clean(), "{report:?}");
}

#[test]
fn status_counts_not_written_yet_are_not_a_disagreement() {
    let (claims, pods, endpoints) = clean_cluster();
    let mut p = pools(2);
    p[0].status_allocated = None;
    p[0].status_total = None;
    assert!(run(&claims, &pods, &endpoints, &p).is_clean());
    p[0].status_total = Some(11);
    assert_eq!(
        run(&claims, &pods, &endpoints, &p).counts(),
        [0, 0, 0, 0, 0, 1]
    );
}

/// The clocks of a repair run at `now` on a report made at `first_seen`, with GC's default
/// grace (60 s) and no additional delay.
fn clocks(first_seen: u64, now: u64) -> Clocks {
    Clocks {
        grace: 60,
        additional_delay: 0,
        first_seen,
        now,
    }
}

/// What a repair at `clocks` releases of `reported` against `recheck`.
fn released(reported: &[Claim], recheck: &Report, clocks: &Clocks) -> Vec<Claim> {
    repair(reported, recheck, clocks).0
}

#[test]
fn release_needs_a_second_sighting_of_the_same_claim() {
    let leaked = claim("192.0.2.12", "gone", "ug");
    let (mut claims, pods, endpoints) = clean_cluster();
    claims.push(leaked.clone());
    let first = run(&claims, &pods, &endpoints, &pools(3));
    let reported: Vec<Claim> = first.leaked().cloned().collect();
    assert_eq!(reported, std::slice::from_ref(&leaked));

    let again = run(&claims, &pods, &endpoints, &pools(3));
    let later = clocks(1_000, 1_060);
    assert_eq!(
        released(&reported, &again, &later),
        std::slice::from_ref(&leaked)
    );

    // Taken back meanwhile (a new pod of that name attached it): kept.
    let mut retaken = leaked.clone();
    retaken.updated_at = 200;
    retaken.pod.uid = "ug2".into();
    let mut now = clean_cluster().0;
    now.push(retaken);
    let changed = run(&now, &pods, &endpoints, &pools(3));
    let (none, kept) = repair(&reported, &changed, &later);
    assert!(none.is_empty());
    assert_eq!(kept, [(leaked.clone(), Kept::NoLongerLeaked)]);

    // Released by GC and claimed by someone else: kept.
    let mut someone = claim("192.0.2.12", "f", "uf");
    someone.updated_at = 300;
    let mut now = clean_cluster().0;
    now.push(someone);
    let pods_f = [pods.clone(), vec![pod("f", "uf", &["192.0.2.12"])]].concat();
    let reused = run(&now, &pods_f, &endpoints, &pools(3));
    assert!(released(&reported, &reused, &later).is_empty());
}

/// GC's sighting interval: a repair run at once on a fresh report (a pod force-deleted a moment
/// ago, its sandbox perhaps still running on a node cut off) releases nothing until GC's grace
/// period has passed since the report.
#[test]
fn a_repair_waits_for_gcs_grace_period_after_the_report() {
    let leaked = claim("192.0.2.12", "gone", "ug");
    let report = run(std::slice::from_ref(&leaked), &[], &[], &pools(1));
    let reported = [leaked.clone()];
    let (none, kept) = repair(&reported, &report, &clocks(1_000, 1_005));
    assert!(none.is_empty());
    assert_eq!(
        kept,
        [(
            leaked.clone(),
            Kept::NotDue(Wait::Sightings { until: 1_060 })
        )]
    );
    assert_eq!(
        released(&reported, &report, &clocks(1_000, 1_060)),
        [leaked]
    );
}

/// GC's age of a claim: a claim younger than the grace period when the report was made (its ADD
/// may have been in flight) does not count as seen leaked then.
#[test]
fn a_repair_never_counts_a_sighting_of_a_young_claim() {
    let mut young = claim("192.0.2.12", "gone", "ug");
    young.updated_at = 990;
    let report = run(&[young.clone()], &[], &[], &pools(1));
    let (none, kept) = repair(&[young.clone()], &report, &clocks(1_000, 5_000));
    assert!(none.is_empty());
    assert_eq!(kept, [(young, Kept::NotDue(Wait::Young { until: 1_050 }))]);
}

/// GC's release time from the pod: a terminating pod's claim is due at its deletion time plus
/// its grace period and GC's additional delay (what the table's verdict says), not before,
/// however long after the report the repair runs.
#[test]
fn a_repair_waits_for_a_terminating_pods_release_time() {
    let terminating = claim("192.0.2.12", "t", "ut");
    let verdict = |_: &Claim| Verdict::Leak {
        reason: LeakReason::TerminatingOnNotReadyNode,
        not_before: NotBefore::At(2_000),
    };
    let report = check(&Inputs {
        claims: std::slice::from_ref(&terminating),
        pods: &[],
        endpoints: &[],
        pools: &pools(1),
        verdict: &verdict,
    });
    let reported = [terminating.clone()];
    let (none, kept) = repair(&reported, &report, &clocks(1_000, 1_999));
    assert!(none.is_empty());
    assert_eq!(
        kept,
        [(
            terminating.clone(),
            Kept::NotDue(Wait::NotBefore { until: 2_000 })
        )]
    );
    assert_eq!(
        released(&reported, &report, &clocks(1_000, 2_000)),
        [terminating]
    );
}

/// GC's additional grace delay after a first sighting: a gone pod's claim (and a claim its pod
/// does not use) waits for it after the report, beside the grace period.
#[test]
fn a_repair_waits_for_gcs_additional_delay() {
    let gone = claim("192.0.2.12", "gone", "ug");
    let verdict = |_: &Claim| Verdict::Leak {
        reason: LeakReason::PodDeleted,
        not_before: NotBefore::AfterFirstSighting(300),
    };
    let report = check(&Inputs {
        claims: std::slice::from_ref(&gone),
        pods: &[],
        endpoints: &[],
        pools: &pools(1),
        verdict: &verdict,
    });
    let reported = [gone.clone()];
    assert!(released(&reported, &report, &clocks(1_000, 1_299)).is_empty());
    assert_eq!(released(&reported, &report, &clocks(1_000, 1_300)), [gone]);

    // Not used by its pod (which uses .11 there): the table keeps it, the repair waits for the
    // delay as well.
    let (claims, pods, endpoints) = clean_cluster();
    let extra = claim("192.0.2.15", "b", "ub");
    let all = [claims, vec![extra.clone()]].concat();
    let report = run(&all, &pods, &endpoints, &pools(3));
    let with_delay = Clocks {
        additional_delay: 300,
        ..clocks(1_000, 1_299)
    };
    let (none, kept) = repair(std::slice::from_ref(&extra), &report, &with_delay);
    assert!(none.is_empty());
    assert_eq!(
        kept,
        [(
            extra.clone(),
            Kept::NotDue(Wait::NotBefore { until: 1_300 })
        )]
    );
}

/// A running pod whose network status (writable by anyone who may patch the pod) names another
/// address than its own claim, which its allot Endpoint records: not a leak, never released by
/// a repair, reported for a person to judge. Without the Endpoint's record it is a leak.
#[test]
fn a_pods_status_against_its_endpoint_is_a_disagreement_not_a_leak() {
    let mine = claim("192.0.2.10", "a", "ua");
    // The pod's network status was patched to say .11 (b's address) on eth0.
    let pods = [
        pod("a", "ua", &["192.0.2.11"]),
        pod("b", "ub", &["192.0.2.11"]),
    ];
    let claims = [mine.clone(), claim("192.0.2.11", "b", "ub")];
    let endpoints = [
        endpoint("a", "ua", &["192.0.2.10"]),
        endpoint("b", "ub", &["192.0.2.11"]),
    ];
    let report = run(&claims, &pods, &endpoints, &pools(2));
    assert_eq!(report.leaked().count(), 0, "{report:?}");
    assert!(report.findings.iter().any(|f| matches!(f,
        Finding::StatusDisagrees { claim, reported }
            if *claim == mine && *reported == ip("192.0.2.11"))));
    let text: Vec<String> = report.findings.iter().map(|f| f.to_string()).collect();
    assert!(
        text.iter().any(|t| t.contains("judge which is true")),
        "{text:#?}"
    );
    assert!(
        released(std::slice::from_ref(&mine), &report, &clocks(1_000, 90_000)).is_empty(),
        "a forged report of it releases nothing"
    );
    // Its Endpoint does not record .10: a claim the pod does not use, a leak.
    let endpoints = [
        endpoint("a", "ua", &[]),
        endpoint("b", "ub", &["192.0.2.11"]),
    ];
    let report = run(&claims, &pods, &endpoints, &pools(2));
    assert_eq!(report.leaked().collect::<Vec<_>>(), [&mine]);
}

proptest! {
    /// Whatever the pods use: an address a live pod uses is never reported leaked, and an
    /// address of an allot pool used by exactly one pod and claimed by nobody is reported
    /// unclaimed.
    #[test]
    fn an_address_in_use_is_never_a_leak(
        claimed in proptest::collection::vec((0u8..10, 0u8..3), 0..10),
        used in proptest::collection::vec((0u8..10, 0u8..3), 0..10),
    ) {
        let addr = |a: u8| format!("192.0.2.{}", 10 + a);
        let mut claims: Vec<Claim> = Vec::new();
        for (a, p) in &claimed {
            if !claims.iter().any(|c| c.address == ip(&addr(*a))) {
                claims.push(claim(&addr(*a), &format!("p{p}"), &format!("u{p}")));
            }
        }
        let pods: Vec<PodUse> = (0..3u8)
            .map(|p| {
                let mine: Vec<String> =
                    used.iter().filter(|(_, q)| *q == p).map(|(a, _)| addr(*a)).collect();
                let mine: Vec<&str> = mine.iter().map(String::as_str).collect();
                pod(&format!("p{p}"), &format!("u{p}"), &mine)
            })
            .collect();
        let mut uncounted = pools(0);
        uncounted[0].status_allocated = None;
        let report = run(&claims, &pods, &[], &uncounted);
        let in_use: BTreeSet<IpAddr> = used.iter().map(|(a, _)| ip(&addr(*a))).collect();
        for leaked in report.leaked() {
            prop_assert!(!in_use.contains(&leaked.address));
        }
        for a in &in_use {
            let users: BTreeSet<u8> = used.iter().filter(|(x, _)| ip(&addr(*x)) == *a).map(|(_, p)| *p).collect();
            let unclaimed = !claims.iter().any(|c| c.address == *a);
            let reported = report.findings.iter().any(|f| matches!(f, Finding::UnclaimedAddress { address, .. } if address == a));
            prop_assert_eq!(reported, unclaimed && users.len() == 1);
        }
    }
}
