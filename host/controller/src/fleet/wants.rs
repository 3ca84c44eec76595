//! What a pass must do, decided from the index alone (no I/O): which clusters ask which pool,
//! which allocations to release, and which clusters need `crate::fleet::allocate` because what
//! they hold is not yet recorded, written and projected as the pool's record says.
//!
//! **Who asks.** One namespace is one cluster (an IPAMAllocation is named after its pool in its
//! cluster's namespace):
//! - a namespace holding a Cluster API `Cluster` is that Cluster's. Labelled with its datacenter
//!   and not being deleted, it asks every pool that serves the datacenter. Without the label, or
//!   while it is being deleted, it keeps what it holds and gets nothing new. Two Clusters in one
//!   namespace: the one the namespace's IPAMAllocations are labelled for, else the oldest, is
//!   served; the others are told why not.
//! - in a namespace without a Cluster, each IPAMAllocation that is not labelled for a Cluster is
//!   a request for its pool from its `dc`, for as long as it exists. Requests of one namespace ask
//!   from the datacenter of the oldest one; a later request from another datacenter is refused
//!   in its status (or keeps what it already holds).
//! - an IPAMAllocation labelled for a Cluster ([`CLUSTER_NAME_LABEL`]) whose namespace holds no
//!   Cluster any more is released; when Cluster API is not served at all, such allocations are
//!   kept instead (nobody can tell whether their Clusters exist).
//!
//! **What is released**: a pool's record for a namespace nobody there asks the pool for any more
//! (the Cluster is gone, moved to a datacenter the pool does not serve, or the request was
//! deleted), and any IPAMAllocation nobody asks for.
//!
//! **What is allocated**: every asking cluster whose allocation is not in order, that is, not
//! recorded in the pool, not as large as the pool now asks, or not written (the IPAMAllocation,
//! its status, its label, the ConfigMap key) as recorded. A cluster refused exactly as its
//! IPAMAllocation's status already says is left alone, so a refusal is not repeated every pass.

use std::collections::{BTreeMap, BTreeSet};

use crate::fleet::decide::{holders, records};
use crate::fleet::{Current, FleetCluster, Refusal, decide};
use allot_core::fleet::{Allocation, FleetPool, allocate};
use allot_index::fleet::CLUSTER_NAME_LABEL;
use allot_index::{ClusterEntry, FleetAllocationEntry, FleetIndex, FleetPoolEntry};
use allot_k8s::{AllocationState, IPAMAllocationSpec};

/// A Cluster API `Cluster`, for Events and for the label of its IPAMAllocations.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct ClusterRef {
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

/// One `crate::fleet::allocate`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Allocate {
    pub pool: String,
    pub cluster: FleetCluster,
    /// The Cluster it is for: its IPAMAllocation must carry the Cluster's name in
    /// [`CLUSTER_NAME_LABEL`], and a refusal is an Event on it.
    pub owner: Option<ClusterRef>,
    /// No IPAMAllocation exists: create it labelled (as a request) before allocating, so that
    /// an allocation made for a Cluster is known as the Cluster's from its first moment.
    pub create_request: bool,
}

/// One `crate::fleet::release`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Release {
    pub pool: String,
    pub namespace: String,
    pub why: String,
    /// What the index said was missing, to be read again fresh right before releasing: a
    /// watch that lags must not cost a cluster its range.
    pub recheck: Recheck,
}

/// What a release reads again first; each is a reason not to release now.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Recheck {
    /// A Cluster API Cluster in the namespace.
    pub cluster: bool,
    /// An IPAMAllocation of the pool in the namespace that is a request (not labelled for a
    /// Cluster, not being deleted).
    pub request: bool,
    /// The IPAMPool itself.
    pub pool: bool,
}

impl Recheck {
    /// Nobody in `ns` asks: no Cluster there (when Cluster API is served) and no request.
    fn nobody(index: &FleetIndex, tenants: &Tenants<'_>, ns: &str) -> Recheck {
        let no_tenant = !tenants.contains_key(ns);
        Recheck {
            cluster: no_tenant && index.clusters().is_some(),
            request: no_tenant,
            pool: false,
        }
    }
}

/// A request that cannot be served, with the reason for its status.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RefuseRequest {
    pub namespace: String,
    pub pool: String,
    pub message: String,
}

/// Something to tell a Cluster's owner in an Event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Notice {
    pub cluster: ClusterRef,
    pub reason: &'static str,
    pub message: String,
}

/// A pass's work, in the order it is done.
#[derive(Clone, Debug, Default)]
pub struct Work {
    pub releases: Vec<Release>,
    pub refusals: Vec<RefuseRequest>,
    /// By pool; in each pool clusters adopting an IPAMAllocation the pool has no record of come
    /// first, so nobody new is handed its addresses.
    pub allocations: Vec<Allocate>,
    pub notices: Vec<Notice>,
    /// Every readable pool with the clusters asking it: what a full `crate::fleet::sync` takes.
    pub clusters: BTreeMap<String, Vec<FleetCluster>>,
    /// Pools that cannot be read (the object, or a record in its status), and why: nothing is
    /// allocated from or released into them until they are fixed.
    pub unreadable: Vec<(String, String)>,
}

impl Work {
    /// Nothing to write.
    pub fn is_empty(&self) -> bool {
        self.releases.is_empty() && self.refusals.is_empty() && self.allocations.is_empty()
    }
}

/// Namespace → the Cluster that is the namespace's cluster, and the other Clusters there.
pub type Tenants<'a> = BTreeMap<&'a str, (ClusterRef, &'a ClusterEntry, Vec<ClusterRef>)>;

fn reference(ns: &str, name: &str, c: &ClusterEntry) -> ClusterRef {
    ClusterRef {
        namespace: ns.to_string(),
        name: name.to_string(),
        uid: c.uid.clone(),
    }
}

/// Each namespace's Cluster (Cluster API served): of several, the one the namespace's
/// IPAMAllocations are labelled for, else the oldest, then by name. Clusters being deleted count
/// too: they keep what they hold until they are gone.
pub fn tenants(index: &FleetIndex) -> Tenants<'_> {
    let Some(clusters) = index.clusters() else {
        return Tenants::new();
    };
    let mut by_ns: BTreeMap<&str, Vec<(&str, &ClusterEntry)>> = BTreeMap::new();
    for ((ns, name), c) in clusters {
        by_ns.entry(ns).or_default().push((name, c));
    }
    let labelled: BTreeSet<(&str, &str)> = index
        .allocations()
        .iter()
        .filter_map(|((ns, _), a)| Some((ns.as_str(), a.as_ref().ok()?.cluster.as_deref()?)))
        .collect();
    by_ns
        .into_iter()
        .map(|(ns, mut cs)| {
            cs.sort_by_key(|(name, c)| (!labelled.contains(&(ns, *name)), c.created, *name));
            let (name, chosen) = cs[0];
            let others = cs[1..].iter().map(|(n, c)| reference(ns, n, c)).collect();
            (ns, (reference(ns, name, chosen), chosen, others))
        })
        .collect()
}

/// The clusters asking each pool: pool → namespace → (cluster, the Cluster it is for).
type Asking = BTreeMap<String, BTreeMap<String, (FleetCluster, Option<ClusterRef>)>>;

/// Everything a pass must do.
pub fn wants(index: &FleetIndex) -> Work {
    let mut work = Work::default();
    let tenants = tenants(index);
    let mut objects: BTreeMap<&str, Vec<(&str, &FleetAllocationEntry)>> = BTreeMap::new();
    for ((ns, pool), a) in index.allocations() {
        if let Ok(a) = a {
            objects.entry(ns).or_default().push((pool, a));
        }
    }
    let readable: BTreeMap<&str, &FleetPoolEntry> = index
        .pools()
        .iter()
        .filter_map(|(name, p)| Some((name.as_str(), p.as_ref().ok()?)))
        .collect();
    // What a namespace holds in a pool, and from which datacenter: the record, else an
    // IPAMAllocation holding addresses.
    let held = |ns: &str, pool: &str| -> Option<String> {
        if let Some(r) = readable.get(pool).and_then(|p| p.records.get(ns)) {
            return Some(r.dc.clone());
        }
        let (_, a) = objects.get(ns)?.iter().find(|(p, _)| *p == pool)?;
        matches!(a.spec.allocation(), Ok(Some(_))).then(|| a.spec.dc.clone())
    };
    let mut namespaces: BTreeSet<&str> = tenants.keys().copied().collect();
    namespaces.extend(objects.keys().copied());
    for p in readable.values() {
        namespaces.extend(p.records.keys().map(String::as_str));
    }
    let mut pool_names: BTreeSet<&str> = index.pools().keys().map(String::as_str).collect();
    pool_names.extend(index.allocations().keys().map(|(_, p)| p.as_str()));

    let mut asking = Asking::new();
    let mut ask = |pool: &str, cluster: FleetCluster, owner: Option<ClusterRef>| {
        asking
            .entry(pool.to_string())
            .or_default()
            .insert(cluster.namespace.clone(), (cluster, owner));
    };
    let no_objects = Vec::new();
    for ns in namespaces {
        let objs = objects.get(ns).unwrap_or(&no_objects);
        if let Some((chosen, entry, others)) = tenants.get(ns) {
            for other in others {
                work.notices.push(Notice {
                    cluster: other.clone(),
                    reason: "NamespaceShared",
                    message: format!(
                        "namespace {ns} is Cluster {}'s: allot gives one cluster per namespace its allocations (an IPAMAllocation is named after its pool in its cluster's namespace); move this Cluster to a namespace of its own",
                        chosen.name
                    ),
                });
            }
            match (&entry.datacenter, entry.deleting) {
                (Some(dc), false) => {
                    for (pool, p) in &readable {
                        if p.spec.datacenters.contains_key(dc) {
                            let cluster = FleetCluster {
                                namespace: ns.to_string(),
                                name: chosen.name.clone(),
                                datacenter: dc.clone(),
                                pools: None,
                            };
                            ask(pool, cluster, Some(chosen.clone()));
                        }
                    }
                }
                (dc, deleting) => {
                    if dc.is_none() && !deleting {
                        work.notices.push(Notice {
                            cluster: chosen.clone(),
                            reason: "NoDatacenterLabel",
                            message: format!(
                                "Cluster {ns}/{} has no label {}: it keeps the allocations it holds and gets no new one; label it with its datacenter",
                                chosen.name,
                                index.datacenter_label()
                            ),
                        });
                    }
                    for pool in &pool_names {
                        if let Some(dc) = held(ns, pool) {
                            ask(
                                pool,
                                holding(ns, &chosen.name, dc, pool),
                                Some(chosen.clone()),
                            );
                        }
                    }
                }
            }
            continue;
        }
        let mut requests: Vec<(&str, &FleetAllocationEntry)> = Vec::new();
        for &(pool, a) in objs {
            match &a.cluster {
                // Cluster API not served: whether its Cluster exists is unknown; keep.
                Some(name) if index.clusters().is_none() => {
                    if let Some(dc) = held(ns, pool) {
                        ask(pool, holding(ns, name, dc, pool), None);
                    }
                }
                // Its Cluster is gone: nobody asks (released below).
                Some(_) => {}
                None if a.deleting => {}
                None => requests.push((pool, a)),
            }
        }
        requests.sort_by_key(|(pool, a)| (a.created, *pool));
        let Some((first_pool, first)) = requests.first().copied() else {
            continue;
        };
        let dc = first.spec.dc.clone();
        let same: BTreeSet<String> = requests
            .iter()
            .filter(|(_, a)| a.spec.dc == dc)
            .map(|(p, _)| p.to_string())
            .collect();
        for (pool, a) in requests {
            if a.spec.dc == dc {
                let cluster = FleetCluster {
                    namespace: ns.to_string(),
                    name: ns.to_string(),
                    datacenter: dc.clone(),
                    pools: Some(same.clone()),
                };
                ask(pool, cluster, None);
            } else if let Some(held_dc) = held(ns, pool) {
                ask(pool, holding(ns, ns, held_dc, pool), None);
            } else {
                let message = format!(
                    "namespace {ns} is one cluster in datacenter {dc} (IPAMAllocation {ns}/{first_pool} asks from it first), and one namespace is one cluster in one datacenter: ask from {dc}, or move this request to a namespace of its own"
                );
                if !refused_as(a, &message) {
                    work.refusals.push(RefuseRequest {
                        namespace: ns.to_string(),
                        pool: pool.to_string(),
                        message,
                    });
                }
            }
        }
    }

    let no_asking = BTreeMap::new();
    for pool in pool_names {
        let asking = asking.get(pool).unwrap_or(&no_asking);
        let objects_of = |ns: &str| -> Option<&FleetAllocationEntry> {
            objects
                .get(ns)?
                .iter()
                .find(|(p, _)| *p == pool)
                .map(|(_, a)| *a)
        };
        let named: Vec<(&str, &FleetAllocationEntry)> = objects
            .iter()
            .filter_map(|(ns, objs)| {
                objs.iter()
                    .find(|(p, _)| *p == pool)
                    .map(|(_, a)| (*ns, *a))
            })
            .collect();
        let p = match index.pools().get(pool) {
            Some(Err(why)) => {
                work.unreadable.push((pool.to_string(), why.to_string()));
                continue;
            }
            Some(Ok(p)) => p,
            None => {
                // No such pool: a Cluster's allocation from it goes; a request is told.
                for (ns, a) in named {
                    match asking.get(ns) {
                        Some((cluster, owner)) => {
                            let expected = Refusal::NoPool {
                                pool: pool.to_string(),
                            };
                            if !refused_as(a, &expected.to_string()) {
                                work.allocations.push(Allocate {
                                    pool: pool.to_string(),
                                    cluster: cluster.clone(),
                                    owner: owner.clone(),
                                    create_request: false,
                                });
                            }
                        }
                        None => work.releases.push(Release {
                            pool: pool.to_string(),
                            namespace: ns.to_string(),
                            why: format!("there is no IPAMPool {pool}"),
                            recheck: Recheck {
                                pool: true,
                                ..Recheck::nobody(index, &tenants, ns)
                            },
                        }),
                    }
                }
                continue;
            }
        };
        let recorded = match records(pool, &p.records) {
            Ok(r) => r,
            Err(refusal) => {
                work.unreadable
                    .push((pool.to_string(), refusal.to_string()));
                continue;
            }
        };
        for (ns, (dc, _)) in &recorded {
            if !asking.contains_key(ns) {
                work.releases.push(Release {
                    pool: pool.to_string(),
                    namespace: ns.clone(),
                    why: gone(index, &tenants, ns, dc),
                    recheck: Recheck::nobody(index, &tenants, ns),
                });
            }
        }
        for (ns, a) in &named {
            if !asking.contains_key(*ns) && !recorded.contains_key(*ns) {
                work.releases.push(Release {
                    pool: pool.to_string(),
                    namespace: ns.to_string(),
                    why: gone(index, &tenants, ns, &a.spec.dc),
                    recheck: Recheck::nobody(index, &tenants, ns),
                });
            }
        }
        // Each datacenter's pool checked once per pass, not once per cluster.
        let checked: BTreeMap<&str, Option<FleetPool>> = p
            .spec
            .datacenters
            .iter()
            .map(|(dc, e)| (dc.as_str(), FleetPool::try_from(e).ok()))
            .collect();
        let mut adopting = Vec::new();
        let mut rest = Vec::new();
        for (ns, (cluster, owner)) in asking {
            let object = objects_of(ns);
            let config_map = index.config_map(ns).and_then(|d| d.get(pool));
            let state = State {
                pool,
                entry: p,
                records: &recorded,
                objects: &named,
                checked: &checked,
                object,
                config_map,
            };
            let Some(adoption) = state.needs_allocate(cluster, owner.as_ref()) else {
                continue;
            };
            let allocate = Allocate {
                pool: pool.to_string(),
                cluster: cluster.clone(),
                owner: owner.clone(),
                create_request: object.is_none() && owner.is_some(),
            };
            if adoption {
                adopting.push(allocate);
            } else {
                rest.push(allocate);
            }
        }
        work.allocations.extend(adopting);
        work.allocations.extend(rest);
        work.clusters.insert(
            pool.to_string(),
            asking.values().map(|(c, _)| c.clone()).collect(),
        );
    }
    work
}

/// A cluster that keeps what it holds in `pool` (from `dc`) and asks nothing new.
fn holding(ns: &str, name: &str, dc: String, pool: &str) -> FleetCluster {
    FleetCluster {
        namespace: ns.to_string(),
        name: name.to_string(),
        datacenter: dc,
        pools: Some(BTreeSet::from([pool.to_string()])),
    }
}

/// Why nobody in `ns` asks a pool any more (for the log).
fn gone(index: &FleetIndex, tenants: &Tenants<'_>, ns: &str, dc: &str) -> String {
    match tenants.get(ns) {
        Some((c, entry, _)) => match &entry.datacenter {
            Some(now) if now != dc => format!(
                "Cluster {ns}/{} moved from datacenter {dc} to {now}, which the pool does not serve",
                c.name
            ),
            _ => format!(
                "Cluster {ns}/{} does not ask the pool from datacenter {dc}",
                c.name
            ),
        },
        None if index.clusters().is_some() => {
            format!("no Cluster and no request in namespace {ns} asks for it")
        }
        None => format!("no request in namespace {ns} asks for it"),
    }
}

/// The IPAMAllocation's status already says `message`.
fn refused_as(a: &FleetAllocationEntry, message: &str) -> bool {
    a.status.as_ref().is_some_and(|s| {
        s.state == Some(AllocationState::Refused) && s.message.as_deref() == Some(message)
    })
}

/// One cluster's allocation in one pool, as the index shows it.
struct State<'a> {
    pool: &'a str,
    entry: &'a FleetPoolEntry,
    records: &'a BTreeMap<String, (String, Allocation)>,
    /// The pool's IPAMAllocations, by namespace.
    objects: &'a [(&'a str, &'a FleetAllocationEntry)],
    checked: &'a BTreeMap<&'a str, Option<FleetPool>>,
    object: Option<&'a FleetAllocationEntry>,
    config_map: Option<&'a String>,
}

impl State<'_> {
    /// `None` when the allocation is in order (or refused as its status says); otherwise
    /// whether allocating adopts an IPAMAllocation the pool has no record of.
    fn needs_allocate(&self, cluster: &FleetCluster, owner: Option<&ClusterRef>) -> Option<bool> {
        let (ns, dc) = (&cluster.namespace, &cluster.datacenter);
        let Some(entry) = self.entry.spec.datacenters.get(dc) else {
            // A request (or a holder) from a datacenter the pool does not serve.
            let expected = Refusal::NoDatacenter {
                pool: self.pool.to_string(),
                dc: dc.clone(),
            };
            return (!self
                .object
                .is_some_and(|o| refused_as(o, &expected.to_string())))
            .then_some(false);
        };
        let recorded = self
            .records
            .get(ns)
            .filter(|(d, _)| d == dc)
            .map(|(_, a)| a);
        // Read only when there is no record.
        let adoptable = match recorded {
            Some(_) => None,
            None => self
                .object
                .filter(|o| o.spec.dc == *dc)
                .and_then(|o| o.spec.allocation().ok().flatten()),
        };
        let current = match (recorded, &adoptable) {
            (Some(a), _) => Current::Recorded(a),
            (None, Some(a)) => Current::Adopted(a),
            (None, None) => Current::None,
        };
        // A recorded allocation is kept when core keeps it (what `decide` does for it); that
        // never looks at the other clusters, so it is decided alone, at no cost.
        if let Some(a) = recorded
            && let Some(Some(checked)) = self.checked.get(dc.as_str())
            && allocate(checked, &[], ns, Some(a)).as_ref() == Ok(a)
        {
            let written = self.object.is_some_and(|o| {
                o.spec == IPAMAllocationSpec::recording(a, dc)
                    && o.status.as_ref().is_some_and(|s| {
                        s.state == Some(AllocationState::Allocated)
                            && s.pool_uid.as_deref() == Some(self.entry.uid.as_str())
                    })
                    && owner.is_none_or(|c| o.cluster.as_deref() == Some(c.name.as_str()))
            });
            let projected = self.config_map == Some(&a.to_string());
            return (!(written && projected)).then_some(false);
        }
        let adopting = matches!(current, Current::Adopted(_));
        // Refused as the status already says: decided against the others, as allocate would
        // (every allocation holding addresses, recorded or not).
        if let Some(o) = self.object
            && o.status
                .as_ref()
                .is_some_and(|s| s.state == Some(AllocationState::Refused))
        {
            let objects = self.objects.iter().map(|(ns, o)| (*ns, &o.spec));
            let existing = holders(self.records, objects, dc);
            if let Err(refusal) = decide(self.pool, dc, entry, &existing, ns, current)
                && refused_as(o, &refusal.to_string())
            {
                return None;
            }
        }
        Some(adopting)
    }
}

/// A Cluster's [`CLUSTER_NAME_LABEL`] patch.
pub fn cluster_label(name: &str) -> serde_json::Value {
    serde_json::json!({"metadata": {"labels": {CLUSTER_NAME_LABEL: name}}})
}
