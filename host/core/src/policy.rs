//! The policy seam: the data a pool-selection policy sees and the decision it returns, mirroring
//! `wit/policy.wit`, and the [`Policy`] trait that the wasmtime host implements.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use crate::addr::IpFamily;
use crate::pool::{Pool, Reserved, Subnet, reserved_set};
use crate::spec::{IpPoolSpec, RouteSpec, SubnetSpec, auto_pool_labels};

pub type Labels = BTreeMap<String, String>;

#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Application {
    pub kind: String,
    pub namespace: String,
    pub name: String,
}

/// A pool as a policy sees it: the spec plus the host's facts that change with the inventory.
#[derive(Clone, Debug)]
pub struct InventoryPool {
    pub name: String,
    pub labels: Labels,
    pub family: IpFamily,
    pub spec: IpPoolSpec,
    pub terminating: bool,
    pub total_count: u64,
    pub all_excluded: bool,
    pub all_reserved: bool,
    pub subnet_owner: Option<String>,
    pub application: Option<Application>,
}

#[derive(Clone, Debug)]
pub struct InventorySubnet {
    pub name: String,
    pub family: IpFamily,
    pub spec: SubnetSpec,
}

/// Everything that changes only when pools, subnets or reservations change. Policies receive it
/// once per generation; requests refer to pools by index into `pools`.
#[derive(Clone, Debug, Default)]
pub struct Inventory {
    pub generation: u64,
    pub pools: Vec<InventoryPool>,
    pub subnets: Vec<InventorySubnet>,
}

impl Inventory {
    /// Builds the inventory from checked objects. Pools and subnets are ordered by name so that
    /// indices, and the expansion of wildcards, are deterministic.
    pub fn build(
        generation: u64,
        pools: &[Pool],
        subnets: &[Subnet],
        reserved: &[Reserved],
    ) -> Self {
        let reserved_v4 = reserved_set(IpFamily::V4, reserved);
        let reserved_v6 = reserved_set(IpFamily::V6, reserved);
        let mut inv_pools: Vec<InventoryPool> = pools
            .iter()
            .map(|p| {
                let reserved = match p.family {
                    IpFamily::V4 => &reserved_v4,
                    IpFamily::V6 => &reserved_v6,
                };
                let facts = p.facts(reserved, 0);
                let labels = &p.meta.labels;
                let application = match (
                    labels.get(auto_pool_labels::APPLICATION_KIND),
                    labels.get(auto_pool_labels::APPLICATION_NAMESPACE),
                    labels.get(auto_pool_labels::APPLICATION_NAME),
                ) {
                    (Some(kind), Some(namespace), Some(name)) => Some(Application {
                        kind: kind.clone(),
                        namespace: namespace.clone(),
                        name: name.clone(),
                    }),
                    _ => None,
                };
                InventoryPool {
                    name: p.meta.name.clone(),
                    labels: labels.clone(),
                    family: p.family,
                    spec: p.spec.clone(),
                    terminating: p.terminating(),
                    total_count: facts.total,
                    all_excluded: facts.all_excluded,
                    all_reserved: facts.all_reserved,
                    subnet_owner: labels.get(auto_pool_labels::OWNER_SUBNET).cloned(),
                    application,
                }
            })
            .collect();
        inv_pools.sort_by(|a, b| a.name.cmp(&b.name));
        let mut inv_subnets: Vec<InventorySubnet> = subnets
            .iter()
            .map(|s| InventorySubnet {
                name: s.meta.name.clone(),
                family: s.family,
                spec: s.spec.clone(),
            })
            .collect();
        inv_subnets.sort_by(|a, b| a.name.cmp(&b.name));
        Inventory {
            generation,
            pools: inv_pools,
            subnets: inv_subnets,
        }
    }

    pub fn pool_index(&self, name: &str) -> Option<u32> {
        self.pools
            .binary_search_by(|p| p.name.as_str().cmp(name))
            .ok()
            .map(|i| i as u32)
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Owner {
    pub kind: String,
    pub name: String,
}

#[derive(Clone, Debug, Default)]
pub struct PodInfo {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub labels: Labels,
    pub annotations: Labels,
    pub owner: Option<Owner>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NamespaceInfo {
    pub name: String,
    pub labels: Labels,
    pub annotations: Labels,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeInfo {
    pub name: String,
    pub labels: Labels,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Nic {
    pub interface: String,
    /// Multus network ("namespace/name"); empty when not attached through Multus.
    pub multus_name: String,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CniDefaults {
    pub ipv4: Vec<String>,
    pub ipv6: Vec<String>,
}

#[derive(Clone, Debug, Default)]
pub struct Request {
    pub pod: PodInfo,
    pub namespace: NamespaceInfo,
    pub node: NodeInfo,
    pub nics: Vec<Nic>,
    pub cni_defaults: CniDefaults,
    /// Free addresses per pool, indexed like `Inventory::pools`.
    pub free_counts: Vec<u64>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AcquisitionRule {
    SubnetAnnotation,
    PoolAnnotation,
    NamespaceDefault,
    CniDefault,
    ClusterDefault,
    Custom,
}

impl AcquisitionRule {
    pub const ALL: [AcquisitionRule; 6] = [
        Self::SubnetAnnotation,
        Self::PoolAnnotation,
        Self::NamespaceDefault,
        Self::CniDefault,
        Self::ClusterDefault,
        Self::Custom,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::SubnetAnnotation => "subnet-annotation",
            Self::PoolAnnotation => "pool-annotation",
            Self::NamespaceDefault => "namespace-default",
            Self::CniDefault => "cni-default",
            Self::ClusterDefault => "cluster-default",
            Self::Custom => "custom",
        }
    }
}

impl fmt::Display for AcquisitionRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DropReason {
    NotFound,
    Terminating,
    Disabled,
    WrongFamily,
    NodeMismatch,
    NamespaceMismatch,
    PodMismatch,
    MultusMismatch,
    AllExcluded,
    AllReserved,
    Exhausted,
    Other,
}

impl DropReason {
    pub const ALL: [DropReason; 12] = [
        Self::NotFound,
        Self::Terminating,
        Self::Disabled,
        Self::WrongFamily,
        Self::NodeMismatch,
        Self::NamespaceMismatch,
        Self::PodMismatch,
        Self::MultusMismatch,
        Self::AllExcluded,
        Self::AllReserved,
        Self::Exhausted,
        Self::Other,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::NotFound => "not-found",
            Self::Terminating => "terminating",
            Self::Disabled => "disabled",
            Self::WrongFamily => "wrong-family",
            Self::NodeMismatch => "node-mismatch",
            Self::NamespaceMismatch => "namespace-mismatch",
            Self::PodMismatch => "pod-mismatch",
            Self::MultusMismatch => "multus-mismatch",
            Self::AllExcluded => "all-excluded",
            Self::AllReserved => "all-reserved",
            Self::Exhausted => "exhausted",
            Self::Other => "other",
        }
    }
}

impl fmt::Display for DropReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PoolRef {
    Index(u32),
    Missing(String),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Dropped {
    pub pool: PoolRef,
    pub reason: DropReason,
    pub detail: String,
}

/// The address a NIC must get in one family, as a policy named it (contract 0.3.0): honoured
/// only inside a pool of the family's `order`, never replaced by another address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AddressHint {
    /// As the policy wrote it; parsed by [`Decision::validate`].
    pub address: String,
    /// Where the policy read it, e.g. "pod annotation ipam.allot.dev/ip".
    pub source: String,
}

impl AddressHint {
    /// The address, once [`Decision::validate`] has accepted the decision.
    pub fn ip(&self) -> Option<std::net::IpAddr> {
        self.address.trim().parse().ok()
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FamilyDecision {
    pub family: IpFamily,
    pub rule: AcquisitionRule,
    pub source: String,
    pub candidates: Vec<u32>,
    pub order: Vec<u32>,
    pub dropped: Vec<Dropped>,
    /// The address this family must get (contract 0.3.0); `None`: the host picks one.
    pub address: Option<AddressHint>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NicDecision {
    pub interface: String,
    /// The policy cannot serve this NIC (e.g. the pod names a pool that does not exist): its
    /// allocation fails with this error; the other fields are empty. Other NICs are unaffected.
    pub error: Option<PolicyError>,
    pub clean_gateway: bool,
    pub routes: Vec<RouteSpec>,
    pub families: Vec<FamilyDecision>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Decision {
    pub nics: Vec<NicDecision>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PolicyErrorKind {
    /// The policy's verdict: the pod, namespace or request is malformed. Retrying won't help.
    InvalidInput,
    /// The policy's verdict: something it needs does not exist yet. Retry later.
    NotReady,
    /// The policy reported itself confused.
    Internal,
    /// The policy ran past its deadline.
    Deadline,
    /// The policy tried to use more memory than allowed.
    MemoryLimit,
    /// The policy trapped (panicked, hit `unreachable`, ...).
    Trap,
    /// The policy returned a decision that does not fit the request or inventory.
    BadOutput,
    /// The policy could not be loaded or instantiated.
    Load,
}

impl PolicyErrorKind {
    /// A fault of the policy itself, as opposed to a verdict about the input. Faults may fall
    /// back to the default policy; verdicts are passed on.
    pub fn is_fault(self) -> bool {
        !matches!(self, Self::InvalidInput | Self::NotReady)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::InvalidInput => "invalid-input",
            Self::NotReady => "not-ready",
            Self::Internal => "internal",
            Self::Deadline => "deadline",
            Self::MemoryLimit => "memory-limit",
            Self::Trap => "trap",
            Self::BadOutput => "bad-output",
            Self::Load => "load",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct PolicyError {
    pub kind: PolicyErrorKind,
    pub message: String,
}

impl PolicyError {
    pub fn new(kind: PolicyErrorKind, message: impl Into<String>) -> Self {
        PolicyError {
            kind,
            message: message.into(),
        }
    }
}

/// A pool-selection policy. Implemented by the wasmtime host; the allocation engine is generic
/// over it.
pub trait Policy: Send + Sync {
    fn decide(
        &self,
        inventory: &Arc<Inventory>,
        request: &Request,
    ) -> Result<Decision, PolicyError>;

    /// The policy's name, for errors that blame it.
    fn name(&self) -> String {
        "policy".to_string()
    }

    /// Whether every decision [`Policy::decide`] returns was already checked with
    /// [`Decision::validate`] against the same inventory and request. The wasmtime host checks
    /// a component's answer itself (so that a bogus one can fall back to the default policy);
    /// the allocation engine checks the decisions of every other policy. Either way a decision
    /// is checked once on the ADD path.
    fn validates(&self) -> bool {
        false
    }
}

impl<P: Policy + ?Sized> Policy for Arc<P> {
    fn decide(
        &self,
        inventory: &Arc<Inventory>,
        request: &Request,
    ) -> Result<Decision, PolicyError> {
        (**self).decide(inventory, request)
    }

    fn name(&self) -> String {
        (**self).name()
    }

    fn validates(&self) -> bool {
        (**self).validates()
    }
}

/// Bounds on a decision's size beyond which it is bogus whatever the inventory: a policy cannot
/// make a host hold gigabytes of trace.
pub const MAX_DETAIL_BYTES: usize = 4096;
pub const MAX_SOURCE_BYTES: usize = 1024;
pub const MAX_ROUTES: usize = 256;

impl Decision {
    /// Checks that a decision returned by an untrusted policy fits the request and inventory:
    /// one entry per NIC asked for, at most one per family, indices in range, the order a
    /// duplicate-free subset of the candidates, and bounded sizes.
    pub fn validate(&self, inventory: &Inventory, request: &Request) -> Result<(), PolicyError> {
        let bad = |m: String| Err(PolicyError::new(PolicyErrorKind::BadOutput, m));
        let pool_count = inventory.pools.len();
        if self.nics.len() != request.nics.len() {
            return bad(format!(
                "policy decided for {} NICs but the request has {}",
                self.nics.len(),
                request.nics.len()
            ));
        }
        for (nic, asked) in self.nics.iter().zip(&request.nics) {
            if nic.interface != asked.interface {
                return bad(format!(
                    "policy answered for interface {:?} where {:?} was asked",
                    truncate(&nic.interface, 64),
                    asked.interface
                ));
            }
            if nic.error.is_some() && !(nic.families.is_empty() && nic.routes.is_empty()) {
                return bad(format!(
                    "policy failed interface {} but also decided pools or routes for it",
                    nic.interface
                ));
            }
            if let Some(error) = &nic.error
                && error.message.len() > MAX_DETAIL_BYTES
            {
                return bad(format!(
                    "policy returned an error message of {} bytes for interface {}",
                    error.message.len(),
                    nic.interface
                ));
            }
            if nic.routes.len() > MAX_ROUTES {
                return bad(format!(
                    "policy returned {} routes (at most {MAX_ROUTES})",
                    nic.routes.len()
                ));
            }
            for (n, fam) in nic.families.iter().enumerate() {
                if nic.families[..n].iter().any(|f| f.family == fam.family) {
                    return bad(format!(
                        "policy decided {} twice for {}",
                        fam.family, nic.interface
                    ));
                }
                if fam.source.len() > MAX_SOURCE_BYTES {
                    return bad(format!(
                        "policy returned a source of {} bytes",
                        fam.source.len()
                    ));
                }
                if let Some(hint) = &fam.address {
                    if hint.address.len() > MAX_SOURCE_BYTES || hint.source.len() > MAX_SOURCE_BYTES
                    {
                        return bad(format!(
                            "policy returned an address hint of {} bytes",
                            hint.address.len() + hint.source.len()
                        ));
                    }
                    // The address is the user's (an annotation the policy passed on): a wrong
                    // one is a verdict on the pod, not a fault of the policy.
                    match hint.ip() {
                        Some(ip) if IpFamily::of(ip) == fam.family => {}
                        _ => {
                            return Err(PolicyError::new(
                                PolicyErrorKind::InvalidInput,
                                format!(
                                    "{} asks for {:?} on interface {}, which is not an {} \
                                     address: correct it",
                                    hint.source, hint.address, nic.interface, fam.family
                                ),
                            ));
                        }
                    }
                }
                for list in [&fam.candidates, &fam.order] {
                    if let Some(&i) = list.iter().find(|&&i| i as usize >= pool_count) {
                        return bad(format!(
                            "policy returned pool index {i} but the inventory holds {pool_count} pools"
                        ));
                    }
                }
                if fam.candidates.len() > pool_count {
                    return bad(format!(
                        "policy returned {} candidates but the inventory holds {pool_count} pools",
                        fam.candidates.len()
                    ));
                }
                // Bitmaps over the inventory: this runs on every allocation.
                let mut is_candidate = vec![false; pool_count];
                for &i in &fam.candidates {
                    is_candidate[i as usize] = true;
                }
                let mut seen = vec![false; pool_count];
                for &i in &fam.order {
                    if std::mem::replace(&mut seen[i as usize], true) {
                        return bad(format!(
                            "policy listed pool {} twice in its order",
                            inventory.pools[i as usize].name
                        ));
                    }
                    if !is_candidate[i as usize] {
                        return bad(format!(
                            "policy ordered pool {} which is not among its candidates",
                            inventory.pools[i as usize].name
                        ));
                    }
                    let pool = &inventory.pools[i as usize];
                    if pool.family != fam.family {
                        return bad(format!(
                            "policy ordered {} pool {} for {}",
                            pool.family, pool.name, fam.family
                        ));
                    }
                    // The host does not trust the policy's semantics: these pools can serve
                    // nobody, whatever a policy says.
                    if pool.spec.disable || pool.terminating {
                        let why = if pool.spec.disable {
                            "disabled"
                        } else {
                            "terminating"
                        };
                        return bad(format!(
                            "policy ordered pool {} which is {why}: refusing to allocate from it",
                            pool.name
                        ));
                    }
                }
                // Every candidate is either ordered or dropped once; names that matched nothing
                // come on top, bounded by what the pod could have written.
                if fam.dropped.len() > fam.candidates.len() + MAX_MISSING {
                    return bad(format!(
                        "policy returned {} dropped pools",
                        fam.dropped.len()
                    ));
                }
                for d in &fam.dropped {
                    if d.detail.len() > MAX_DETAIL_BYTES {
                        return bad(format!(
                            "policy returned a drop detail of {} bytes",
                            d.detail.len()
                        ));
                    }
                    match &d.pool {
                        PoolRef::Index(i) if *i as usize >= pool_count => {
                            return bad(format!(
                                "policy dropped pool index {i} but the inventory holds {pool_count} pools"
                            ));
                        }
                        PoolRef::Missing(name) if name.len() > MAX_SOURCE_BYTES => {
                            return bad(format!(
                                "policy returned a missing pool name of {} bytes",
                                name.len()
                            ));
                        }
                        _ => {}
                    }
                }
            }
        }
        Ok(())
    }
}

/// Why a pool was dropped, in words: the policy's own detail when it gave one, else a
/// description of the standard reason from the pool's spec and the request.
pub fn describe_drop(
    inventory: &Inventory,
    request: &Request,
    interface: &str,
    dropped: &Dropped,
) -> String {
    if !dropped.detail.is_empty() {
        return dropped.detail.clone();
    }
    let pool = match &dropped.pool {
        PoolRef::Index(i) => inventory.pools.get(*i as usize),
        PoolRef::Missing(name) => return format!("no IPPool named {name}"),
    };
    let Some(pool) = pool else {
        return dropped.reason.as_str().to_string();
    };
    let spec = &pool.spec;
    match dropped.reason {
        DropReason::NotFound => format!("no IPPool named {}", pool.name),
        DropReason::Terminating => "the pool is being deleted".into(),
        DropReason::Disabled => "spec.disable is true".into(),
        DropReason::WrongFamily => format!("the pool is {}", pool.family),
        DropReason::NodeMismatch
            if !spec.node_name.is_empty() && !spec.node_name.contains(&request.node.name) =>
        {
            format!(
                "node {} is not in nodeName {:?}",
                request.node.name, spec.node_name
            )
        }
        DropReason::NodeMismatch => {
            format!("node {} does not match nodeAffinity", request.node.name)
        }
        DropReason::NamespaceMismatch
            if !spec.namespace_name.is_empty()
                && !spec.namespace_name.contains(&request.namespace.name) =>
        {
            format!(
                "namespace {} is not in namespaceName {:?}",
                request.namespace.name, spec.namespace_name
            )
        }
        DropReason::NamespaceMismatch => {
            format!(
                "namespace {} does not match namespaceAffinity",
                request.namespace.name
            )
        }
        DropReason::PodMismatch => format!(
            "pod {}/{} does not match podAffinity",
            request.pod.namespace, request.pod.name
        ),
        DropReason::MultusMismatch => {
            let multus = request
                .nics
                .iter()
                .find(|n| n.interface == interface)
                .map(|n| n.multus_name.as_str())
                .unwrap_or("");
            if multus.is_empty() {
                format!(
                    "interface {interface} is not attached through Multus; the pool wants {:?}",
                    spec.multus_name
                )
            } else {
                format!(
                    "interface {interface} is attached through {multus}, not {:?}",
                    spec.multus_name
                )
            }
        }
        DropReason::AllExcluded => "every address of ips is in excludeIPs".into(),
        DropReason::AllReserved => "every address is held by a ReservedIP".into(),
        DropReason::Exhausted => format!("no free address left of {}", pool.total_count),
        DropReason::Other => "dropped by the policy".into(),
    }
}

/// Names in annotations that match nothing are reported as dropped; a pod cannot list more.
pub const MAX_MISSING: usize = 1024;

fn truncate(s: &str, max: usize) -> &str {
    match s.char_indices().nth(max) {
        Some((i, _)) => &s[..i],
        None => s,
    }
}

#[cfg(test)]
mod tests;
