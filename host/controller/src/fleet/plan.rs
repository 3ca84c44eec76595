//! A whole fleet's allocations computed offline (`allotctl fleet plan`): the same decision per
//! cluster and pool as the controller makes against the API, in a deterministic order (pools by
//! name, datacenters by name, clusters by namespace), so a platform team can see what the
//! controller would hand out before installing it.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use allot_core::IpFamily;
use allot_core::addr::{addr_to_u128, u128_to_addr};
use allot_core::fleet::{Allocation, FleetPool, check_allocation};
use allot_k8s::{IPAMAllocation, IPAMPool};

use super::decide::{Change, Current, FleetCluster, Refusal, decide, in_datacenter, records};

/// What the plan says for one cluster and one pool.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub pool: String,
    pub namespace: String,
    pub cluster: String,
    pub dc: String,
    pub outcome: Result<(Allocation, Change), Refusal>,
}

/// An allocation the controller would release: its cluster is not among the clusters, or the
/// pool no longer serves the cluster's datacenter.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Release {
    pub pool: String,
    pub namespace: String,
    pub dc: String,
    pub allocation: Allocation,
    pub why: String,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// By pool name, then namespace.
    pub entries: Vec<Entry>,
    pub releases: Vec<Release>,
    /// Allocations already held that do not fit their pool (they are kept; the webhook would
    /// have refused them), and objects that could not be read.
    pub warnings: Vec<String>,
}

impl Plan {
    pub fn refused(&self) -> usize {
        self.entries.iter().filter(|e| e.outcome.is_err()).count()
    }
}

/// Plans every cluster against every pool. `existing` are IPAMAllocation objects to keep (each
/// named after its pool, in its cluster's namespace): one whose namespace the pool's status has
/// no record of is adopted when it fits, and counts as taken from the start either way, so no
/// cluster is grown or served into its addresses (its cluster may be using them).
pub fn plan(pools: &[IPAMPool], existing: &[IPAMAllocation], clusters: &[FleetCluster]) -> Plan {
    let mut out = Plan::default();
    let mut by_name: BTreeMap<String, &IPAMPool> = BTreeMap::new();
    for pool in pools {
        let name = pool.metadata.name.clone().unwrap_or_default();
        if by_name.insert(name.clone(), pool).is_some() {
            out.warnings.push(format!(
                "IPAMPool {name} is given twice: the later one is planned"
            ));
        }
    }
    let mut clusters: Vec<&FleetCluster> = clusters.iter().collect();
    clusters.sort();
    // Requests naming a pool that does not exist.
    for c in &clusters {
        for pool in c.pools.iter().flatten() {
            if !by_name.contains_key(pool) {
                out.entries.push(Entry {
                    pool: pool.clone(),
                    namespace: c.namespace.clone(),
                    cluster: c.name.clone(),
                    dc: c.datacenter.clone(),
                    outcome: Err(Refusal::NoPool { pool: pool.clone() }),
                });
            }
        }
    }
    for (name, pool) in by_name {
        plan_pool(&mut out, &name, pool, existing, &clusters);
    }
    out.entries
        .sort_by(|a, b| (&a.pool, &a.namespace).cmp(&(&b.pool, &b.namespace)));
    out
}

fn plan_pool(
    out: &mut Plan,
    name: &str,
    pool: &IPAMPool,
    existing: &[IPAMAllocation],
    clusters: &[&FleetCluster],
) {
    let recorded = pool
        .status
        .as_ref()
        .map(|s| s.allocations.clone())
        .unwrap_or_default();
    let mut held = match records(name, &recorded) {
        Ok(held) => held,
        Err(e) => {
            out.warnings.push(format!("{e}; the pool is not planned"));
            return;
        }
    };
    // IPAMAllocations the pool has no record of: adopted if they fit (checked per cluster).
    let mut adopted: BTreeMap<String, (String, Allocation)> = BTreeMap::new();
    for object in existing
        .iter()
        .filter(|o| o.metadata.name.as_deref() == Some(name))
    {
        let namespace = object.metadata.namespace.clone().unwrap_or_default();
        if held.contains_key(&namespace) {
            continue;
        }
        match object.spec.allocation() {
            Ok(Some(a)) => {
                adopted.insert(namespace, (object.spec.dc.clone(), a));
            }
            Ok(None) => {}
            Err(e) => out.warnings.push(format!(
                "IPAMAllocation {namespace}/{name}: {e}; it is ignored"
            )),
        }
    }
    // Releases: held by a namespace no cluster of the pool's datacenters is, or from a
    // datacenter the pool no longer serves.
    let asking: BTreeSet<(&str, &str)> = clusters
        .iter()
        .filter(|c| c.asks(name, pool.spec.datacenters.contains_key(&c.datacenter)))
        .map(|c| (c.namespace.as_str(), c.datacenter.as_str()))
        .collect();
    for (namespace, (dc, allocation)) in held.clone().into_iter().chain(adopted.clone()) {
        let why = if !pool.spec.datacenters.contains_key(&dc) {
            format!("the pool no longer serves datacenter {dc}")
        } else if !asking.contains(&(namespace.as_str(), dc.as_str())) {
            format!("no cluster in namespace {namespace} of datacenter {dc} asks for it")
        } else {
            continue;
        };
        held.remove(&namespace);
        adopted.remove(&namespace);
        out.releases.push(Release {
            pool: name.to_string(),
            namespace,
            dc,
            allocation,
            why,
        });
    }
    for (dc, entry) in &pool.spec.datacenters {
        let mut existing: BTreeMap<String, Allocation> =
            in_datacenter(&held, dc).into_iter().collect();
        let checked = FleetPool::try_from(entry).ok();
        if let Some(checked) = &checked {
            check_held(out, name, dc, checked, &existing);
        }
        // Every allocation holding addresses is taken before anyone is decided: an
        // IPAMAllocation not yet adopted (or never adoptable) is still in use by its cluster.
        existing.extend(
            adopted
                .iter()
                .filter(|(_, (d, _))| d == dc)
                .map(|(ns, (_, a))| (ns.clone(), a.clone())),
        );
        let mut taken = checked.as_ref().map(|p| Taken::new(p.family()));
        let mut overlapping = BTreeSet::new();
        if let Some(taken) = &mut taken {
            existing.values().for_each(|a| taken.add(a));
            overlapping = overlaps(taken.family, &existing)
                .into_iter()
                .flat_map(|(a, b)| [a.to_string(), b.to_string()])
                .collect();
        }
        // Clusters holding an allocation the pool has no record of come first, as `sync`
        // adopts them first.
        let mut asking: Vec<&&FleetCluster> = clusters
            .iter()
            .filter(|c| c.datacenter == *dc && c.asks(name, true))
            .collect();
        asking.sort_by_key(|c| !adopted.contains_key(&c.namespace));
        for cluster in asking {
            let ns = &cluster.namespace;
            let recorded = held.get(ns).map(|(_, a)| a.clone());
            let found = adopted.get(ns).map(|(_, a)| a.clone());
            let current = match (&recorded, &found) {
                (Some(a), _) => Current::Recorded(a),
                (None, Some(a)) => Current::Adopted(a),
                (None, None) => Current::None,
            };
            // The other clusters as one merged set: core needs to know what is taken, not by
            // whom, so the cost of a decision does not grow with the fleet. An allocation to
            // adopt is in that set itself and is taken out of it, unless it overlaps another
            // holder: then the clusters are listed one by one, to name the one it overlaps.
            let all = || {
                existing
                    .iter()
                    .map(|(n, a)| (n.clone(), a.clone()))
                    .collect()
            };
            let others: Vec<(String, Allocation)> = match (&taken, current) {
                (Some(t), Current::Adopted(a)) if !overlapping.contains(ns) => {
                    t.without(a).as_existing()
                }
                (Some(t), Current::Recorded(_) | Current::None) => t.as_existing(),
                _ => all(),
            };
            let outcome = decide(name, dc, entry, &others, ns, current);
            if let Ok((allocation, _)) = &outcome {
                if let Some(t) = &mut taken {
                    t.add(allocation);
                }
                existing.insert(ns.clone(), allocation.clone());
            }
            out.entries.push(Entry {
                pool: name.to_string(),
                namespace: ns.clone(),
                cluster: cluster.name.clone(),
                dc: dc.clone(),
                outcome,
            });
        }
    }
    // Requests from a datacenter the pool has no entry for.
    for cluster in clusters
        .iter()
        .filter(|c| c.pools.is_some() && c.asks(name, false))
        .filter(|c| !pool.spec.datacenters.contains_key(&c.datacenter))
    {
        out.entries.push(Entry {
            pool: name.to_string(),
            namespace: cluster.namespace.clone(),
            cluster: cluster.name.clone(),
            dc: cluster.datacenter.clone(),
            outcome: Err(Refusal::NoDatacenter {
                pool: name.to_string(),
                dc: cluster.datacenter.clone(),
            }),
        });
    }
}

/// Warns about held allocations that do not fit their pool (excluded, outside, wrong type) or
/// overlap each other.
fn check_held(
    out: &mut Plan,
    pool: &str,
    dc: &str,
    checked: &FleetPool,
    held: &BTreeMap<String, Allocation>,
) {
    for (ns, a) in held {
        for problem in check_allocation(checked, &[], ns, a) {
            out.warnings.push(format!(
                "IPAMPool {pool} datacenter {dc}: the allocation of {ns} ({a}): {problem}"
            ));
        }
    }
    for (other, ns) in overlaps(checked.family(), held) {
        out.warnings.push(format!(
            "IPAMPool {pool} datacenter {dc}: the allocations of {other} and {ns} overlap: release one of them"
        ));
    }
}

/// Pairs of `held` allocations that overlap, found with one sort rather than a comparison of
/// every pair: each allocation that overlaps another is named in at least one pair (an
/// allocation's own runs never overlap each other).
fn overlaps(family: IpFamily, held: &BTreeMap<String, Allocation>) -> Vec<(&str, &str)> {
    let mut runs: Vec<(u128, u128, &str)> = Vec::new();
    for (ns, a) in held {
        runs.extend(
            Taken::runs(family, a)
                .into_iter()
                .map(|(lo, hi)| (lo, hi, ns.as_str())),
        );
    }
    runs.sort_unstable();
    let mut pairs = Vec::new();
    let mut reach: Option<(u128, &str)> = None;
    for (lo, hi, ns) in runs {
        match reach {
            Some((end, other)) if lo <= end && other != ns => {
                pairs.push((other, ns));
                if hi > end {
                    reach = Some((hi, ns));
                }
            }
            Some((end, _)) if hi <= end => {}
            _ => reach = Some((hi, ns)),
        }
    }
    pairs
}

/// Every address held in one datacenter, as merged runs of the pool's family.
struct Taken {
    family: IpFamily,
    runs: BTreeMap<u128, u128>,
}

impl Taken {
    fn new(family: IpFamily) -> Taken {
        Taken {
            family,
            runs: BTreeMap::new(),
        }
    }

    /// An allocation's runs in `family`'s number space (runs of the other family are left out:
    /// such an allocation is refused on its own).
    fn runs(family: IpFamily, a: &Allocation) -> Vec<(u128, u128)> {
        let in_family = |x: &IpAddr| IpFamily::of(*x) == family;
        match a {
            Allocation::Range(runs) => runs
                .iter()
                .filter(|(f, l)| in_family(f) && in_family(l))
                .map(|&(f, l)| {
                    let (f, l) = (addr_to_u128(f), addr_to_u128(l));
                    (f.min(l), f.max(l))
                })
                .collect(),
            Allocation::Prefix(net) if in_family(&net.network()) => {
                vec![(addr_to_u128(net.network()), addr_to_u128(net.broadcast()))]
            }
            Allocation::Prefix(_) => Vec::new(),
        }
    }

    fn add(&mut self, a: &Allocation) {
        for (mut lo, mut hi) in Taken::runs(self.family, a) {
            if let Some((&start, &end)) = self.runs.range(..=lo).next_back()
                && end.saturating_add(1) >= lo
            {
                lo = start;
                hi = hi.max(end);
            }
            let touching: Vec<u128> = self
                .runs
                .range(lo..=hi.saturating_add(1))
                .map(|(&s, _)| s)
                .collect();
            for start in touching {
                if let Some(end) = self.runs.remove(&start) {
                    hi = hi.max(end);
                }
            }
            self.runs.insert(lo, hi);
        }
    }

    /// The set less `a`'s runs, each of which lies within one run of the set (`a` was added
    /// and overlaps nobody else's).
    fn without(&self, a: &Allocation) -> Taken {
        let mut left = Taken {
            family: self.family,
            runs: self.runs.clone(),
        };
        for (lo, hi) in Taken::runs(self.family, a) {
            let Some((&start, &end)) = left.runs.range(..=lo).next_back() else {
                continue;
            };
            if end < lo {
                continue;
            }
            left.runs.remove(&start);
            if start < lo {
                left.runs.insert(start, lo - 1);
            }
            if hi < end {
                left.runs.insert(hi + 1, end);
            }
        }
        left
    }

    /// The set as one allocation held by nobody a namespace can be called.
    fn as_existing(&self) -> Vec<(String, Allocation)> {
        if self.runs.is_empty() {
            return Vec::new();
        }
        let runs = self
            .runs
            .iter()
            .map(|(&lo, &hi)| (u128_to_addr(self.family, lo), u128_to_addr(self.family, hi)))
            .collect();
        vec![("\0taken".to_string(), Allocation::Range(runs))]
    }
}
