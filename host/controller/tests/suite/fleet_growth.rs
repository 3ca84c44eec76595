//! Property tests: random IPv4 range pools with exclusions, clusters already holding addresses
//! anywhere in them (recorded in the pool's status, present only as IPAMAllocations, or both),
//! a random new `allocationRange` and a few new clusters, planned offline with `plan` and
//! decided one cluster at a time as the controller's allocator decides them.
//! Checked by plain pairwise comparison, apart from the allocator's run arithmetic: no two
//! clusters ever overlap, every allocation held is kept as it was (grown only by appending
//! runs), and a refusal is the pool being full, for that cluster alone.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};

use allot_controller::fleet::decide::{depends_on_others, holders, of_pool, records};
use allot_controller::fleet::{Change, Current, FleetCluster, Refusal, decide, plan};
use allot_core::fleet::{Allocation, FleetError, FleetPool};
use allot_k8s::{IPAMAllocation, IPAMAllocationSpec, IPAMPool, IPAMPoolStatus};
use proptest::prelude::*;

/// Where a holder's allocation is known.
#[derive(Clone, Copy, Debug)]
enum Known {
    /// In the pool's record only (its IPAMAllocation not written yet).
    Recorded,
    /// As an IPAMAllocation only (adopted, made by Kubermatic, created meanwhile).
    Object,
    Both,
}

#[derive(Clone, Debug)]
struct Case {
    base: u32,
    host_bits: u8,
    /// Runs (offset, length) excluded.
    exclusions: Vec<(u32, u32)>,
    /// Per holder, one or two runs (offset, length), and where it is known.
    holders: Vec<(Vec<(u32, u32)>, Known)>,
    new_clusters: usize,
    range: u64,
}

fn case() -> impl Strategy<Value = Case> {
    let known = prop_oneof![
        Just(Known::Recorded),
        Just(Known::Object),
        Just(Known::Both)
    ];
    (
        any::<u32>(),
        3..=8u8,
        prop::collection::vec((any::<u32>(), 0..6u32), 0..3),
        prop::collection::vec(
            (
                prop::collection::vec((any::<u32>(), 0..12u32), 1..=2),
                known,
            ),
            1..10,
        ),
        0..4usize,
        1..=40u64,
    )
        .prop_map(
            |(base, host_bits, exclusions, holders, new_clusters, range)| Case {
                base,
                host_bits,
                exclusions,
                holders,
                new_clusters,
                range,
            },
        )
}

type Run = (u32, u32);

fn overlaps(a: Run, b: Run) -> bool {
    a.0 <= b.1 && b.0 <= a.1
}

fn runs_of(a: &Allocation) -> Vec<Run> {
    let v4 = |ip: &IpAddr| match ip {
        IpAddr::V4(v4) => u32::from(*v4),
        IpAddr::V6(_) => panic!("an IPv6 address from an IPv4 pool"),
    };
    match a {
        Allocation::Range(runs) => runs.iter().map(|(f, l)| (v4(f), v4(l))).collect(),
        Allocation::Prefix(_) => panic!("a prefix from a range pool"),
    }
}

fn text(run: Run) -> String {
    format!("{}-{}", Ipv4Addr::from(run.0), Ipv4Addr::from(run.1))
}

/// The pool's addresses, its exclusions (the network and broadcast addresses among them) and
/// the holders placed where nothing else is: each holder's runs, its namespace and where it
/// is known.
struct Fleet {
    net: u32,
    bcast: u32,
    excluded: Vec<Run>,
    exclude_ranges: Vec<String>,
    holders: Vec<(String, Vec<Run>, Known)>,
}

fn lay_out(c: &Case) -> Fleet {
    let size = 1u32 << c.host_bits;
    let net = c.base & !(size - 1);
    let bcast = net + (size - 1);
    let run = |(offset, len): (u32, u32)| {
        let first = net + offset % size;
        (first, first.saturating_add(len).min(bcast))
    };
    let exclusions: Vec<Run> = c.exclusions.iter().map(|&x| run(x)).collect();
    let mut excluded = exclusions.clone();
    excluded.extend([(net, net), (bcast, bcast)]);
    let mut placed: Vec<Run> = excluded.clone();
    let mut holders = Vec::new();
    for (i, (runs, known)) in c.holders.iter().enumerate() {
        let mut mine: Vec<Run> = runs.iter().map(|&r| run(r)).collect();
        mine.sort();
        let clash = mine.iter().enumerate().any(|(j, &r)| {
            placed.iter().any(|&p| overlaps(p, r)) || mine[..j].iter().any(|&m| overlaps(m, r))
        });
        if clash {
            continue;
        }
        placed.extend(&mine);
        holders.push((format!("cluster-h{i}"), mine, *known));
    }
    Fleet {
        net,
        bcast,
        excluded,
        exclude_ranges: exclusions.into_iter().map(text).collect(),
        holders,
    }
}

fn spec_of(runs: &[Run]) -> IPAMAllocationSpec {
    let entries: Vec<String> = runs.iter().map(|&r| text(r)).collect();
    IPAMAllocationSpec::recording(&Allocation::parse_addresses(&entries).unwrap(), "dc1")
}

fn objects(f: &Fleet, c: &Case) -> (IPAMPool, Vec<IPAMAllocation>, Vec<FleetCluster>) {
    let mut pool: IPAMPool = serde_yaml::from_str(&format!(
        "apiVersion: allot.dev/v1alpha1
kind: IPAMPool
metadata: {{name: lb}}
spec:
  datacenters:
    dc1: {{type: range, poolCidr: {}/{}, allocationRange: {}, excludeRanges: {:?}}}
",
        Ipv4Addr::from(f.net),
        32 - c.host_bits,
        c.range,
        f.exclude_ranges
    ))
    .unwrap();
    let mut records = BTreeMap::new();
    let mut objects = Vec::new();
    for (ns, runs, known) in &f.holders {
        if matches!(known, Known::Recorded | Known::Both) {
            records.insert(ns.clone(), spec_of(runs));
        }
        if matches!(known, Known::Object | Known::Both) {
            let mut o = IPAMAllocation::new("lb", spec_of(runs));
            o.metadata.namespace = Some(ns.clone());
            objects.push(o);
        }
    }
    pool.status = Some(IPAMPoolStatus {
        allocations: records,
        ..IPAMPoolStatus::default()
    });
    let mut clusters: Vec<FleetCluster> = f
        .holders
        .iter()
        .map(|(ns, _, _)| ns.clone())
        .chain((0..c.new_clusters).map(|i| format!("cluster-n{i}")))
        .map(|ns| FleetCluster {
            name: ns.clone(),
            namespace: ns,
            datacenter: "dc1".into(),
            pools: None,
        })
        .collect();
    clusters.reverse();
    (pool, objects, clusters)
}

/// What one cluster ends up with: `Ok` its (new or kept) allocation, `Err` the refusal.
type Outcome = Result<(Allocation, Change), Refusal>;

/// The invariants, given each cluster's outcome.
fn check(f: &Fleet, c: &Case, outcomes: &BTreeMap<String, Outcome>) -> Result<(), TestCaseError> {
    let held: BTreeMap<&str, &Vec<Run>> = f
        .holders
        .iter()
        .map(|(ns, runs, _)| (ns.as_str(), runs))
        .collect();
    prop_assert_eq!(outcomes.len(), f.holders.len() + c.new_clusters);
    let mut everyone: Vec<(Run, &str)> = Vec::new();
    for (ns, outcome) in outcomes {
        let before = held.get(ns.as_str()).copied();
        let wanted = before.map_or(0, |r| r.iter().map(|&(a, b)| u64::from(b - a) + 1).sum());
        let now: Vec<Run> = match outcome {
            Ok((a, change)) => {
                let runs = runs_of(a);
                let len: u64 = runs.iter().map(|&(a, b)| u64::from(b - a) + 1).sum();
                prop_assert_eq!(len, wanted.max(c.range), "{} holds {}", ns, a);
                match before {
                    Some(before) => {
                        prop_assert!(
                            runs.starts_with(before),
                            "{} held {:?}, now {}",
                            ns,
                            before,
                            a
                        );
                        let expected = if wanted >= c.range {
                            Change::Kept
                        } else {
                            Change::Grown
                        };
                        prop_assert_eq!(*change, expected, "{}", ns);
                    }
                    None => prop_assert_eq!(*change, Change::New, "{}", ns),
                }
                runs
            }
            Err(refusal) => {
                let full = matches!(
                    refusal,
                    Refusal::Fleet { error, .. } if matches!(**error, FleetError::Exhausted { .. })
                );
                prop_assert!(full, "{} refused: {}", ns, refusal);
                prop_assert!(wanted < c.range, "{} refused while it holds enough", ns);
                // The cluster keeps what it holds.
                before.cloned().unwrap_or_default()
            }
        };
        for run in now {
            prop_assert!(
                f.net <= run.0 && run.1 <= f.bcast,
                "{} got {}",
                ns,
                text(run)
            );
            for &x in &f.excluded {
                prop_assert!(
                    !overlaps(run, x),
                    "{} got {}, excluded {}",
                    ns,
                    text(run),
                    text(x)
                );
            }
            everyone.push((run, ns));
        }
    }
    everyone.sort();
    for w in everyone.windows(2) {
        prop_assert!(
            !overlaps(w[0].0, w[1].0),
            "{} ({}) and {} ({}) overlap",
            w[0].1,
            text(w[0].0),
            w[1].1,
            text(w[1].0)
        );
    }
    Ok(())
}

/// The controller's allocator (`api::allocate` as `sync` runs it: clusters holding an
/// IPAMAllocation the pool has no record of first, then by namespace): each cluster decided
/// alone first, then against every allocation holding addresses when that could change the
/// answer, and recorded when granted.
fn allocate_one_by_one(
    pool: &IPAMPool,
    objects: &[IPAMAllocation],
    clusters: &[FleetCluster],
) -> BTreeMap<String, Outcome> {
    let entry = &pool.spec.datacenters["dc1"];
    let mut recorded = pool.status.clone().unwrap_or_default().allocations;
    let object_of = |ns: &str| {
        objects
            .iter()
            .find(|o| o.metadata.namespace.as_deref() == Some(ns))
            .and_then(|o| o.spec.allocation().ok().flatten())
    };
    let mut order: Vec<&FleetCluster> = clusters.iter().collect();
    order.sort();
    order.sort_by_key(|c| recorded.contains_key(&c.namespace) || object_of(&c.namespace).is_none());
    let mut out = BTreeMap::new();
    for c in order {
        let ns = c.namespace.as_str();
        let held = records("lb", &recorded).unwrap();
        let object = object_of(ns);
        let current = match (held.get(ns), &object) {
            (Some((_, a)), _) => Current::Recorded(a),
            (None, Some(a)) => Current::Adopted(a),
            (None, None) => Current::None,
        };
        let mut outcome = decide("lb", "dc1", entry, &[], ns, current);
        if depends_on_others(current, &outcome) {
            let existing = holders(&held, of_pool("lb", objects), "dc1");
            outcome = decide("lb", "dc1", entry, &existing, ns, current);
        }
        if let Ok((a, _)) = &outcome {
            recorded.insert(ns.to_string(), IPAMAllocationSpec::recording(a, "dc1"));
        }
        out.insert(ns.to_string(), outcome);
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn a_plan_grows_nobody_into_another_and_keeps_what_is_held(c in case()) {
        let f = lay_out(&c);
        let (pool, objects, clusters) = objects(&f, &c);
        // allocationRange larger than what the pool can hand out: refused as a setting.
        prop_assume!(FleetPool::try_from(&pool.spec.datacenters["dc1"]).is_ok());
        let planned = plan(&[pool], &objects, &clusters);
        prop_assert!(planned.warnings.is_empty(), "{:?}", planned.warnings);
        prop_assert!(planned.releases.is_empty(), "{:?}", planned.releases);
        let outcomes = planned
            .entries
            .into_iter()
            .map(|e| (e.namespace, e.outcome))
            .collect();
        check(&f, &c, &outcomes)?;
    }

    #[test]
    fn the_allocator_grows_nobody_into_another_and_keeps_what_is_held(c in case()) {
        let f = lay_out(&c);
        let (pool, objects, clusters) = objects(&f, &c);
        prop_assume!(FleetPool::try_from(&pool.spec.datacenters["dc1"]).is_ok());
        let outcomes = allocate_one_by_one(&pool, &objects, &clusters);
        check(&f, &c, &outcomes)?;
    }
}
