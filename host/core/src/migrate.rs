//! Carrying a running cluster over from another IPAM (Spiderpool, Whereabouts) without
//! renumbering: from what that IPAM records (its pools, reservations, subnets and allocations)
//! and what the pods show, to allot's objects and claims, or the reasons it cannot be done.
//!
//! Pure: the caller reads the peer's objects (`allotctl migrate` decodes them into
//! [`PeerPool`]s and [`Record`]s), the live pods and what allot holds already ([`Current`]),
//! and writes what [`plan`] returns, in the order that keeps every address safe: reservations,
//! Subnets, claims, Endpoints, and the pools last, so that no pool can hand out an address a
//! running pod holds before its claim exists. Planning against what was written already is how
//! a second run finds nothing to do and an interrupted one finishes.
//!
//! What is refused ([`Refusal`], each naming the objects): an object allot's checks refuse (the
//! same `from_spec` every loader runs), pools that overlap each other or allot's pools, an
//! address held by two pods, an address allot already gave to another pod, a name allot uses
//! for something else. One refusal and nothing is planned: a partial migration could make a
//! pool serve addresses whose holders were not carried over.
//!
//! A migrated claim names its pod (namespace, name, UID, owner) and interface as the peer
//! recorded them, and no node: no agent made it, so no node's CNI GC judges it; the
//! controller's GC releases it when its pod is gone, by the same table as every claim. Its
//! sandbox (container ID) is the peer's record where it keeps one (Whereabouts), else
//! `migrated:<peer>:<pod UID>`: a StatefulSet pod started again takes the address back through
//! the engine's take-over of an older sandbox, as after any restart.

mod claims;
mod holders;
pub mod whereabouts;

#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::net::IpAddr;

use crate::addr::AddrSet;
use crate::pool::{Pool, Reserved, SpecError, Subnet, conflict};
use crate::spec::{IpPoolSpec, ObjectMeta, ReservedIpSpec, RouteSpec, SubnetSpec};
use crate::store::Claim;

pub use holders::{Holder, holders_of};

/// The interface a record that names none is taken to be on: the pod's first, as runtimes
/// name it.
pub const DEFAULT_INTERFACE: &str = "eth0";

/// Which IPAM a cluster is carried over from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Peer {
    Spiderpool,
    Whereabouts,
}

impl Peer {
    pub fn as_str(self) -> &'static str {
        match self {
            Peer::Spiderpool => "spiderpool",
            Peer::Whereabouts => "whereabouts",
        }
    }
}

/// The sandbox a migrated claim records when the peer kept none: `migrated:<peer>:<uid>`
/// (colons never appear in a runtime's container IDs, so no DEL ever matches it by chance).
pub fn migrated_sandbox(peer: Peer, uid_or_name: &str) -> String {
    format!("migrated:{}:{uid_or_name}", peer.as_str())
}

/// Whether a claim's sandbox is one [`migrated_sandbox`] made.
pub fn is_migrated_sandbox(container_id: &str) -> bool {
    container_id.starts_with("migrated:")
}

/// A pod's top-level controller.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Owner {
    pub kind: String,
    pub name: String,
}

/// A pool of the peer's, in allot's shape.
#[derive(Clone, Debug)]
pub struct PeerPool {
    /// The peer's object, for messages: `SpiderIPPool sp-v4`.
    pub source: String,
    /// The IPPool's name in allot. Several peer pools may map to one (a Spiderpool auto pool
    /// per interface becomes one allot auto pool per Subnet): their `ips` are joined.
    pub name: String,
    pub labels: BTreeMap<String, String>,
    /// The spec, or why the peer's object cannot be read as one.
    pub spec: Result<IpPoolSpec, String>,
}

/// Another object of the peer's (a Subnet, a reservation), in allot's shape.
#[derive(Clone, Debug)]
pub struct PeerObject<S> {
    pub source: String,
    pub name: String,
    pub spec: Result<S, String>,
}

/// One record of the peer's that `address` is held for a pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    pub address: IpAddr,
    /// The allot pool the address belongs to; `None` when the record does not say.
    pub pool: Option<String>,
    /// The CNI network (its configuration's `name`), where the peer knows it.
    pub network: String,
    pub namespace: String,
    pub name: String,
    /// The pod's UID as recorded (Whereabouts records none).
    pub uid: Option<String>,
    pub interface: Option<String>,
    /// The sandbox, where the peer records it.
    pub container_id: Option<String>,
    /// The pod's top-level controller, where recorded (SpiderEndpoint).
    pub owner: Option<Owner>,
    /// What says so, for messages: `SpiderIPPool sp-v4 status.allocatedIPs`.
    pub source: String,
}

/// A pod's address and the interface it is on, where known.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodAddress {
    pub address: IpAddr,
    pub interface: Option<String>,
}

/// A pod as the API shows it now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LivePod {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub node: String,
    pub owner: Option<Owner>,
    /// `status.podIPs` and the Multus network status.
    pub addresses: Vec<PodAddress>,
    /// Whether it holds its addresses: not finished (Succeeded, Failed), not on the host
    /// network (whose address is the node's).
    pub holds: bool,
}

/// An allot object as stored now (`None`: it cannot be read).
#[derive(Clone, Debug)]
pub struct CurrentObject<S> {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub spec: Option<S>,
}

/// What allot holds already.
#[derive(Clone, Debug, Default)]
pub struct Current {
    pub pools: Vec<CurrentObject<IpPoolSpec>>,
    pub subnets: Vec<CurrentObject<SubnetSpec>>,
    pub reserved: Vec<CurrentObject<ReservedIpSpec>>,
    pub claims: Vec<Claim>,
}

/// Everything one plan is made from.
pub struct Inputs<'a> {
    pub peer: Peer,
    pub pools: &'a [PeerPool],
    pub subnets: &'a [PeerObject<SubnetSpec>],
    pub reserved: &'a [PeerObject<ReservedIpSpec>],
    pub records: &'a [Record],
    /// Objects of the peer's that could not be decoded, and why: each is a refusal.
    pub unreadable: &'a [(String, String)],
    pub pods: &'a [LivePod],
    pub current: &'a Current,
    /// Unix seconds, the claims' `updated_at`.
    pub now: u64,
}

/// One object to write, or found written already.
#[derive(Clone, Debug, PartialEq)]
pub struct Write<S> {
    /// The peer's objects it comes from.
    pub sources: Vec<String>,
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub spec: S,
    /// Already stored as planned (by an earlier run).
    pub exists: bool,
}

/// A pod's allot Endpoint, as the agent would have written it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EndpointRecord {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub node: String,
    pub owner: Option<Owner>,
    pub interfaces: Vec<EndpointNic>,
}

/// One interface of an [`EndpointRecord`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EndpointNic {
    pub ifname: String,
    /// The address with its pool's prefix length (`10.0.0.7/24`).
    pub ipv4: Option<String>,
    pub ipv6: Option<String>,
    pub pools: Vec<String>,
    pub gateways: Vec<String>,
    pub routes: Vec<RouteSpec>,
}

/// What a migration writes, in order.
#[derive(Clone, Debug, Default)]
pub struct Plan {
    pub reserved: Vec<Write<ReservedIpSpec>>,
    pub subnets: Vec<Write<SubnetSpec>>,
    /// Claims to create.
    pub claims: Vec<Claim>,
    /// Addresses claimed for their pods already (by an earlier run, or by allot itself).
    pub claimed: Vec<IpAddr>,
    /// The Endpoint of every live pod holding a migrated address (the caller writes those that
    /// differ from what is stored).
    pub endpoints: Vec<EndpointRecord>,
    pub pools: Vec<Write<IpPoolSpec>>,
    /// What the operator should know: addresses claimed without a record of the peer's,
    /// records outside every pool.
    pub notes: Vec<String>,
}

impl Plan {
    /// Whether every object and claim is in place already (Endpoints aside: the caller
    /// compares those with the stored ones).
    pub fn objects_done(&self) -> bool {
        self.claims.is_empty()
            && self.reserved.iter().all(|w| w.exists)
            && self.subnets.iter().all(|w| w.exists)
            && self.pools.iter().all(|w| w.exists)
    }
}

/// Why (part of) a cluster cannot be carried over. Each names the objects involved and what to
/// do.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("{object} cannot be read: {why}")]
    Unreadable { object: String, why: String },
    #[error("{object} is refused by allot's checks: {error}")]
    Invalid { object: String, error: SpecError },
    #[error(
        "{object} overlaps {other}: {detail}; allot keeps every address in one pool: make them disjoint first"
    )]
    Overlap {
        object: String,
        other: String,
        detail: String,
    },
    #[error(
        "{object} would become {kind} {name}, but allot has a {kind} {name} with another spec: rename or delete one first"
    )]
    NameTaken {
        object: String,
        kind: &'static str,
        name: String,
    },
    #[error(
        "address {address} is held by more than one pod: {holders}; delete all but one holder (or fix the peer's records) first"
    )]
    TwoHolders { address: IpAddr, holders: String },
    #[error(
        "address {address} is already claimed in allot by {holder}, but {object} gives it to {pod}: release one first (allotctl --store kubernetes claims list shows allot's holder)"
    )]
    ClaimedByOther {
        address: IpAddr,
        holder: String,
        object: String,
        pod: String,
    },
}

/// Plans the migration of what `inputs` describe, or says why it cannot be done.
pub fn plan(inputs: &Inputs) -> Result<Plan, Vec<Refusal>> {
    let mut refusals: Vec<Refusal> = inputs
        .unreadable
        .iter()
        .map(|(object, why)| unreadable(object, why))
        .collect();
    let mut plan = Plan {
        reserved: plan_reserved(inputs, &mut refusals),
        subnets: plan_subnets(inputs, &mut refusals),
        ..Plan::default()
    };
    let pools = plan_pools(inputs, &mut refusals);
    let checked: Vec<Pool> = pools
        .iter()
        .filter_map(|w| Pool::from_spec(meta(&w.name, &w.labels), w.spec.clone()).ok())
        .collect();
    plan.pools = pools;
    claims::plan_claims(inputs, &checked, &mut plan, &mut refusals);
    if refusals.is_empty() {
        Ok(plan)
    } else {
        Err(refusals)
    }
}

fn meta(name: &str, labels: &BTreeMap<String, String>) -> ObjectMeta {
    ObjectMeta {
        name: name.to_string(),
        labels: labels.clone(),
        ..ObjectMeta::default()
    }
}

fn plan_reserved(inputs: &Inputs, refusals: &mut Vec<Refusal>) -> Vec<Write<ReservedIpSpec>> {
    let mut out = Vec::new();
    for r in inputs.reserved {
        let spec = match &r.spec {
            Ok(spec) => spec.clone(),
            Err(why) => {
                refusals.push(unreadable(&r.source, why));
                continue;
            }
        };
        let checked = match Reserved::from_spec(meta(&r.name, &BTreeMap::new()), spec.clone()) {
            Ok(checked) => checked,
            Err(error) => {
                refusals.push(invalid(&r.source, error));
                continue;
            }
        };
        let spec = ReservedIpSpec {
            ip_version: Some(checked.family.version()),
            ..spec
        };
        let exists = same_as_current(
            &inputs.current.reserved,
            "ReservedIP",
            &r.source,
            &r.name,
            &BTreeMap::new(),
            |stored| stored.ips == spec.ips,
            refusals,
        );
        out.push(Write {
            sources: vec![r.source.clone()],
            name: r.name.clone(),
            labels: BTreeMap::new(),
            spec,
            exists,
        });
    }
    out
}

fn plan_subnets(inputs: &Inputs, refusals: &mut Vec<Refusal>) -> Vec<Write<SubnetSpec>> {
    let mut out: Vec<(Write<SubnetSpec>, Subnet)> = Vec::new();
    for s in inputs.subnets {
        let spec = match &s.spec {
            Ok(spec) => spec.clone(),
            Err(why) => {
                refusals.push(unreadable(&s.source, why));
                continue;
            }
        };
        let checked = match Subnet::from_spec(meta(&s.name, &BTreeMap::new()), spec.clone()) {
            Ok(checked) => checked,
            Err(error) => {
                refusals.push(invalid(&s.source, error));
                continue;
            }
        };
        let spec = SubnetSpec {
            ip_version: Some(checked.family.version()),
            ..spec
        };
        let others = out.iter().map(|(w, s)| (w.sources[0].clone(), s.clone()));
        let current = inputs
            .current
            .subnets
            .iter()
            .filter(|c| c.name != s.name)
            .filter_map(|c| {
                let spec = c.spec.clone()?;
                let subnet = Subnet::from_spec(meta(&c.name, &c.labels), spec).ok()?;
                Some((format!("allot's Subnet {}", c.name), subnet))
            });
        for (other, subnet) in others.chain(current).collect::<Vec<_>>() {
            if let Some(detail) = subnets_overlap(&checked, &subnet) {
                refusals.push(Refusal::Overlap {
                    object: s.source.clone(),
                    other,
                    detail,
                });
            }
        }
        let exists = same_as_current(
            &inputs.current.subnets,
            "Subnet",
            &s.source,
            &s.name,
            &BTreeMap::new(),
            |stored| normalized_subnet(stored) == spec,
            refusals,
        );
        out.push((
            Write {
                sources: vec![s.source.clone()],
                name: s.name.clone(),
                labels: BTreeMap::new(),
                spec,
                exists,
            },
            checked,
        ));
    }
    out.into_iter().map(|(w, _)| w).collect()
}

/// A stored Subnet's spec with the `ipVersion` its subnet says (the mutating webhook fills it
/// in), to compare with a planned one.
fn normalized_subnet(stored: &SubnetSpec) -> SubnetSpec {
    let mut spec = stored.clone();
    if spec.ip_version.is_none()
        && let Ok(net) = spec.subnet.trim().parse::<ipnet::IpNet>()
    {
        spec.ip_version = Some(crate::addr::IpFamily::of_net(&net).version());
    }
    spec
}

fn normalized_pool(stored: &IpPoolSpec) -> IpPoolSpec {
    let mut spec = stored.clone();
    if spec.ip_version.is_none()
        && let Ok(net) = spec.subnet.trim().parse::<ipnet::IpNet>()
    {
        spec.ip_version = Some(crate::addr::IpFamily::of_net(&net).version());
    }
    spec
}

fn subnets_overlap(a: &Subnet, b: &Subnet) -> Option<String> {
    if a.family != b.family {
        return None;
    }
    if a.subnet != b.subnet
        && (a.subnet.contains(&b.subnet.network()) || b.subnet.contains(&a.subnet.network()))
    {
        return Some(format!(
            "subnets {} and {} overlap without being equal",
            a.subnet, b.subnet
        ));
    }
    let shared = a.ips.intersection(&b.ips);
    (!shared.is_empty()).then(|| format!("both list {}", shown(&shared)))
}

/// Whether an object of that name is stored already exactly as planned; a refusal when it is
/// stored otherwise.
fn same_as_current<S>(
    current: &[CurrentObject<S>],
    kind: &'static str,
    source: &str,
    name: &str,
    labels: &BTreeMap<String, String>,
    equal: impl Fn(&S) -> bool,
    refusals: &mut Vec<Refusal>,
) -> bool {
    let Some(stored) = current.iter().find(|c| c.name == name) else {
        return false;
    };
    let labels_kept = labels.iter().all(|(k, v)| stored.labels.get(k) == Some(v));
    if stored.spec.as_ref().is_some_and(&equal) && labels_kept {
        return true;
    }
    refusals.push(Refusal::NameTaken {
        object: source.to_string(),
        kind,
        name: name.to_string(),
    });
    false
}

fn plan_pools(inputs: &Inputs, refusals: &mut Vec<Refusal>) -> Vec<Write<IpPoolSpec>> {
    // Peer pools that become one allot pool are joined first (their `ips` united).
    let mut joined: Vec<Write<IpPoolSpec>> = Vec::new();
    for p in inputs.pools {
        let spec = match &p.spec {
            Ok(spec) => spec.clone(),
            Err(why) => {
                refusals.push(unreadable(&p.source, why));
                continue;
            }
        };
        match joined.iter_mut().find(|w| w.name == p.name) {
            None => joined.push(Write {
                sources: vec![p.source.clone()],
                name: p.name.clone(),
                labels: p.labels.clone(),
                spec,
                exists: false,
            }),
            Some(w) => {
                let same_but_ips = IpPoolSpec {
                    ips: w.spec.ips.clone(),
                    ..spec.clone()
                } == w.spec;
                if !same_but_ips {
                    refusals.push(Refusal::Overlap {
                        object: p.source.clone(),
                        other: w.sources.join(", "),
                        detail: format!(
                            "both become IPPool {} but differ in more than their ips",
                            p.name
                        ),
                    });
                    continue;
                }
                w.sources.push(p.source.clone());
                w.spec.ips.extend(spec.ips);
            }
        }
    }
    let mut out: Vec<(Write<IpPoolSpec>, Pool)> = Vec::new();
    for mut w in joined {
        let source = w.sources.join(", ");
        let mut pool = match Pool::from_spec(meta(&w.name, &w.labels), w.spec.clone()) {
            Ok(pool) => pool,
            Err(error) => {
                refusals.push(invalid(&source, error));
                continue;
            }
        };
        if w.sources.len() > 1 {
            // Joined entries as ranges, so that the stored spec is the same on every run.
            w.spec.ips = pool.ips.to_entries();
        }
        w.spec.ip_version = Some(pool.family.version());
        pool.spec = w.spec.clone();
        let mut others: Vec<(String, Pool)> = out
            .iter()
            .map(|(o, p)| (o.sources.join(", "), p.clone()))
            .collect();
        others.extend(
            inputs
                .current
                .pools
                .iter()
                .filter(|c| c.name != w.name)
                .filter_map(|c| {
                    let spec = c.spec.clone()?;
                    let pool = Pool::from_spec(meta(&c.name, &c.labels), spec).ok()?;
                    Some((format!("allot's IPPool {}", c.name), pool))
                }),
        );
        for (other, p) in others {
            if let Some(e) = conflict(&pool, &p) {
                refusals.push(Refusal::Overlap {
                    object: source.clone(),
                    other,
                    detail: e.to_string(),
                });
            }
        }
        w.exists = same_as_current(
            &inputs.current.pools,
            "IPPool",
            &source,
            &w.name,
            &w.labels,
            |stored| normalized_pool(stored) == w.spec,
            refusals,
        );
        out.push((w, pool));
    }
    out.into_iter().map(|(w, _)| w).collect()
}

fn unreadable(source: &str, why: &str) -> Refusal {
    Refusal::Unreadable {
        object: source.to_string(),
        why: why.to_string(),
    }
}

fn invalid(source: &str, error: SpecError) -> Refusal {
    Refusal::Invalid {
        object: source.to_string(),
        error,
    }
}

/// The first few entries of `set`.
fn shown(set: &AddrSet) -> String {
    let entries = set.to_entries();
    let mut out: Vec<String> = entries.iter().take(3).cloned().collect();
    if entries.len() > 3 {
        out.push(format!("… {} more", entries.len() - 3));
    }
    out.join(", ")
}
