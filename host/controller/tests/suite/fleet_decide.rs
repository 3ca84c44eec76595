//! The pure decisions: pool edits the webhook will refuse, and a fleet planned offline.

use std::collections::BTreeSet;

use allot_controller::fleet::{Change, FleetCluster, Refusal, check_pool_edit, plan};
use allot_k8s::{IPAMAllocation, IPAMPool};

fn pool(yaml: &str) -> IPAMPool {
    serde_yaml::from_str(yaml).unwrap()
}

const HELD: &str = "apiVersion: allot.dev/v1alpha1
kind: IPAMPool
metadata: {name: lb}
spec:
  datacenters:
    dc1: {type: range, poolCidr: 10.0.0.0/24, allocationRange: 4}
    dc2: {type: range, poolCidr: 10.1.0.0/24, allocationRange: 4}
status:
  allocations:
    cluster-a: {type: range, dc: dc1, addresses: [10.0.0.1-10.0.0.4]}
";

fn edited(from: &str, to: &str) -> IPAMPool {
    pool(&HELD.replace(from, to))
}

#[test]
fn edits_that_would_strand_a_cluster_are_refused_with_the_reason() {
    let old = pool(HELD);
    let refused = |new: &IPAMPool| check_pool_edit(Some(&old), Some(new), &[]);
    assert!(
        refused(&edited(
            "allocationRange: 4}\n    dc2",
            "allocationRange: 8}\n    dc2"
        ))
        .is_empty()
    );
    assert_eq!(
        refused(&edited("10.0.0.0/24", "10.0.8.0/24")),
        [
            "IPAMPool lb datacenter dc1: poolCidr is immutable (10.0.0.0/24 → 10.0.8.0/24): clusters hold addresses of 10.0.0.0/24; for other addresses create another IPAMPool"
        ]
    );
    let excluding = edited(
        "allocationRange: 4}\n    dc2",
        "allocationRange: 4, excludePrefixes: [10.0.0.0/30]}\n    dc2",
    );
    assert_eq!(
        refused(&excluding),
        [
            "IPAMPool lb datacenter dc1: cluster cluster-a holds 10.0.0.1-10.0.0.3, which the new exclusions cover: release or move that cluster first, or exclude other addresses"
        ]
    );
    let removed = edited(
        "    dc1: {type: range, poolCidr: 10.0.0.0/24, allocationRange: 4}\n",
        "",
    );
    assert_eq!(
        refused(&removed),
        [
            "IPAMPool lb datacenter dc1: clusters cluster-a still hold allocations from this datacenter's pool: delete those clusters (or their allocations) first"
        ]
    );
    // dc2 holds nothing: removing it is fine; an invalid new entry is refused.
    let removed = edited(
        "    dc2: {type: range, poolCidr: 10.1.0.0/24, allocationRange: 4}\n",
        "",
    );
    assert!(refused(&removed).is_empty());
    let zero = edited("allocationRange: 4}\nstatus", "allocationRange: 0}\nstatus");
    assert_eq!(
        refused(&zero),
        [
            "IPAMPool lb datacenter dc2: allocationRange must be at least 1: set how many addresses each cluster gets"
        ]
    );
    // Deleting the pool while clusters hold allocations.
    assert_eq!(check_pool_edit(Some(&old), None, &[]).len(), 1);
}

fn cluster(ns: &str, dc: &str) -> FleetCluster {
    FleetCluster {
        namespace: ns.into(),
        name: ns.into(),
        datacenter: dc.into(),
        pools: None,
    }
}

#[test]
fn a_plan_keeps_records_adopts_before_serving_and_releases_the_gone() {
    let p = pool(HELD);
    // An allocation from before allot, where the pool would otherwise hand out to cluster-aa.
    let migrated: IPAMAllocation = serde_yaml::from_str(
        "apiVersion: allot.dev/v1alpha1\nkind: IPAMAllocation\nmetadata: {name: lb, namespace: cluster-z}\nspec: {type: range, dc: dc1, addresses: [10.0.0.5-10.0.0.8]}\n",
    )
    .unwrap();
    let clusters = [
        cluster("cluster-a", "dc1"),
        cluster("cluster-aa", "dc1"),
        cluster("cluster-z", "dc1"),
    ];
    let planned = plan(
        std::slice::from_ref(&p),
        std::slice::from_ref(&migrated),
        &clusters,
    );
    let shown: Vec<(String, String, Change)> = planned
        .entries
        .iter()
        .map(|e| {
            let (a, c) = e.outcome.clone().unwrap();
            (e.namespace.clone(), a.to_string(), c)
        })
        .collect();
    let row = |ns: &str, a: &str, c| (ns.to_string(), a.to_string(), c);
    assert_eq!(
        shown,
        [
            row("cluster-a", "10.0.0.1-10.0.0.4", Change::Kept),
            row("cluster-aa", "10.0.0.9-10.0.0.12", Change::New),
            row("cluster-z", "10.0.0.5-10.0.0.8", Change::Kept),
        ]
    );
    assert!(planned.releases.is_empty());

    // Without cluster-a, its record is released and cluster-aa gets its addresses.
    let planned = plan(&[p], &[migrated], &clusters[1..]);
    assert_eq!(planned.releases.len(), 1);
    assert_eq!(planned.releases[0].namespace, "cluster-a");
    let aa = planned
        .entries
        .iter()
        .find(|e| e.namespace == "cluster-aa")
        .unwrap();
    assert_eq!(
        aa.outcome.as_ref().unwrap().0.to_string(),
        "10.0.0.1-10.0.0.4"
    );
}

#[test]
fn requests_name_their_pool_and_datacenter() {
    let p = pool(HELD);
    let mut request = cluster("cluster-r", "dc9");
    request.pools = Some(BTreeSet::from(["lb".to_string(), "nope".to_string()]));
    let planned = plan(&[p], &[], &[request]);
    let refusals: Vec<Refusal> = planned
        .entries
        .iter()
        .map(|e| e.outcome.clone().unwrap_err())
        .collect();
    assert_eq!(
        refusals,
        [
            Refusal::NoDatacenter {
                pool: "lb".into(),
                dc: "dc9".into()
            },
            Refusal::NoPool {
                pool: "nope".into()
            },
        ]
    );
    assert_eq!(
        refusals[0].to_string(),
        "IPAMPool lb has no entry for datacenter dc9: add spec.datacenters.dc9, or fix the cluster's datacenter"
    );
    // The record of cluster-a is released: nobody asks for it.
    assert_eq!(planned.releases.len(), 1);
}

/// The plan hands core the other clusters as one merged set (so a decision costs the same
/// for 10 or 10,000 clusters); it must decide exactly what core decides with every cluster
/// listed one by one, on a fragmented pool where clusters were released and ranges grow.
#[test]
fn a_plan_decides_what_core_decides_with_every_cluster_listed() {
    use allot_controller::fleet::{Current, decide};
    use allot_core::fleet::Allocation;
    use allot_k8s::IPAMAllocationSpec;

    let spec = |range: u64| {
        pool(&format!(
            "apiVersion: allot.dev/v1alpha1
kind: IPAMPool
metadata: {{name: lb}}
spec:
  datacenters:
    dc1:
      type: range
      poolCidr: 10.0.0.0/20
      allocationRange: {range}
      excludeRanges: [10.0.0.100-10.0.0.140, 10.0.3.3]
      excludePrefixes: [10.0.8.0/23]
"
        ))
    };
    let ns = |i: usize| format!("cluster-{i:04}");
    // 400 clusters of 7 addresses, then every third one gone: a pool full of holes.
    let first: Vec<FleetCluster> = (0..400).map(|i| cluster(&ns(i), "dc1")).collect();
    let planned = plan(&[spec(7)], &[], &first);
    assert_eq!(planned.refused(), 0);
    let mut p = spec(9);
    let status = p.status.get_or_insert_with(Default::default);
    for e in planned
        .entries
        .iter()
        .filter(|e| !e.namespace.ends_with(['0', '3', '6']))
    {
        let (a, _) = e.outcome.as_ref().unwrap();
        status
            .allocations
            .insert(e.namespace.clone(), IPAMAllocationSpec::recording(a, "dc1"));
    }
    // The survivors grow to 9 addresses and 150 new clusters arrive.
    let survivors: Vec<String> = status.allocations.keys().cloned().collect();
    let mut fleet: Vec<FleetCluster> = survivors.iter().map(|n| cluster(n, "dc1")).collect();
    fleet.extend((1000..1150).map(|i| cluster(&ns(i), "dc1")));
    let planned = plan(std::slice::from_ref(&p), &[], &fleet);

    // The reference: every decision against every other cluster, one by one.
    let entry = &p.spec.datacenters["dc1"];
    let mut existing: Vec<(String, Allocation)> = p
        .status
        .as_ref()
        .unwrap()
        .allocations
        .iter()
        .map(|(n, s)| (n.clone(), s.allocation().unwrap().unwrap()))
        .collect();
    let mut changes = std::collections::BTreeMap::new();
    for c in fleet.iter().map(|c| &c.namespace) {
        let current = existing
            .iter()
            .find(|(n, _)| n == c)
            .map(|(_, a)| a.clone());
        let now = match &current {
            Some(a) => Current::Recorded(a),
            None => Current::None,
        };
        let outcome = decide("lb", "dc1", entry, &existing, c, now);
        if let Ok((a, _)) = &outcome {
            existing.retain(|(n, _)| n != c);
            existing.push((c.clone(), a.clone()));
        }
        let e = planned.entries.iter().find(|e| e.namespace == *c).unwrap();
        assert_eq!(e.outcome, outcome, "{c}");
        if let Ok((_, change)) = outcome {
            *changes.entry(change.to_string()).or_insert(0) += 1;
        }
    }
    // The scenario exercised what it claims to: grown survivors and new clusters.
    assert_eq!(changes.get("grown"), Some(&survivors.len()), "{changes:?}");
    assert!(changes.get("new").is_some_and(|&n| n > 100), "{changes:?}");
}

#[test]
fn an_allocation_object_must_fit_its_pool_and_its_record() {
    use allot_controller::fleet::check_allocation_object;
    let p = pool(HELD);
    let object = |ns: &str, spec: &str| -> IPAMAllocation {
        serde_yaml::from_str(&format!(
            "apiVersion: allot.dev/v1alpha1\nkind: IPAMAllocation\nmetadata: {{name: lb, namespace: {ns}}}\nspec: {spec}\n"
        ))
        .unwrap()
    };
    // What the allocator wrote, a request, a fresh fitting allocation: allowed.
    let ok = [
        object(
            "cluster-a",
            "{type: range, dc: dc1, addresses: [10.0.0.1-10.0.0.4]}",
        ),
        object("cluster-b", "{dc: dc1}"),
        object(
            "cluster-b",
            "{type: range, dc: dc1, addresses: [10.0.0.5-10.0.0.8]}",
        ),
    ];
    for o in &ok {
        assert!(check_allocation_object(&p, o, &[]).is_empty(), "{o:?}");
    }
    let refused = |o: IPAMAllocation| check_allocation_object(&p, &o, &[]).join("; ");
    assert_eq!(
        refused(object(
            "cluster-b",
            "{type: range, dc: dc1, addresses: [10.0.0.3-10.0.0.6]}"
        )),
        "IPAMAllocation cluster-b/lb (10.0.0.3-10.0.0.6): 10.0.0.3-10.0.0.4 are also held by cluster cluster-a"
    );
    assert_eq!(
        refused(object(
            "cluster-a",
            "{type: range, dc: dc1, addresses: [10.0.0.1-10.0.0.9]}"
        )),
        "IPAMAllocation cluster-a/lb holds 10.0.0.1-10.0.0.9 from datacenter dc1, but IPAMPool lb records 10.0.0.1-10.0.0.4 from datacenter dc1 for this namespace: the allocator writes this object from the pool's record; delete it to have it written again"
    );
    assert!(
        refused(object(
            "cluster-b",
            "{type: prefix, dc: dc1, cidr: 10.0.0.0/28}"
        ))
        .contains("type prefix does not match the pool's type range")
    );
    assert_eq!(
        refused(object("cluster-b", "{dc: dc7}")),
        "IPAMPool lb has no entry for datacenter dc7: add spec.datacenters.dc7, or fix the cluster's datacenter"
    );
}

fn ipam_allocation(ns: &str, spec: &str) -> IPAMAllocation {
    serde_yaml::from_str(&format!(
        "apiVersion: allot.dev/v1alpha1\nkind: IPAMAllocation\nmetadata: {{name: lb, namespace: {ns}}}\nspec: {spec}\n"
    ))
    .unwrap()
}

fn shown(planned: &allot_controller::fleet::Plan) -> Vec<(String, String)> {
    planned
        .entries
        .iter()
        .map(|e| {
            let what = match &e.outcome {
                Ok((a, change)) => format!("{a} {change}"),
                Err(refusal) => format!("refused: {refusal}"),
            };
            (e.namespace.clone(), what)
        })
        .collect()
}

/// Kubermatic made both allocations (the pool has no record of either), or only the one of
/// cluster-b is missing from the record: raising allocationRange grows each cluster into
/// addresses nobody holds, never into its neighbour's.
#[test]
fn growing_a_range_never_takes_addresses_another_cluster_holds() {
    let grown = pool(
        "apiVersion: allot.dev/v1alpha1
kind: IPAMPool
metadata: {name: lb}
spec:
  datacenters:
    dc1: {type: range, poolCidr: 10.0.0.0/24, allocationRange: 6}
",
    );
    let a = ipam_allocation(
        "cluster-a",
        "{type: range, dc: dc1, addresses: [10.0.0.1-10.0.0.4]}",
    );
    let b = ipam_allocation(
        "cluster-b",
        "{type: range, dc: dc1, addresses: [10.0.0.5-10.0.0.8]}",
    );
    let clusters = [cluster("cluster-a", "dc1"), cluster("cluster-b", "dc1")];
    let row = |ns: &str, what: &str| (ns.to_string(), what.to_string());
    let expected = [
        row("cluster-a", "10.0.0.1-10.0.0.4,10.0.0.9-10.0.0.10 grown"),
        row("cluster-b", "10.0.0.5-10.0.0.8,10.0.0.11-10.0.0.12 grown"),
    ];
    let planned = plan(
        std::slice::from_ref(&grown),
        &[a.clone(), b.clone()],
        &clusters,
    );
    assert_eq!(shown(&planned), expected);
    assert!(planned.warnings.is_empty(), "{:?}", planned.warnings);

    // cluster-a recorded, cluster-b's IPAMAllocation created meanwhile by another tool.
    let mut recorded = grown.clone();
    recorded.status = Some(allot_k8s::IPAMPoolStatus {
        allocations: [("cluster-a".to_string(), a.spec.clone())].into(),
        ..Default::default()
    });
    let planned = plan(
        std::slice::from_ref(&recorded),
        std::slice::from_ref(&b),
        &clusters,
    );
    // cluster-b is adopted first (as the controller's sync does), so it grows first.
    assert_eq!(
        shown(&planned),
        [
            row("cluster-a", "10.0.0.1-10.0.0.4,10.0.0.11-10.0.0.12 grown"),
            row("cluster-b", "10.0.0.5-10.0.0.8,10.0.0.9-10.0.0.10 grown"),
        ]
    );

    // Growth that does not fit is refused for that cluster alone, which keeps its addresses.
    let tight = pool(
        "apiVersion: allot.dev/v1alpha1
kind: IPAMPool
metadata: {name: lb}
spec:
  datacenters:
    dc1: {type: range, poolCidr: 10.0.0.0/28, allocationRange: 8}
",
    );
    let planned = plan(&[tight], &[a, b], &clusters);
    assert_eq!(
        shown(&planned),
        [
            row("cluster-a", "10.0.0.1-10.0.0.4,10.0.0.9-10.0.0.12 grown"),
            row(
                "cluster-b",
                "refused: IPAMPool lb datacenter dc1: cluster cluster-b: poolCidr 10.0.0.0/28 has 2 free addresses, the cluster needs 4 more: widen the pool with another IPAMPool, or release clusters"
            ),
        ]
    );
}

/// Every IPAMAllocation holding addresses counts as taken, adopted or not: a new cluster is
/// never handed what one holds, even one that cannot be adopted, and of two that overlap
/// neither is adopted, each refused naming the other.
#[test]
fn a_plan_hands_nobody_what_an_unrecorded_allocation_holds() {
    let p = pool(HELD);
    let objects = [
        // Overlaps cluster-a's record: not adopted, yet its cluster still uses 10.0.0.5-6.
        ipam_allocation(
            "cluster-legacy",
            "{type: range, dc: dc1, addresses: [10.0.0.3-10.0.0.6]}",
        ),
        ipam_allocation(
            "cluster-x",
            "{type: range, dc: dc1, addresses: [10.0.0.20-10.0.0.23]}",
        ),
        ipam_allocation(
            "cluster-y",
            "{type: range, dc: dc1, addresses: [10.0.0.22-10.0.0.25]}",
        ),
    ];
    let clusters = [
        cluster("cluster-a", "dc1"),
        cluster("cluster-aa", "dc1"),
        cluster("cluster-legacy", "dc1"),
        cluster("cluster-x", "dc1"),
        cluster("cluster-y", "dc1"),
    ];
    let planned = plan(&[p], &objects, &clusters);
    let row = |ns: &str, what: &str| (ns.to_string(), what.to_string());
    let refused = |ns: &str, held: &str, shared: &str, other: &str| {
        row(
            ns,
            &format!(
                "refused: IPAMAllocation {ns}/lb holds {held}, which IPAMPool lb cannot keep: {shared} are also held by cluster {other}; delete the IPAMAllocation to get a new allocation, or fix the pool"
            ),
        )
    };
    assert_eq!(
        shown(&planned),
        [
            row("cluster-a", "10.0.0.1-10.0.0.4 kept"),
            row("cluster-aa", "10.0.0.7-10.0.0.10 new"),
            refused(
                "cluster-legacy",
                "10.0.0.3-10.0.0.6",
                "10.0.0.3-10.0.0.4",
                "cluster-a"
            ),
            refused(
                "cluster-x",
                "10.0.0.20-10.0.0.23",
                "10.0.0.22-10.0.0.23",
                "cluster-y"
            ),
            refused(
                "cluster-y",
                "10.0.0.22-10.0.0.25",
                "10.0.0.22-10.0.0.23",
                "cluster-x"
            ),
        ]
    );
}

/// The webhook's checks count every IPAMAllocation holding addresses, not only the records:
/// cluster-k's was made by Kubermatic and the pool has no record of it.
#[test]
fn the_webhook_checks_count_allocations_the_pool_has_no_record_of() {
    use allot_controller::fleet::check_allocation_object;
    let p = pool(HELD);
    let kubermatic = ipam_allocation(
        "cluster-k",
        "{type: range, dc: dc1, addresses: [10.0.0.5-10.0.0.8]}",
    );
    let objects = std::slice::from_ref(&kubermatic);
    let over = ipam_allocation(
        "cluster-b",
        "{type: range, dc: dc1, addresses: [10.0.0.7-10.0.0.10]}",
    );
    assert_eq!(
        check_allocation_object(&p, &over, objects),
        [
            "IPAMAllocation cluster-b/lb (10.0.0.7-10.0.0.10): 10.0.0.7-10.0.0.8 are also held by cluster cluster-k"
        ]
    );
    // Its own object is not judged against itself; a request holds nothing.
    assert!(check_allocation_object(&p, &kubermatic, objects).is_empty());
    let request = ipam_allocation("cluster-r", "{dc: dc1}");
    assert!(
        check_allocation_object(&p, &request, &[kubermatic.clone(), request.clone()]).is_empty()
    );
    // A recorded allocation is judged against the records only: it was there first, and the
    // allocator must be able to write its object.
    let intruder = ipam_allocation(
        "cluster-i",
        "{type: range, dc: dc1, addresses: [10.0.0.3-10.0.0.4]}",
    );
    let recorded = ipam_allocation(
        "cluster-a",
        "{type: range, dc: dc1, addresses: [10.0.0.1-10.0.0.4]}",
    );
    assert!(check_allocation_object(&p, &recorded, &[intruder]).is_empty());

    let excluding = edited(
        "allocationRange: 4}\n    dc2",
        "allocationRange: 4, excludeRanges: [10.0.0.6]}\n    dc2",
    );
    assert_eq!(
        check_pool_edit(Some(&p), Some(&excluding), objects),
        [
            "IPAMPool lb datacenter dc1: cluster cluster-k holds 10.0.0.6, which the new exclusions cover: release or move that cluster first, or exclude other addresses"
        ]
    );
    // An IPAMAllocation of another pool, or from another datacenter, is not this one's.
    let mut elsewhere = kubermatic.clone();
    elsewhere.spec.dc = "dc2".into();
    let mut other_pool = kubermatic.clone();
    other_pool.metadata.name = Some("nodes".into());
    assert!(check_pool_edit(Some(&p), Some(&excluding), &[elsewhere, other_pool]).is_empty());
    let mut emptied = p.clone();
    emptied.status = None;
    assert_eq!(
        check_pool_edit(Some(&emptied), None, objects),
        [
            "IPAMPool lb datacenter dc1: clusters cluster-k still hold allocations from this datacenter's pool: delete those clusters (or their allocations) first"
        ]
    );
}
