//! The online audit: what the pods use, what allot's Endpoints record, what the claims hold and
//! what the pools' status counts say, compared; every disagreement is a [`Finding`] naming the
//! objects involved. `allotctl ipam check` prints it, `allotctl ipam release --from-report`
//! acts on its leaks ([`still_leaked`]), and the controller exports its counts and an Event.
//!
//! No lock: the inputs are read while agents keep allocating, so a finding may be a change in
//! flight (an ADD whose Endpoint is not written yet, a pod whose status has not caught up).
//! Acting on one therefore takes a second sighting: a leak is released only if a fresh check
//! still finds the same claim, unchanged, leaked, by GC's own clocks ([`repair`]: the grace
//! period between sightings, the claim's age, the pod's grace period and GC's additional delay)
//! (Calico's `ipam release --from-report` locks the datastore instead, so no pod starts
//! meanwhile, projectcalico/calico#8548).
//!
//! A pod's network status (Multus's annotation) is written by whoever may patch the pod: when
//! it disagrees with a live pod's own claim that its allot Endpoint records too, that is
//! reported for a person to judge ([`Finding::StatusDisagrees`]), never called a leak.
//!
//! Pure: the caller gathers the inputs and decides each claim by the GC table against the same
//! view ([`Inputs::verdict`]).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::IpAddr;

use crate::addr::{AddrSet, IpFamily};
use crate::gc::{LeakReason, NotBefore, Verdict, Wait, due};
use crate::migrate::PodAddress;
use crate::store::{Claim, unchanged};

/// A live pod that holds addresses (not finished, not on the host network) and what it uses:
/// `status.podIPs` (its `eth0`) and the Multus network status (each interface).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodUse {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub addresses: Vec<PodAddress>,
    /// The KubeVirt virtual machine it is a launcher pod of.
    pub virtual_machine: Option<String>,
}

/// What one allot Endpoint records: the pod's UID and an address per interface.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EndpointUse {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub addresses: Vec<(IpAddr, String)>,
}

/// One IPPool: what it lists, what it may hand out, and its status as written.
#[derive(Clone, Debug)]
pub struct PoolCounts {
    pub name: String,
    /// `ips` (its subnet's usable hosts when empty): an address in it is allot's to account for.
    pub listed: AddrSet,
    /// Addresses it may hand out (`totalIPCount` as the controller derives it).
    pub total: u64,
    pub status_allocated: Option<u64>,
    pub status_total: Option<u64>,
}

/// Everything one check compares.
pub struct Inputs<'a> {
    pub claims: &'a [Claim],
    pub pods: &'a [PodUse],
    pub endpoints: &'a [EndpointUse],
    pub pools: &'a [PoolCounts],
    /// The GC table's verdict on a claim, against the same view of pods and StatefulSets.
    pub verdict: &'a dyn Fn(&Claim) -> Verdict,
}

/// A pod by namespace, name and UID.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct PodId {
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

impl fmt::Display for PodId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)?;
        if !self.uid.is_empty() {
            write!(f, " (uid {})", self.uid)?;
        }
        Ok(())
    }
}

/// What says a pod holds an address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HeldBy {
    /// A claim, of this pool.
    Claim { pool: String },
    /// The pod's allot Endpoint, on this interface.
    Endpoint { interface: String },
    /// The pod's status (or network status), on this interface.
    PodStatus { interface: Option<String> },
}

/// A pod said to hold an address, and what says so.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Holding {
    pub pod: PodId,
    pub by: HeldBy,
    /// The virtual machine the pod is a launcher pod of: all of one VM's launcher pods hold its
    /// address as one (a live migration's source and target both report it).
    pub virtual_machine: Option<String>,
}

impl fmt::Display for Holding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.by {
            HeldBy::Claim { pool } => write!(f, "claimed for {} (IPPool {pool})", self.pod),
            HeldBy::Endpoint { interface } => {
                write!(f, "recorded by Endpoint {} ({interface})", self.pod)
            }
            HeldBy::PodStatus { interface } => write!(
                f,
                "used by pod {}{}",
                self.pod,
                interface
                    .as_deref()
                    .map(|i| format!(" on {i}"))
                    .unwrap_or_default()
            ),
        }
    }
}

/// Why a claim has no live holder.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LeakWhy {
    /// The GC table's row (the pod is gone, finished, replaced, …), and from when GC would
    /// release it.
    Gc {
        reason: LeakReason,
        not_before: NotBefore,
    },
    /// Its pod lives but uses another address of the family on that interface (and its allot
    /// Endpoint does not record this one).
    NotUsed { uses: IpAddr },
}

impl LeakWhy {
    /// The name a report gives it: the GC table's reason, or `not-used-by-its-pod`.
    pub fn as_str(&self) -> &'static str {
        match self {
            LeakWhy::Gc { reason, .. } => reason.as_str(),
            LeakWhy::NotUsed { .. } => "not-used-by-its-pod",
        }
    }
}

impl fmt::Display for LeakWhy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LeakWhy::Gc { reason, .. } => {
                write!(f, "{}: {}", reason.as_str(), reason.describe())
            }
            LeakWhy::NotUsed { uses } => write!(
                f,
                "not-used-by-its-pod: the pod uses {uses} on that interface instead"
            ),
        }
    }
}

/// One disagreement.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Finding {
    /// A claim no live pod needs (what `ipam release --from-report` may release).
    LeakedClaim { claim: Claim, why: LeakWhy },
    /// A pod uses an address of an allot pool that nobody claims: it may be handed out again.
    UnclaimedAddress {
        address: IpAddr,
        pool: Option<String>,
        pod: PodId,
        interface: Option<String>,
    },
    /// More than one pod holds the address (by claim, Endpoint or status).
    ClaimedTwice {
        address: IpAddr,
        holders: Vec<Holding>,
    },
    /// An Endpoint records an address nobody claims or uses (a stale record).
    EndpointWithoutClaim {
        address: IpAddr,
        endpoint: PodId,
        interface: String,
    },
    /// A live pod's own claim, recorded by its allot Endpoint too, that the pod's status (or its
    /// Multus network status, which anyone who may patch the pod can write) does not show: it
    /// reports `reported` on that interface instead. Never released by a repair: a person
    /// judges which is true.
    StatusDisagrees { claim: Claim, reported: IpAddr },
    /// An IPPool's status counts disagree with the claims and its spec.
    PoolCount {
        pool: String,
        status_allocated: Option<u64>,
        claims: u64,
        status_total: Option<u64>,
        total: u64,
    },
}

/// The kinds of [`Finding`], as reports and metrics name them.
pub const KINDS: [&str; 6] = [
    "leaked-claim",
    "unclaimed-address",
    "claimed-twice",
    "endpoint-without-claim",
    "status-disagrees",
    "pool-count",
];

impl Finding {
    pub fn kind(&self) -> &'static str {
        match self {
            Finding::LeakedClaim { .. } => KINDS[0],
            Finding::UnclaimedAddress { .. } => KINDS[1],
            Finding::ClaimedTwice { .. } => KINDS[2],
            Finding::EndpointWithoutClaim { .. } => KINDS[3],
            Finding::StatusDisagrees { .. } => KINDS[4],
            Finding::PoolCount { .. } => KINDS[5],
        }
    }

    /// The address it is about, if one.
    pub fn address(&self) -> Option<IpAddr> {
        match self {
            Finding::LeakedClaim { claim, .. } | Finding::StatusDisagrees { claim, .. } => {
                Some(claim.address)
            }
            Finding::UnclaimedAddress { address, .. }
            | Finding::ClaimedTwice { address, .. }
            | Finding::EndpointWithoutClaim { address, .. } => Some(*address),
            Finding::PoolCount { .. } => None,
        }
    }
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Finding::LeakedClaim { claim, why } => write!(
                f,
                "{} (IPPool {}) is claimed for {}/{} (uid {}) but leaked: {why}",
                claim.address, claim.pool, claim.pod.namespace, claim.pod.name, claim.pod.uid
            ),
            Finding::UnclaimedAddress {
                address,
                pool,
                pod,
                interface,
            } => write!(
                f,
                "{address} ({}) is used by pod {pod}{} but nobody claims it: it may be handed out again",
                pool.as_deref()
                    .map(|p| format!("IPPool {p}"))
                    .unwrap_or_else(|| "no pool".into()),
                interface
                    .as_deref()
                    .map(|i| format!(" on {i}"))
                    .unwrap_or_default()
            ),
            Finding::ClaimedTwice { address, holders } => write!(
                f,
                "{address} is held by more than one pod: {}",
                holders
                    .iter()
                    .map(Holding::to_string)
                    .collect::<Vec<_>>()
                    .join("; ")
            ),
            Finding::EndpointWithoutClaim {
                address,
                endpoint,
                interface,
            } => write!(
                f,
                "{address} is recorded by Endpoint {endpoint} ({interface}) but neither claimed nor used"
            ),
            Finding::StatusDisagrees { claim, reported } => write!(
                f,
                "{} (IPPool {}) is claimed for {}/{} (uid {}){} and its Endpoint records it, but \
                 the pod's status reports {reported} there instead: judge which is true (the \
                 network-status annotation is writable by whoever may patch the pod); nothing \
                 is released for it",
                claim.address,
                claim.pool,
                claim.pod.namespace,
                claim.pod.name,
                claim.pod.uid,
                claim
                    .attachment
                    .as_ref()
                    .map(|a| format!(" on {}", a.interface))
                    .unwrap_or_default()
            ),
            Finding::PoolCount {
                pool,
                status_allocated,
                claims,
                status_total,
                total,
            } => write!(
                f,
                "IPPool {pool} says {} allocated of {}, the claims and its spec say {claims} of {total}",
                count(*status_allocated),
                count(*status_total)
            ),
        }
    }
}

fn count(n: Option<u64>) -> String {
    n.map_or_else(|| "-".into(), |n| n.to_string())
}

/// What one check found, ordered by kind, then address or pool.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Report {
    pub findings: Vec<Finding>,
}

impl Report {
    pub fn is_clean(&self) -> bool {
        self.findings.is_empty()
    }

    /// How many findings of each kind of [`KINDS`], in that order.
    pub fn counts(&self) -> [usize; KINDS.len()] {
        let mut counts = [0; KINDS.len()];
        for f in &self.findings {
            let i = KINDS.iter().position(|k| *k == f.kind()).expect("a kind");
            counts[i] += 1;
        }
        counts
    }

    /// The leaked claims, as found.
    pub fn leaked(&self) -> impl Iterator<Item = &Claim> {
        self.leaks().map(|(claim, _)| claim)
    }

    /// The leaked claims, as found, each with why.
    pub fn leaks(&self) -> impl Iterator<Item = (&Claim, &LeakWhy)> {
        self.findings.iter().filter_map(|f| match f {
            Finding::LeakedClaim { claim, why } => Some((claim, why)),
            _ => None,
        })
    }
}

/// Compares everything `inputs` holds.
pub fn check(inputs: &Inputs) -> Report {
    let claims: BTreeMap<IpAddr, &Claim> = inputs.claims.iter().map(|c| (c.address, c)).collect();
    let pool_of = |a: IpAddr| {
        inputs
            .pools
            .iter()
            .find(|p| p.listed.contains(a))
            .map(|p| p.name.clone())
    };
    let allot_s = |a: IpAddr| claims.contains_key(&a) || pool_of(a).is_some();

    // Every holder of every address allot accounts for.
    let mut holders: BTreeMap<IpAddr, Vec<Holding>> = BTreeMap::new();
    for c in inputs.claims.iter().filter(|c| !c.is_quarantined()) {
        holders.entry(c.address).or_default().push(Holding {
            pod: pod_id(&c.pod.namespace, &c.pod.name, &c.pod.uid),
            by: HeldBy::Claim {
                pool: c.pool.clone(),
            },
            virtual_machine: c.pod.virtual_machine().map(str::to_string),
        });
    }
    let vm_of: BTreeMap<(&str, &str), &str> = inputs
        .pods
        .iter()
        .filter_map(|p| {
            Some((
                (p.namespace.as_str(), p.name.as_str()),
                p.virtual_machine.as_deref()?,
            ))
        })
        .collect();
    for e in inputs.endpoints {
        for (address, interface) in &e.addresses {
            holders.entry(*address).or_default().push(Holding {
                pod: pod_id(&e.namespace, &e.name, &e.uid),
                by: HeldBy::Endpoint {
                    interface: interface.clone(),
                },
                virtual_machine: vm_of
                    .get(&(e.namespace.as_str(), e.name.as_str()))
                    .map(|vm| vm.to_string()),
            });
        }
    }
    let mut used: BTreeSet<IpAddr> = BTreeSet::new();
    for p in inputs.pods {
        for a in p.addresses.iter().filter(|a| allot_s(a.address)) {
            used.insert(a.address);
            holders.entry(a.address).or_default().push(Holding {
                pod: pod_id(&p.namespace, &p.name, &p.uid),
                by: HeldBy::PodStatus {
                    interface: a.interface.clone(),
                },
                virtual_machine: p.virtual_machine.clone(),
            });
        }
    }

    let mut findings = Vec::new();
    // A claim whose address a live pod uses is never called leaked (releasing it would free an
    // address in use): if the pod is another than the claim's, that is a double holder below.
    for c in inputs.claims.iter().filter(|c| !c.is_quarantined()) {
        if used.contains(&c.address) {
            continue;
        }
        match (inputs.verdict)(c) {
            Verdict::Leak { reason, not_before } => findings.push(Finding::LeakedClaim {
                claim: c.clone(),
                why: LeakWhy::Gc { reason, not_before },
            }),
            Verdict::Keep(_) => {
                let Some(uses) = not_used(c, inputs.pods) else {
                    continue;
                };
                // The pod's own Endpoint records this address: allot's word against what the
                // pod's status says, which anyone who may patch the pod can write.
                findings.push(if recorded_by_endpoint(c, inputs.endpoints) {
                    Finding::StatusDisagrees {
                        claim: c.clone(),
                        reported: uses,
                    }
                } else {
                    Finding::LeakedClaim {
                        claim: c.clone(),
                        why: LeakWhy::NotUsed { uses },
                    }
                });
            }
        }
    }
    for (address, hs) in &holders {
        if more_than_one(hs) {
            findings.push(Finding::ClaimedTwice {
                address: *address,
                holders: hs.clone(),
            });
            continue;
        }
        if claims.contains_key(address) {
            continue;
        }
        for h in hs {
            match &h.by {
                HeldBy::PodStatus { interface } => findings.push(Finding::UnclaimedAddress {
                    address: *address,
                    pool: pool_of(*address),
                    pod: h.pod.clone(),
                    interface: interface.clone(),
                }),
                HeldBy::Endpoint { interface } if !used.contains(address) => {
                    findings.push(Finding::EndpointWithoutClaim {
                        address: *address,
                        endpoint: h.pod.clone(),
                        interface: interface.clone(),
                    })
                }
                _ => {}
            }
        }
    }
    let mut per_pool: BTreeMap<&str, u64> = BTreeMap::new();
    for c in inputs.claims {
        *per_pool.entry(c.pool.as_str()).or_default() += 1;
    }
    for p in inputs.pools {
        let claims = per_pool.get(p.name.as_str()).copied().unwrap_or(0);
        let off = |status: Option<u64>, actual: u64| status.is_some_and(|s| s != actual);
        if off(p.status_allocated, claims) || off(p.status_total, p.total) {
            findings.push(Finding::PoolCount {
                pool: p.name.clone(),
                status_allocated: p.status_allocated,
                claims,
                status_total: p.status_total,
                total: p.total,
            });
        }
    }
    findings.sort_by_key(|f| {
        let kind = KINDS.iter().position(|k| *k == f.kind());
        let pool = match f {
            Finding::PoolCount { pool, .. } => pool.clone(),
            _ => String::new(),
        };
        (kind, f.address(), pool)
    });
    Report { findings }
}

/// Whether `holdings` name more than one pod: another namespace or name, or another UID (a
/// holding without a UID matches any of its name's). Launcher pods of one virtual machine are
/// one holder.
fn more_than_one(holdings: &[Holding]) -> bool {
    let first = &holdings[0].pod;
    let one_vm = holdings.iter().all(|h| {
        h.pod.namespace == first.namespace
            && h.virtual_machine.is_some()
            && h.virtual_machine == holdings[0].virtual_machine
    });
    if one_vm {
        return false;
    }
    let mut uids: BTreeSet<&str> = BTreeSet::new();
    for h in holdings {
        if (h.pod.namespace.as_str(), h.pod.name.as_str())
            != (first.namespace.as_str(), first.name.as_str())
        {
            return true;
        }
        if !h.pod.uid.is_empty() {
            uids.insert(&h.pod.uid);
        }
    }
    uids.len() > 1
}

fn pod_id(namespace: &str, name: &str, uid: &str) -> PodId {
    PodId {
        namespace: namespace.to_string(),
        name: name.to_string(),
        uid: uid.to_string(),
    }
}

/// The address `claim`'s own pod uses instead of it: the pod (same UID) reports an address of
/// the claim's family on the claim's interface, and not this one.
fn not_used(claim: &Claim, pods: &[PodUse]) -> Option<IpAddr> {
    let interface = &claim.attachment.as_ref()?.interface;
    let pod = pods.iter().find(|p| {
        p.namespace == claim.pod.namespace && p.name == claim.pod.name && p.uid == claim.pod.uid
    })?;
    let family = IpFamily::of(claim.address);
    let on_it: Vec<IpAddr> = pod
        .addresses
        .iter()
        .filter(|a| a.interface.as_deref() == Some(interface.as_str()))
        .map(|a| a.address)
        .filter(|a| IpFamily::of(*a) == family)
        .collect();
    if on_it.contains(&claim.address) {
        return None;
    }
    on_it.first().copied()
}

/// Whether `claim`'s pod's allot Endpoint (the same pod: name and UID) records its address on
/// its interface.
fn recorded_by_endpoint(claim: &Claim, endpoints: &[EndpointUse]) -> bool {
    let Some(interface) = claim.attachment.as_ref().map(|a| &a.interface) else {
        return false;
    };
    endpoints.iter().any(|e| {
        e.namespace == claim.pod.namespace
            && e.name == claim.pod.name
            && e.uid == claim.pod.uid
            && e.addresses
                .iter()
                .any(|(a, i)| *a == claim.address && i == interface)
    })
}

/// GC's clocks, as a repair honours them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Clocks {
    /// GC's grace period (the controller's `--gc-grace`): the least age of a claim at its
    /// first sighting, and the least time between two sightings.
    pub grace: u64,
    /// GC's additional grace delay (`ALLOT_GC_ADDITIONAL_GRACE_DELAY`), which a leak the table
    /// does not decide (`not-used-by-its-pod`) waits for after its first sighting too.
    pub additional_delay: u64,
    /// When the report was made (its `checkedAt`): the first sighting.
    pub first_seen: u64,
    /// Now: the second sighting.
    pub now: u64,
}

/// Why a repair keeps a reported leak.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Kept {
    /// The fresh check no longer finds it leaked, or the claim changed since the report
    /// (released, taken back, re-attached, another pod's).
    NoLongerLeaked,
    /// Leaked still, but not due by GC's clocks yet.
    NotDue(Wait),
}

impl fmt::Display for Kept {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Kept::NoLongerLeaked => f.write_str("no longer leaked, or changed since the report"),
            Kept::NotDue(wait) => write!(f, "not due yet: {wait}; run the check again later"),
        }
    }
}

/// What a repair may release of `reported` (the leaks of an earlier report, made at
/// `clocks.first_seen`): those a fresh check, `recheck`, still finds leaked and unchanged (same
/// attachment, pod UID and last change), and due by GC's own clocks ([`due`]) as if the report
/// had been GC's first sighting and now its second. So `ipam release --from-report` releases
/// only what GC would release at that moment; each of the others is kept, with why.
pub fn repair(
    reported: &[Claim],
    recheck: &Report,
    clocks: &Clocks,
) -> (Vec<Claim>, Vec<(Claim, Kept)>) {
    let now: BTreeMap<IpAddr, (&Claim, &LeakWhy)> = recheck
        .leaks()
        .map(|(c, why)| (c.address, (c, why)))
        .collect();
    let mut released = Vec::new();
    let mut kept = Vec::new();
    for r in reported {
        let same = now.get(&r.address).filter(|(c, _)| {
            unchanged(c, r)
                && c.pod.namespace == r.pod.namespace
                && c.pod.name == r.pod.name
                && c.pool == r.pool
        });
        let Some((_, why)) = same else {
            kept.push((r.clone(), Kept::NoLongerLeaked));
            continue;
        };
        let not_before = match why {
            LeakWhy::Gc { not_before, .. } => *not_before,
            LeakWhy::NotUsed { .. } => NotBefore::AfterFirstSighting(clocks.additional_delay),
        };
        match due(r, not_before, clocks.first_seen, clocks.now, clocks.grace) {
            Ok(()) => released.push(r.clone()),
            Err(wait) => kept.push((r.clone(), Kept::NotDue(wait))),
        }
    }
    (released, kept)
}

#[cfg(test)]
mod tests;
