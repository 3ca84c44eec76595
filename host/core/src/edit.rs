//! Whether an edit of an IPPool, Subnet or ReservedIP may be stored: the checks across objects
//! and claims that the admission webhook runs before an object reaches the API, on top of the
//! checks of one object (`from_spec`) that every loader runs.
//!
//! What users expect (Spiderpool's IPPool webhook does the same): `subnet` and `ipVersion` are
//! immutable; subnets of one family are identical or disjoint and no address belongs to two
//! pools (core's [`conflict`], the same test the agent's reconcile leaves a new pool out by); an
//! address in use stays in its pool (not removed from `ips`, not added to `excludeIPs`, not made
//! the gateway); a pool that holds addresses is not deleted; a pool carved from a Subnet fits
//! inside it.
//!
//! Pure: the caller reads the objects and the claims ([`Existing`]).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;

use ipnet::IpNet;

use crate::addr::{AddrSet, IpFamily};
use crate::pool::{Pool, Reserved, SpecError, Subnet, conflict};
use crate::spec::{IpPoolSpec, SubnetSpec, auto_pool_labels::OWNER_SUBNET};
use crate::store::Claim;

/// How many addresses or holders one message names before it says how many more there are.
const SHOWN: usize = 3;

/// The addresses claimed from one pool, and who holds each.
#[derive(Clone, Debug)]
pub struct Held {
    v4: AddrSet,
    v6: AddrSet,
    holders: HashMap<IpAddr, Holder>,
}

/// Who holds a claimed address, formatted only when a message names it.
#[derive(Clone, Debug)]
enum Holder {
    Pod { namespace: String, name: String },
    Quarantined { mac: String },
}

impl std::fmt::Display for Holder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Holder::Pod { namespace, name } => write!(f, "{namespace}/{name}"),
            Holder::Quarantined { mac } => write!(f, "quarantined: host {mac} answered for it"),
        }
    }
}

impl Held {
    /// How many addresses are claimed.
    pub fn count(&self) -> usize {
        self.holders.len()
    }

    /// The claimed addresses of one family.
    pub fn of(&self, family: IpFamily) -> &AddrSet {
        match family {
            IpFamily::V4 => &self.v4,
            IpFamily::V6 => &self.v6,
        }
    }

    /// "10.0.0.5 (web/web-0), 10.0.0.6 (web/web-1), … 4 more": the holders of `addresses`.
    pub fn describe(&self, addresses: &AddrSet) -> String {
        let total = addresses.len();
        let mut shown: Vec<String> = addresses
            .iter()
            .take(SHOWN)
            .map(|a| match self.holders.get(&a) {
                Some(holder) => format!("{a} ({holder})"),
                None => a.to_string(),
            })
            .collect();
        if total > SHOWN as u64 {
            shown.push(format!("… {} more", total - SHOWN as u64));
        }
        shown.join(", ")
    }

    /// [`Held::describe`] of every claimed address (of both families: a pool holds one, a
    /// second one is a leftover worth showing too).
    pub fn describe_all(&self) -> String {
        [&self.v4, &self.v6]
            .into_iter()
            .filter(|set| !set.is_empty())
            .map(|set| self.describe(set))
            .collect::<Vec<_>>()
            .join("; ")
    }
}

/// The claims grouped by the pool they were taken from (taken, not copied: a cluster's claims
/// are many).
pub fn held_by_pool(claims: impl IntoIterator<Item = Claim>) -> BTreeMap<String, Held> {
    let mut by_pool: HashMap<String, HashMap<IpAddr, Holder>> = HashMap::new();
    for claim in claims {
        let holder = if claim.pod.is_conflict() {
            Holder::Quarantined {
                mac: claim.pod.name,
            }
        } else {
            Holder::Pod {
                namespace: claim.pod.namespace,
                name: claim.pod.name,
            }
        };
        by_pool
            .entry(claim.pool)
            .or_default()
            .insert(claim.address, holder);
    }
    by_pool
        .into_iter()
        .map(|(pool, holders)| {
            let set = |family| AddrSet::from_addresses(family, holders.keys().copied());
            let held = Held {
                v4: set(IpFamily::V4),
                v6: set(IpFamily::V6),
                holders,
            };
            (pool, held)
        })
        .collect()
}

/// What an edit is judged against: the objects stored now that are valid (an invalid one serves
/// nowhere, so nothing can overlap it) and every claim.
#[derive(Clone, Debug, Default)]
pub struct Existing {
    pub pools: Vec<Pool>,
    pub subnets: Vec<Subnet>,
    pub held: BTreeMap<String, Held>,
}

impl Existing {
    fn held(&self, pool: &str) -> Option<&Held> {
        self.held.get(pool).filter(|h| h.count() > 0)
    }

    /// The valid pools carved from Subnet `subnet` (labelled with it).
    fn carved_from<'a>(&'a self, subnet: &'a str) -> impl Iterator<Item = &'a Pool> + 'a {
        self.pools
            .iter()
            .filter(move |p| p.meta.labels.get(OWNER_SUBNET).map(String::as_str) == Some(subnet))
    }
}

/// Why an edit is refused. Each message names what is wrong, what it collides with, and what to
/// do instead.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// The object itself is not valid (`from_spec`).
    #[error("{0}")]
    Invalid(SpecError),
    #[error(
        "{kind} {name}: {field} is immutable ({old} → {new}): addresses of it may be in use; to use another {field}, create another {kind}"
    )]
    Immutable {
        kind: &'static str,
        name: String,
        field: &'static str,
        old: String,
        new: String,
    },
    /// Another pool shares addresses or an overlapping subnet ([`conflict`]'s errors).
    #[error("{0}")]
    Overlap(SpecError),
    #[error(
        "Subnet {name}: subnet {subnet} overlaps subnet {other_subnet} of Subnet {other}: subnets of one family must be identical or disjoint"
    )]
    SubnetOverlap {
        name: String,
        subnet: String,
        other: String,
        other_subnet: String,
    },
    #[error(
        "Subnet {name}: addresses {overlap} are also in Subnet {other}: Subnets must not share addresses"
    )]
    SubnetAddressOverlap {
        name: String,
        other: String,
        overlap: String,
    },
    #[error(
        "IPPool {name}: this edit {how}, but they are in use: {holders}; delete or move the pods holding them first, or keep these addresses in the pool"
    )]
    InUse {
        name: String,
        how: String,
        holders: String,
    },
    #[error(
        "IPPool {name}: addresses {holders} are held by claims of IPPool {other}: a pool must not offer addresses another pool's pods hold; release them first"
    )]
    ClaimedElsewhere {
        name: String,
        other: String,
        holders: String,
    },
    #[error("IPPool {name} is carved from Subnet {subnet} (label {OWNER_SUBNET}), but {problem}")]
    NotInSubnet {
        name: String,
        subnet: String,
        problem: String,
    },
    #[error(
        "Subnet {name}: IPPool {pool} is carved from it and offers {addresses}, which this edit takes out of the Subnet: shrink or delete that pool first"
    )]
    SubnetShrinks {
        name: String,
        pool: String,
        addresses: String,
    },
    #[error(
        "IPPool {name} holds {count} address(es): {holders}. Set `disable: true` to stop new allocations, delete or move the pods holding them (`allotctl --store kubernetes claims list` shows every holder), then delete the pool"
    )]
    PoolHolds {
        name: String,
        count: usize,
        holders: String,
    },
    #[error(
        "Subnet {name}: pools carved from it hold addresses ({pools}): scale down or delete the applications using them first"
    )]
    SubnetHolds { name: String, pools: String },
}

/// The checks of a created (`old` is `None`) or edited IPPool `new`, already checked by
/// `Pool::from_spec`, against everything else that exists.
pub fn check_pool(old: Option<&IpPoolSpec>, new: &Pool, existing: &Existing) -> Vec<Refusal> {
    let name = new.name();
    let mut refusals = Vec::new();
    if let Some(old) = old {
        refusals.extend(immutables(
            "IPPool",
            name,
            (&old.subnet, old.ip_version),
            (&new.subnet, new.family),
        ));
        if let Some(held) = existing.held(name)
            && let Some(r) = taken_out(old, new, held)
        {
            refusals.push(r);
        }
    }
    let mut overlapping = BTreeSet::new();
    for other in existing.pools.iter().filter(|p| p.name() != name) {
        if let Some(e) = conflict(new, other) {
            overlapping.insert(other.name());
            refusals.push(Refusal::Overlap(e));
        }
    }
    let offered = new.allocatable();
    for (other, held) in &existing.held {
        if other == name || overlapping.contains(other.as_str()) {
            continue;
        }
        let theirs = held.of(new.family).intersection(&offered);
        if !theirs.is_empty() {
            refusals.push(Refusal::ClaimedElsewhere {
                name: name.to_string(),
                other: other.clone(),
                holders: held.describe(&theirs),
            });
        }
    }
    if let Some(subnet) = new.meta.labels.get(OWNER_SUBNET)
        && let Some(problem) = fits_subnet(new, subnet, existing)
    {
        refusals.push(Refusal::NotInSubnet {
            name: name.to_string(),
            subnet: subnet.clone(),
            problem,
        });
    }
    refusals
}

/// The addresses in use that an edit of a pool would take out of it, and how.
fn taken_out(old: &IpPoolSpec, new: &Pool, held: &Held) -> Option<Refusal> {
    let claimed = held.of(new.family);
    // Only what the old version offered: an address already outside the pool (claimed before the
    // webhook was there) does not block unrelated edits. An old version that is not valid
    // offered nothing certain, so every claimed address counts.
    let offered_before = match Pool::from_spec(new.meta.clone(), old.clone()) {
        Ok(p) => claimed.intersection(&p.allocatable()),
        Err(_) => claimed.clone(),
    };
    let lost = offered_before.difference(&new.allocatable());
    if lost.is_empty() {
        return None;
    }
    let entries = |set: &AddrSet| shown(&set.to_entries());
    let mut how = Vec::new();
    let removed = lost.difference(&new.ips);
    if !removed.is_empty() {
        how.push(format!("removes {} from ips", entries(&removed)));
    }
    let excluded = lost.intersection(&new.excluded);
    if !excluded.is_empty() {
        how.push(format!("adds {} to excludeIPs", entries(&excluded)));
    }
    if let Some(gw) = new.gateway.filter(|gw| lost.contains(*gw)) {
        how.push(format!("makes {gw} the gateway"));
    }
    if how.is_empty() {
        how.push(format!(
            "leaves {} as the subnet's network or broadcast address",
            entries(&lost)
        ));
    }
    Some(Refusal::InUse {
        name: new.name().to_string(),
        how: how.join(" and "),
        holders: held.describe(&lost),
    })
}

/// What a Subnet offers the pools carved from it: `ips` minus `excludeIPs` minus its gateway.
pub fn subnet_offers(subnet: &Subnet) -> AddrSet {
    // Both parsed in `Subnet::from_spec` already.
    let excluded = AddrSet::parse_entries(subnet.family, &subnet.spec.exclude_ips)
        .unwrap_or_else(|_| AddrSet::empty(subnet.family));
    let mut offers = subnet.ips.difference(&excluded);
    if let Some(gw) = subnet
        .spec
        .gateway
        .as_deref()
        .and_then(|g| g.trim().parse().ok())
    {
        offers.remove(gw);
    }
    offers
}

fn fits_subnet(pool: &Pool, subnet: &str, existing: &Existing) -> Option<String> {
    let Some(s) = existing.subnets.iter().find(|s| s.meta.name == subnet) else {
        return Some(format!(
            "Subnet {subnet} does not exist or is not valid (kubectl get subnet {subnet})"
        ));
    };
    if s.subnet != pool.subnet {
        return Some(format!(
            "its subnet {} is not the Subnet's {}",
            pool.subnet, s.subnet
        ));
    }
    let outside = pool.allocatable().difference(&subnet_offers(s));
    (!outside.is_empty()).then(|| {
        format!(
            "it offers {}, which the Subnet does not (not in its ips, excluded, or its gateway)",
            shown(&outside.to_entries())
        )
    })
}

/// Whether IPPool `name` may be deleted: not while it holds addresses.
pub fn check_pool_deletion(name: &str, existing: &Existing) -> Vec<Refusal> {
    existing
        .held(name)
        .map(|held| Refusal::PoolHolds {
            name: name.to_string(),
            count: held.count(),
            holders: held.describe_all(),
        })
        .into_iter()
        .collect()
}

/// The checks of a created or edited Subnet `new`, already checked by `Subnet::from_spec`.
pub fn check_subnet(old: Option<&SubnetSpec>, new: &Subnet, existing: &Existing) -> Vec<Refusal> {
    let name = new.meta.name.as_str();
    let mut refusals = Vec::new();
    for other in existing.subnets.iter().filter(|s| s.meta.name != name) {
        refusals.extend(subnet_conflict(new, other));
    }
    let Some(old) = old else {
        return refusals;
    };
    refusals.extend(immutables(
        "Subnet",
        name,
        (&old.subnet, old.ip_version),
        (&new.subnet, new.family),
    ));
    let offers = subnet_offers(new);
    let offered_before = Subnet::from_spec(new.meta.clone(), old.clone())
        .ok()
        .map(|s| subnet_offers(&s));
    for pool in existing.carved_from(name) {
        let mut outside = pool.allocatable().difference(&offers);
        if let Some(before) = &offered_before {
            // Only what this edit takes out, not what was outside already.
            outside = outside.intersection(before);
        }
        if !outside.is_empty() {
            refusals.push(Refusal::SubnetShrinks {
                name: name.to_string(),
                pool: pool.name().to_string(),
                addresses: shown(&outside.to_entries()),
            });
        }
    }
    refusals
}

/// Whether Subnet `name` may be deleted: not while pools carved from it hold addresses (pools
/// that hold none may go with it).
pub fn check_subnet_deletion(name: &str, existing: &Existing) -> Vec<Refusal> {
    let holding: Vec<String> = existing
        .carved_from(name)
        .filter_map(|p| existing.held(p.name()).map(|h| (p.name(), h.count())))
        .map(|(pool, count)| format!("{pool}: {count}"))
        .collect();
    if holding.is_empty() {
        return Vec::new();
    }
    vec![Refusal::SubnetHolds {
        name: name.to_string(),
        pools: shown(&holding),
    }]
}

/// What to tell whoever reserves addresses that are in use: they stay with their pods and are
/// not handed out again once released. Not a refusal: reserving is how an address is kept from
/// coming back, and the holder keeps it until then.
pub fn reserved_in_use(reserved: &Reserved, existing: &Existing) -> Vec<String> {
    existing
        .held
        .iter()
        .filter_map(|(pool, held)| {
            let in_use = held.of(reserved.family).intersection(&reserved.ips);
            (!in_use.is_empty()).then(|| {
                format!(
                    "ReservedIP {}: {} of IPPool {pool} in use; each stays with its pod and is not handed out again once released",
                    reserved.meta.name,
                    held.describe(&in_use)
                )
            })
        })
        .collect()
}

/// The `ipVersion` to default a pool or subnet to: the family of its subnet, but only when the
/// object is valid as it is (so a default never makes an invalid object valid) and says none.
pub fn default_version_pool(pool: &Result<Pool, SpecError>) -> Option<u8> {
    match pool {
        Ok(p) if p.spec.ip_version.is_none() => Some(p.family.version()),
        _ => None,
    }
}

/// As [`default_version_pool`], for a Subnet.
pub fn default_version_subnet(subnet: &Result<Subnet, SpecError>) -> Option<u8> {
    match subnet {
        Ok(s) if s.spec.ip_version.is_none() => Some(s.family.version()),
        _ => None,
    }
}

/// As [`default_version_pool`], for a ReservedIP (valid only when every entry is of the family
/// of the first).
pub fn default_version_reserved(
    reserved: &Result<Reserved, SpecError>,
    declared: Option<u8>,
) -> Option<u8> {
    match reserved {
        Ok(r) if declared.is_none() => Some(r.family.version()),
        _ => None,
    }
}

fn immutables(
    kind: &'static str,
    name: &str,
    (old_subnet, old_version): (&str, Option<u8>),
    (new_subnet, new_family): (&IpNet, IpFamily),
) -> Vec<Refusal> {
    let mut refusals = Vec::new();
    let changed = |field, old: String, new: String| Refusal::Immutable {
        kind,
        name: name.to_string(),
        field,
        old,
        new,
    };
    // Compared as networks: 10.0.0.1/24 still means 10.0.0.0/24. An old subnet that does not
    // parse held no valid pool, so any subnet may replace it.
    let old_net = old_subnet.trim().parse::<IpNet>().ok().map(|n| n.trunc());
    if let Some(old_net) = old_net
        && old_net != *new_subnet
    {
        refusals.push(changed(
            "subnet",
            old_net.to_string(),
            new_subnet.to_string(),
        ));
    }
    let old_family = old_version
        .and_then(IpFamily::from_version)
        .or(old_net.as_ref().map(IpFamily::of_net));
    if let Some(old_family) = old_family
        && old_family != new_family
    {
        refusals.push(changed(
            "ipVersion",
            old_family.version().to_string(),
            new_family.version().to_string(),
        ));
    }
    refusals
}

fn subnet_conflict(subnet: &Subnet, other: &Subnet) -> Option<Refusal> {
    if subnet.family != other.family {
        return None;
    }
    let (a, b) = (&subnet.subnet, &other.subnet);
    if a != b && (a.contains(&b.network()) || b.contains(&a.network())) {
        return Some(Refusal::SubnetOverlap {
            name: subnet.meta.name.clone(),
            subnet: a.to_string(),
            other: other.meta.name.clone(),
            other_subnet: b.to_string(),
        });
    }
    let overlap = subnet.ips.intersection(&other.ips);
    (!overlap.is_empty()).then(|| Refusal::SubnetAddressOverlap {
        name: subnet.meta.name.clone(),
        other: other.meta.name.clone(),
        overlap: shown(&overlap.to_entries()),
    })
}

/// The first few of `items`, then how many more.
fn shown(items: &[String]) -> String {
    let mut out: Vec<String> = items.iter().take(SHOWN).cloned().collect();
    if items.len() > SHOWN {
        out.push(format!("… {} more", items.len() - SHOWN));
    }
    out.join(", ")
}
