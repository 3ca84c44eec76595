//! Addresses a StatefulSet declares for its ordinals (`ipam.allot.dev/ordinal-ips` on its pod
//! template), reserved for it while it exists.
//!
//! The controller keeps one ReservedIP per StatefulSet and IP family listing what it declares,
//! labelled with the StatefulSet ([`labels`]). A ReservedIP keeps every other pod off those
//! addresses (no pool hands them out, no auto pool carves them, a given address among them is
//! refused), across scale-down and back up, while the StatefulSet's own pods are given theirs by
//! ordinal ([`reserved_for`] lets the engine tell the two apart). Deleting the StatefulSet
//! deletes the ReservedIPs: the addresses are free again. Spiderpool keeps a StatefulSet's
//! addresses only across restarts of one pod (spiderpool#3488, #3893: not across scale-down).
//!
//! A StatefulSet may declare only addresses of pools its pods may use (a pool's namespace and
//! pod affinities, judged by the host as [`Barred`] verdicts): the webhook refuses others
//! ([`refusals`]), and the controller never reserves them ([`reservable`]), so that no tenant
//! can take another's addresses by declaring them.

use std::collections::BTreeMap;

use crate::addr::{AddrSet, IpFamily};
use crate::pool::{Pool, Reserved};
use crate::store::Claim;

/// Labels of a ReservedIP the controller keeps for a workload's declared addresses.
pub mod labels {
    pub const KIND: &str = "ipam.allot.dev/reserved-for-kind";
    pub const NAMESPACE: &str = "ipam.allot.dev/reserved-for-namespace";
    pub const NAME: &str = "ipam.allot.dev/reserved-for-name";
}

/// The workload a ReservedIP is kept for.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct For {
    pub kind: String,
    pub namespace: String,
    pub name: String,
}

impl For {
    pub fn statefulset(namespace: &str, name: &str) -> For {
        For {
            kind: "StatefulSet".into(),
            namespace: namespace.into(),
            name: name.into(),
        }
    }

    /// The labels that mark a ReservedIP as kept for this workload.
    pub fn labels(&self) -> BTreeMap<String, String> {
        BTreeMap::from([
            (labels::KIND.to_string(), self.kind.clone()),
            (labels::NAMESPACE.to_string(), self.namespace.clone()),
            (labels::NAME.to_string(), self.name.clone()),
        ])
    }

    /// The name of its ReservedIP for `family`: `statefulset.<namespace>.<name>.ipv4`. Namespace
    /// and StatefulSet names are DNS labels (at most 63 characters, no dots), so the name is a
    /// valid, unique DNS subdomain.
    pub fn reservation_name(&self, family: IpFamily) -> String {
        format!(
            "{}.{}.{}.{family}",
            self.kind.to_ascii_lowercase(),
            self.namespace,
            self.name
        )
    }
}

/// The workload a ReservedIP was kept for, from its labels.
pub fn reserved_for(labels: &BTreeMap<String, String>) -> Option<For> {
    Some(For {
        kind: labels.get(labels::KIND)?.clone(),
        namespace: labels.get(labels::NAMESPACE)?.clone(),
        name: labels.get(labels::NAME)?.clone(),
    })
}

/// Whether `reserved` keeps `address` for the pod of `namespace` whose top-level owner is
/// `owner` (kind, name): every live ReservedIP that lists the address is kept for that owner.
pub fn reserved_for_pod(
    reserved: &[Reserved],
    address: std::net::IpAddr,
    namespace: &str,
    owner: Option<(&str, &str)>,
) -> bool {
    let Some((kind, name)) = owner else {
        return false;
    };
    let mut holders = reserved
        .iter()
        .filter(|r| r.reserves_address(address))
        .peekable();
    holders.peek().is_some()
        && holders.all(|r| {
            reserved_for(&r.meta.labels)
                .is_some_and(|f| f.kind == kind && f.namespace == namespace && f.name == name)
        })
}

/// A ReservedIP as the controller wants it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Wanted {
    pub name: String,
    pub owner: For,
    pub family: IpFamily,
    /// The declared entries (addresses and ranges), in the order written, without repeats.
    pub ips: Vec<String>,
}

/// One write of a pass.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Create or update (server-side apply) the ReservedIP.
    Apply(Wanted),
    /// Delete the ReservedIP `name`: its workload is gone or declares nothing of its family.
    Delete { name: String, owner: For },
}

/// What is kept now: a ReservedIP labelled for a workload, with what it reserves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Kept {
    pub name: String,
    pub owner: For,
    /// `None`: nothing of it can be read (applied again).
    pub ips: Option<AddrSet>,
    pub deleting: bool,
}

/// The writes that make the kept ReservedIPs what the workloads declare: `declared` maps each
/// workload that declares addresses (and is not being deleted) to its entries per family.
/// ReservedIPs carrying the labels of a workload not in `declared` are deleted; nothing else is
/// ever touched.
pub fn plan(declared: &BTreeMap<For, [Vec<String>; 2]>, kept: &[Kept]) -> Vec<Action> {
    let mut actions = Vec::new();
    let mut wanted_names = std::collections::BTreeSet::new();
    for (owner, per_family) in declared {
        for (family, entries) in [IpFamily::V4, IpFamily::V6].into_iter().zip(per_family) {
            if entries.is_empty() {
                continue;
            }
            let name = owner.reservation_name(family);
            wanted_names.insert(name.clone());
            let mut ips: Vec<String> = Vec::with_capacity(entries.len());
            for e in entries {
                if !ips.contains(e) {
                    ips.push(e.clone());
                }
            }
            let set = AddrSet::parse_entries_lenient(family, &ips).0;
            let current = kept.iter().find(|k| k.name == name);
            if current.is_none_or(|k| k.ips.as_ref() != Some(&set) || &k.owner != owner) {
                actions.push(Action::Apply(Wanted {
                    name,
                    owner: owner.clone(),
                    family,
                    ips,
                }));
            }
        }
    }
    for k in kept {
        if !wanted_names.contains(&k.name) && !k.deleting {
            actions.push(Action::Delete {
                name: k.name.clone(),
                owner: k.owner.clone(),
            });
        }
    }
    actions
}

/// Addresses a StatefulSet may declare at most (the admission webhook checks each).
pub const MAX_DECLARED: u64 = 4096;

/// Why a workload's pods may not use an IPPool: its tenancy fields, as the default policy reads
/// them. Core matches no selectors: the host judges each pool with the default policy's own
/// namespace and pod rules and hands the verdicts in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Barred {
    /// Its namespaceName (listed here), which does not name the workload's namespace.
    NamespaceName(Vec<String>),
    /// Its namespaceAffinity, which the labels of the workload's namespace do not match.
    NamespaceAffinity,
    /// Its podAffinity, which the labels of the workload's pod template do not match.
    PodAffinity,
}

impl Barred {
    /// Why, and what to do next, for the pods of `owner`'s namespace.
    pub fn explain(&self, owner: &For) -> String {
        let namespace = &owner.namespace;
        match self {
            Barred::NamespaceName(names) => format!(
                "its namespaceName {names:?} does not name namespace {namespace}; declare \
                 addresses of a pool that serves {namespace}, or have the pool's owner add \
                 {namespace} to its namespaceName"
            ),
            Barred::NamespaceAffinity => format!(
                "the labels of namespace {namespace} do not match its namespaceAffinity; declare \
                 addresses of a pool that serves {namespace}, or have the namespace labelled as \
                 the pool's namespaceAffinity asks"
            ),
            Barred::PodAffinity => "the labels of the pod template do not match its podAffinity; \
                 label the pod template as the pool's podAffinity asks, or declare addresses of \
                 another pool"
                .to_string(),
        }
    }
}

/// `set`, which lies in pool `pool`, cannot be `owner`'s: its pods may not use the pool.
fn barred_message(set: &AddrSet, pool: &str, barred: &Barred, owner: &For) -> String {
    format!(
        "{} in IPPool {pool}, which pods of {} {}/{} may not use: {}",
        shown(set),
        owner.kind,
        owner.namespace,
        owner.name,
        barred.explain(owner)
    )
}

/// Addresses as a person reads them, with their verb: the first few entries, then how many
/// addresses there are in all.
fn shown(set: &AddrSet) -> String {
    const SHOWN: usize = 4;
    let entries = set.to_entries();
    let verb = if set.len() == 1 { "is" } else { "are" };
    if entries.len() <= SHOWN {
        return format!("{} {verb}", entries.join(", "));
    }
    format!(
        "{}, … ({} addresses) {verb}",
        entries[..SHOWN].join(", "),
        set.len()
    )
}

/// What the admission webhook checks a StatefulSet's declared addresses against.
pub struct Against<'a> {
    pub pools: &'a [Pool],
    pub reserved: &'a [Reserved],
    pub claims: &'a [Claim],
    /// Names of the pools the pod template's `ippool` / `ippools` annotations allow (wildcards
    /// resolved); `None` when it names none (then any pool may be allowed, by the namespace's or
    /// the cluster's defaults).
    pub allowed: Option<&'a [String]>,
    /// The pools the StatefulSet's pods may not use, by name, and why (absent: they may).
    pub barred: &'a BTreeMap<String, Barred>,
}

/// Why `owner`'s declared addresses (`entries` per family) cannot be its: every address must be
/// inside an IPPool its pods may use (by the pool's namespace and pod affinities) and the
/// template allows, that may hand it out (in its ips, not excluded, not its gateway), reserved
/// by no ReservedIP but the StatefulSet's own, and held by no pod but the StatefulSet's own.
/// Empty when they can. Addresses in pools its pods may not use come first, one refusal per
/// pool.
pub fn refusals(
    owner: &For,
    entries: &[(IpFamily, Vec<String>)],
    against: &Against,
) -> Vec<String> {
    let mut out = Vec::new();
    let mut sets = Vec::new();
    for (family, list) in entries {
        match AddrSet::parse_entries(*family, list) {
            Ok(set) => sets.push(set),
            Err(e) => out.push(format!("{family} list {list:?}: {e}")),
        }
    }
    let total: u64 = sets.iter().map(AddrSet::len).sum();
    if total > MAX_DECLARED {
        out.push(format!(
            "it declares {total} addresses; at most {MAX_DECLARED} are checked and kept"
        ));
        return out;
    }
    let claims: BTreeMap<std::net::IpAddr, &Claim> =
        against.claims.iter().map(|c| (c.address, c)).collect();
    let allowed = |pool: &Pool| {
        against
            .allowed
            .is_none_or(|names| names.iter().any(|n| n == pool.name()))
    };
    let barred = |pool: &Pool| against.barred.get(pool.name());
    // Addresses in pools its pods may not use, per pool.
    let mut barred_in: BTreeMap<&str, (AddrSet, &Barred)> = BTreeMap::new();
    let mut rest = Vec::new();
    for address in sets.iter().flat_map(AddrSet::iter) {
        let family = IpFamily::of(address);
        let in_pools = || {
            against
                .pools
                .iter()
                .filter(move |p| p.family == family && p.ips.contains(address))
        };
        let Some(pool) = in_pools().find(|p| allowed(p) && barred(p).is_none()) else {
            if let Some((p, why)) = in_pools().find_map(|p| Some((p, barred(p)?))) {
                barred_in
                    .entry(p.name())
                    .or_insert_with(|| (AddrSet::empty(family), why))
                    .0
                    .insert(address);
                continue;
            }
            rest.push(match in_pools().next() {
                Some(p) => format!(
                    "{address} is in IPPool {}, which the pod template's ippool/ippools \
                     annotation does not allow",
                    p.name()
                ),
                None => format!("{address} is in no IPPool"),
            });
            continue;
        };
        if pool.spec.disable || pool.terminating() {
            rest.push(format!(
                "{address} is in IPPool {}, which is disabled or being deleted",
                pool.name()
            ));
            continue;
        }
        if pool.gateway == Some(address) {
            rest.push(format!(
                "{address} is the gateway of IPPool {}",
                pool.name()
            ));
            continue;
        }
        if !pool.allocatable().contains(address) {
            rest.push(format!("{address} is excluded by IPPool {} (excludeIPs, or its subnet's network or broadcast address)", pool.name()));
            continue;
        }
        if let Some(r) = against.reserved.iter().find(|r| {
            r.reserves_address(address) && reserved_for(&r.meta.labels).as_ref() != Some(owner)
        }) {
            rest.push(format!(
                "{address} is reserved by ReservedIP {}",
                r.meta.name
            ));
            continue;
        }
        if let Some(c) = claims.get(&address) {
            let own = c.pod.namespace == owner.namespace
                && c.pod.owner_kind.as_deref() == Some(owner.kind.as_str())
                && c.pod.owner_name.as_deref() == Some(owner.name.as_str());
            if !own {
                rest.push(format!(
                    "{address} is held by pod {}/{}",
                    c.pod.namespace, c.pod.name
                ));
            }
        }
    }
    for (pool, (set, why)) in barred_in {
        out.push(barred_message(&set, pool, why, owner));
    }
    out.extend(rest);
    out
}

/// Whether a workload's pods may use an IPPool, as the controller judges it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Tenancy {
    /// They may.
    Usable,
    /// They may not, and why.
    Barred(Barred),
    /// The pool cannot be read (invalid), so neither can its namespace and pod affinities.
    Unknown(String),
}

/// An IPPool the controller holds a workload's declared addresses against.
pub struct Judged<'a> {
    pub name: &'a str,
    /// What it lists, as far as that can be read.
    pub addresses: &'a AddrSet,
    pub tenancy: Tenancy,
}

/// What of a workload's declared addresses the controller reserves, and why it leaves the rest.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Reservable {
    /// Per family (IPv4, IPv6): the entries as written when nothing is left out, else what is
    /// left, as ranges.
    pub entries: [Vec<String>; 2],
    /// Why addresses are left out, once per pool; empty when none is.
    pub withheld: Vec<String>,
}

/// What of `owner`'s declared `entries` (per family) to reserve: never an address in a pool its
/// pods may not use (admission refuses such a list; this is for one that got past it: the
/// webhook down, the list older than the check, the pool or namespace changed since), and of
/// an invalid pool's addresses only what `kept` reserves for it already, so that neither a
/// list nor a pool that is not valid ever makes more addresses reserved than before.
pub fn reservable(
    owner: &For,
    entries: &[Vec<String>; 2],
    pools: &[Judged],
    kept: &[Kept],
) -> Reservable {
    let mut out = Reservable::default();
    for (i, family) in [IpFamily::V4, IpFamily::V6].into_iter().enumerate() {
        let declared = AddrSet::parse_entries_lenient(family, &entries[i]).0;
        let name = owner.reservation_name(family);
        let already = kept
            .iter()
            .find(|k| k.name == name && &k.owner == owner && !k.deleting)
            .and_then(|k| k.ips.clone())
            .unwrap_or_else(|| AddrSet::empty(family));
        let mut withheld = AddrSet::empty(family);
        for pool in pools.iter().filter(|p| p.addresses.family() == family) {
            let inside = declared.intersection(pool.addresses);
            let (left_out, why) = match &pool.tenancy {
                Tenancy::Usable => continue,
                Tenancy::Barred(barred) => {
                    let why = barred_message(&inside, pool.name, barred, owner);
                    (inside, why)
                }
                Tenancy::Unknown(error) => {
                    let left_out = inside.difference(&already);
                    let why = format!(
                        "{} in IPPool {}, which is not valid ({error}): whether pods of {} {}/{} \
                         may use it cannot be told, so only what was reserved before stays \
                         reserved; correct the pool",
                        shown(&left_out),
                        pool.name,
                        owner.kind,
                        owner.namespace,
                        owner.name
                    );
                    (left_out, why)
                }
            };
            if left_out.is_empty() {
                continue;
            }
            out.withheld.push(format!("not reserved: {why}"));
            withheld = withheld.union(&left_out);
        }
        out.entries[i] = if withheld.is_empty() {
            entries[i].clone()
        } else {
            declared.difference(&withheld).to_entries()
        };
    }
    out
}

#[cfg(test)]
mod tests;
