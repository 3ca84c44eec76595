//! allot's default pool-selection policy: Spiderpool's documented order, exactly.
//!
//! * **acquire**, first rule that applies to the NIC wins: subnet annotation (`subnets` beats
//!   `subnet`), pool annotation (`ippools` beats `ippool`), namespace default pools, the CNI
//!   config's default pools (in listed order), the cluster's default pools (`default: true`).
//! * **filter**: terminating, disabled, wrong family, node (nodeName when set, else
//!   nodeAffinity), namespace (namespaceName when set, else namespaceAffinity), pod
//!   (podAffinity), Multus network, every address excluded, every address reserved, exhausted.
//!   As Spiderpool's code and its newer concepts page: a name field takes precedence over the
//!   matching affinity, which is then not checked at all.
//! * **a named pool that does not exist** (in `ippool`/`ippools`, the namespace defaults or the
//!   CNI config's defaults) or **a named Subnet that does not exist** (`subnet`/`subnets`)
//!   fails that NIC with a `not-ready` error naming it, even when other listed pools exist, as
//!   Spiderpool fails the allocation when it cannot fetch a named candidate; the pod's other NICs
//!   are still decided. A wildcard pattern that matches nothing is only a `not-found` line in
//!   the trace (it names no pool).
//! * **sort**: PodAffinity > NodeName > NodeAffinity > NamespaceName > NamespaceAffinity >
//!   MultusName, compared lexicographically; stable, so equal pools keep the user's order.
//! * **address**: an address the pod is given by annotation (`ipam.allot.dev/ips` / `ip`, a
//!   StatefulSet's `ipam.allot.dev/ordinal-ips` indexed by the pod's ordinal, or Calico's
//!   `cni.projectcalico.org/ipAddrs`), which the host takes from a pool of the order or refuses
//!   with the reason; none otherwise (the host picks).
//!
//! Annotations are read under `ipam.allot.dev/` and `ipam.spidernet.io/` (allot's wins), and
//! the namespace defaults also under the older `defaultv4ippool` / `defaultv6ippool` keys.
//!
//! The stages are public so that a custom policy can keep two and replace one; build with the
//! `component` feature to export this policy as a component.

use allot_policy_sdk::annotations::{self, Found, Selection};
use allot_policy_sdk::types::{Label, LabelSelector, Owner};
use allot_policy_sdk::{
    Acquisition, AcquisitionRule, AddressHint, Context, DecisionError, DropReason,
    FamilyCandidates, IpFamily, Nic, Policy, Pool, PoolRef, Rejection, missing, selector,
};

/// The interface that `ippool` and `subnet` (the single-NIC annotations) apply to unless they
/// name one: Kubernetes' primary interface.
pub use allot_policy_sdk::PRIMARY_INTERFACE;

pub struct DefaultPolicy;

impl Policy for DefaultPolicy {
    fn acquire(ctx: &Context, nic: &Nic) -> Result<Acquisition, DecisionError> {
        acquire(ctx, nic)
    }

    fn filter(ctx: &Context, nic: &Nic, family: IpFamily, index: u32) -> Result<(), Rejection> {
        filter(ctx, nic, family, index)
    }

    fn sort(ctx: &Context, nic: &Nic, family: IpFamily, order: &mut [u32]) {
        sort(ctx, nic, family, order)
    }

    fn address(
        ctx: &Context,
        nic: &Nic,
        family: IpFamily,
        order: &[u32],
    ) -> Result<Option<AddressHint>, DecisionError> {
        address(ctx, nic, family, order)
    }
}

#[cfg(feature = "component")]
allot_policy_sdk::export_policy!(DefaultPolicy);

// ---------------------------------------------------------------------------------------------
// address

/// The address the pod is given for `nic` and `family` by its annotations
/// ([`allot_policy_sdk::addresses`]: `ipam.allot.dev/ips`, `ipam.allot.dev/ip`,
/// `ipam.allot.dev/ordinal-ips` by StatefulSet ordinal, Calico's `cni.projectcalico.org/ipAddrs`),
/// else none (the host picks). The host honours it only inside a pool of `order`.
pub fn address(
    ctx: &Context,
    nic: &Nic,
    family: IpFamily,
    _order: &[u32],
) -> Result<Option<AddressHint>, DecisionError> {
    allot_policy_sdk::addresses::given_address(ctx, nic, family)
}

// ---------------------------------------------------------------------------------------------
// acquire

/// Candidate pools for `nic` by the first rule that applies, plus the `routes` annotation.
pub fn acquire(ctx: &Context, nic: &Nic) -> Result<Acquisition, DecisionError> {
    let mut acquisition = match subnet_annotation(ctx, nic)? {
        Some(a) => a,
        None => match pool_annotation(ctx, nic)? {
            Some(a) => a,
            None => match namespace_default(ctx)? {
                Some(a) => a,
                None => match cni_default(ctx) {
                    Some(a) => a,
                    None => cluster_default(ctx).ok_or_else(|| no_rule_applies(nic))?,
                },
            },
        },
    };
    if let Some(error) = missing_by_name(&acquisition, nic) {
        return Ok(Acquisition::failed(error));
    }
    if let Some(found) = annotations::find(ctx.pod_annotations(), annotations::ROUTES) {
        acquisition.routes = annotations::routes(found)?;
    }
    Ok(acquisition)
}

/// As Spiderpool does (it fetches every named candidate before filtering, and a pool that does
/// not exist fails the allocation): a pool or Subnet named by the rule that applies, and that
/// does not exist, fails the NIC with an error naming it, even when other listed pools exist.
/// The pod's other NICs are unaffected. A wildcard pattern that matches nothing is not a name:
/// it stays a `not-found` line in the trace and the other names decide.
fn missing_by_name(acquisition: &Acquisition, nic: &Nic) -> Option<DecisionError> {
    acquisition.families.iter().find_map(|fam| {
        fam.missing.iter().find_map(|dropped| match &dropped.pool {
            PoolRef::Missing(name) if !allot_policy_sdk::wildcard::is_pattern(name) => {
                let kind = if fam.rule == AcquisitionRule::SubnetAnnotation {
                    "Subnet"
                } else {
                    "IPPool"
                };
                Some(DecisionError::not_ready(format!(
                    "{kind} {name} does not exist; {} names it for interface {}: create the \
                     {kind} or correct the name",
                    fam.source, nic.interface
                )))
            }
            _ => None,
        })
    })
}

fn no_rule_applies(nic: &Nic) -> DecisionError {
    DecisionError::invalid_input(format!(
        "no pool is configured for interface {}: annotate the pod with ipam.allot.dev/ippool or \
         ipam.allot.dev/ippools, annotate its namespace with ipam.allot.dev/default-ipv4-ippool, \
         set default_ipv4_ippool in the CNI network config, or mark a pool `default: true`",
        nic.interface
    ))
}

/// Position of an interface among the pod's NICs by the Kubernetes/Multus naming convention
/// (eth0, net1, net2, ...), for `ippools`/`subnets` entries that omit interface names.
pub fn interface_ordinal(interface: &str) -> Option<usize> {
    if interface == PRIMARY_INTERFACE {
        return Some(0);
    }
    interface.strip_prefix("net")?.parse().ok()
}

/// The entry of a per-interface list (`ippools`, `subnets`) that serves `nic`, if any.
fn entry_for<'s>(list: &'s [Selection], nic: &Nic) -> Option<&'s Selection> {
    if list.iter().any(|s| s.interface.is_some()) {
        list.iter()
            .find(|s| s.interface.as_deref() == Some(nic.interface.as_str()))
    } else {
        interface_ordinal(&nic.interface).and_then(|i| list.get(i))
    }
}

/// Whether a single selection (`ippool`, `subnet`) serves `nic`.
fn single_applies(sel: &Selection, nic: &Nic) -> bool {
    sel.interface.as_deref().unwrap_or(PRIMARY_INTERFACE) == nic.interface
}

fn per_family(
    ctx: &Context,
    rule: AcquisitionRule,
    source: &str,
    ipv4: &[String],
    ipv6: &[String],
) -> Vec<FamilyCandidates> {
    [(IpFamily::Ipv4, ipv4), (IpFamily::Ipv6, ipv6)]
        .into_iter()
        .filter(|(_, names)| !names.is_empty())
        .map(|(family, names)| {
            let resolved = ctx.resolve_pools(names);
            FamilyCandidates {
                family,
                rule,
                source: source.to_string(),
                candidates: resolved.candidates,
                missing: resolved.missing,
            }
        })
        .collect()
}

/// Rule 1: `subnets` / `subnet`: the auto pools carved from the named Subnets for the pod's
/// workload. Orphan pods (no owner) have no auto pools, so the rule does not apply to them.
pub fn subnet_annotation(ctx: &Context, nic: &Nic) -> Result<Option<Acquisition>, DecisionError> {
    let Some(owner) = &ctx.request.pod.owner else {
        return Ok(None);
    };
    let anns = ctx.pod_annotations();
    let (found, sel) = if let Some(found) = annotations::find(anns, annotations::SUBNETS) {
        let list = annotations::selections(found)?;
        match entry_for(&list, nic) {
            Some(sel) => (found, sel.clone()),
            None => return Ok(None),
        }
    } else if let Some(found) = annotations::find(anns, annotations::SUBNET) {
        let sel = annotations::selection(found)?;
        if !single_applies(&sel, nic) {
            return Ok(None);
        }
        (found, sel)
    } else {
        return Ok(None);
    };
    let source = format!("pod annotation {}", found.key);
    let mut families = Vec::new();
    for (family, names) in [(IpFamily::Ipv4, &sel.ipv4), (IpFamily::Ipv6, &sel.ipv6)] {
        if names.is_empty() {
            continue;
        }
        let mut fam = FamilyCandidates {
            family,
            rule: AcquisitionRule::SubnetAnnotation,
            source: source.clone(),
            candidates: Vec::new(),
            missing: Vec::new(),
        };
        for name in names {
            let subnets: Vec<&str> = if allot_policy_sdk::wildcard::is_pattern(name) {
                ctx.inventory
                    .subnets
                    .iter()
                    .filter(|s| allot_policy_sdk::wildcard::matches(name, &s.name))
                    .map(|s| s.name.as_str())
                    .collect()
            } else {
                ctx.subnet(name)
                    .map(|s| s.name.as_str())
                    .into_iter()
                    .collect()
            };
            if subnets.is_empty() {
                fam.missing
                    .push(missing(name, format!("no Subnet named {name}")));
                continue;
            }
            for subnet in subnets {
                let auto = auto_pools(ctx, family, subnet, owner);
                if auto.is_empty() {
                    return Err(DecisionError::not_ready(format!(
                        "no auto pool from Subnet {subnet} for {} {}/{} yet: the controller \
                         creates it from the {} annotation; retry shortly",
                        owner.kind, ctx.request.pod.namespace, owner.name, found.key
                    )));
                }
                for i in auto {
                    if !fam.candidates.contains(&i) {
                        fam.candidates.push(i);
                    }
                }
            }
        }
        families.push(fam);
    }
    Ok(Some(Acquisition {
        error: None,
        clean_gateway: sel.cleangateway,
        routes: Vec::new(),
        families,
    }))
}

fn auto_pools(ctx: &Context, family: IpFamily, subnet: &str, owner: &Owner) -> Vec<u32> {
    let namespace = &ctx.request.pod.namespace;
    ctx.pools_where(family, |p| {
        p.subnet_owner.as_deref() == Some(subnet)
            && p.application.as_ref().is_some_and(|a| {
                a.kind == owner.kind && a.name == owner.name && &a.namespace == namespace
            })
    })
}

/// Rule 2: `ippools` / `ippool`.
pub fn pool_annotation(ctx: &Context, nic: &Nic) -> Result<Option<Acquisition>, DecisionError> {
    let anns = ctx.pod_annotations();
    let (found, sel) = if let Some(found) = annotations::find(anns, annotations::IPPOOLS) {
        let list = annotations::selections(found)?;
        match entry_for(&list, nic) {
            Some(sel) => (found, sel.clone()),
            None => return Ok(None),
        }
    } else if let Some(found) = annotations::find(anns, annotations::IPPOOL) {
        let sel = annotations::selection(found)?;
        if !single_applies(&sel, nic) {
            return Ok(None);
        }
        (found, sel)
    } else {
        return Ok(None);
    };
    let source = format!("pod annotation {}", found.key);
    Ok(Some(Acquisition {
        error: None,
        clean_gateway: sel.cleangateway,
        routes: Vec::new(),
        families: per_family(
            ctx,
            AcquisitionRule::PoolAnnotation,
            &source,
            &sel.ipv4,
            &sel.ipv6,
        ),
    }))
}

/// Rule 3: the namespace's `default-ipv4-ippool` / `default-ipv6-ippool` (or the older
/// `defaultv4ippool` / `defaultv6ippool`).
pub fn namespace_default(ctx: &Context) -> Result<Option<Acquisition>, DecisionError> {
    let anns = ctx.namespace_annotations();
    let lookup = |name: &str, old: &str| -> Result<(Vec<String>, Option<Found>), DecisionError> {
        match annotations::find(anns, name).or_else(|| annotations::find(anns, old)) {
            Some(found) => Ok((annotations::name_list(found)?, Some(found))),
            None => Ok((Vec::new(), None)),
        }
    };
    let (v4, k4) = lookup(annotations::NS_DEFAULT_V4, annotations::NS_DEFAULT_V4_OLD)?;
    let (v6, k6) = lookup(annotations::NS_DEFAULT_V6, annotations::NS_DEFAULT_V6_OLD)?;
    if v4.is_empty() && v6.is_empty() {
        return Ok(None);
    }
    let keys: Vec<&str> = [k4, k6].into_iter().flatten().map(|f| f.key).collect();
    let source = format!(
        "namespace {} annotation {}",
        ctx.namespace.name,
        keys.join(", ")
    );
    Ok(Some(Acquisition {
        families: per_family(ctx, AcquisitionRule::NamespaceDefault, &source, &v4, &v6),
        ..Default::default()
    }))
}

/// Rule 4: the CNI network config's `default_ipv4_ippool` / `default_ipv6_ippool`, in order.
pub fn cni_default(ctx: &Context) -> Option<Acquisition> {
    let d = &ctx.request.cni_defaults;
    if d.ipv4.is_empty() && d.ipv6.is_empty() {
        return None;
    }
    Some(Acquisition {
        families: per_family(
            ctx,
            AcquisitionRule::CniDefault,
            "CNI network config default_ipv4_ippool/default_ipv6_ippool",
            &d.ipv4,
            &d.ipv6,
        ),
        ..Default::default()
    })
}

/// Rule 5: every pool with `default: true`, per family, in name order.
pub fn cluster_default(ctx: &Context) -> Option<Acquisition> {
    let families: Vec<FamilyCandidates> = [IpFamily::Ipv4, IpFamily::Ipv6]
        .into_iter()
        .filter_map(|family| {
            let candidates = ctx.pools_where(family, |p| p.default);
            (!candidates.is_empty()).then(|| FamilyCandidates {
                family,
                rule: AcquisitionRule::ClusterDefault,
                source: "IPPools with default: true".to_string(),
                candidates,
                missing: Vec::new(),
            })
        })
        .collect();
    (!families.is_empty()).then(|| Acquisition {
        families,
        ..Default::default()
    })
}

// ---------------------------------------------------------------------------------------------
// filter

/// The documented filter rules, in order; the first that fails names the reason.
///
/// Standard reasons carry no detail: the host describes them from the pool and the request when
/// someone reads the trace, so the hot path formats no strings.
pub fn filter(ctx: &Context, nic: &Nic, family: IpFamily, index: u32) -> Result<(), Rejection> {
    let pool = ctx.pool(index);
    let reject = |reason| Err(Rejection::standard(reason));
    if pool.terminating {
        return reject(DropReason::Terminating);
    }
    if pool.disable {
        return reject(DropReason::Disabled);
    }
    if pool.ip_version != family {
        return reject(DropReason::WrongFamily);
    }
    // As Spiderpool: nodeName, when set, decides alone ("NodeName has higher priority than
    // NodeAffinity"); nodeAffinity decides only when nodeName is empty. Likewise namespaceName
    // over namespaceAffinity.
    // Both depend only on the pool and the node (or namespace): computed once per node (or
    // namespace) and inventory generation, then reused for every pod.
    let node_ok = (pool.node_name.is_empty() && pool.node_affinity.is_none())
        || ctx.node_verdict(index, || {
            if !pool.node_name.is_empty() {
                pool.node_name.contains(&ctx.node.name)
            } else {
                pool.node_affinity
                    .as_ref()
                    .is_none_or(|sel| selector::matches(sel, ctx.node_labels()))
            }
        });
    if !node_ok {
        return reject(DropReason::NodeMismatch);
    }
    let namespace_ok = (pool.namespace_name.is_empty() && pool.namespace_affinity.is_none())
        || ctx.namespace_verdict(index, || {
            namespace_matches(
                &pool.namespace_name,
                pool.namespace_affinity.as_ref(),
                &ctx.namespace.name,
                ctx.namespace_labels(),
            )
        });
    if !namespace_ok {
        return reject(DropReason::NamespaceMismatch);
    }
    if !pod_matches(pool.pod_affinity.as_ref(), ctx.pod_labels()) {
        return reject(DropReason::PodMismatch);
    }
    if !pool.multus_name.is_empty() && !multus_matches(&pool.multus_name, &nic.multus_name) {
        return reject(DropReason::MultusMismatch);
    }
    if pool.all_excluded {
        return reject(DropReason::AllExcluded);
    }
    if pool.all_reserved {
        return reject(DropReason::AllReserved);
    }
    if ctx.free(index) == 0 {
        return reject(DropReason::Exhausted);
    }
    Ok(())
}

/// The namespace rule of [`filter`]: whether a pool with `namespace_name` and
/// `namespace_affinity` serves pods of `namespace`, whose labels are `labels`. As Spiderpool:
/// namespaceName, when set, decides alone; namespaceAffinity only when it is empty; a pool
/// with neither serves every namespace. Public so that the host can judge, before any pod
/// exists, which pools a workload's pods may use (a StatefulSet's declared addresses).
pub fn namespace_matches(
    namespace_name: &[String],
    namespace_affinity: Option<&LabelSelector>,
    namespace: &str,
    labels: &[Label],
) -> bool {
    if !namespace_name.is_empty() {
        namespace_name.iter().any(|n| n == namespace)
    } else {
        namespace_affinity.is_none_or(|sel| selector::matches(sel, labels))
    }
}

/// The pod rule of [`filter`]: whether a pool with `pod_affinity` serves a pod labelled
/// `labels` (a pool without one serves every pod).
pub fn pod_matches(pod_affinity: Option<&LabelSelector>, labels: &[Label]) -> bool {
    pod_affinity.is_none_or(|sel| selector::matches(sel, labels))
}

/// A `multusName` entry matches the NIC's network "namespace/name" exactly, or by name alone
/// when the entry has no namespace.
pub fn multus_matches(allowed: &[String], network: &str) -> bool {
    if network.is_empty() {
        return false;
    }
    let bare = network.rsplit_once('/').map_or(network, |(_, name)| name);
    allowed
        .iter()
        .any(|a| a == network || (!a.contains('/') && a == bare))
}

// ---------------------------------------------------------------------------------------------
// sort

/// The sort key: which affinity properties a pool has, most significant first.
pub fn sort_key(pool: &Pool) -> [bool; 6] {
    [
        pool.pod_affinity.is_some(),
        !pool.node_name.is_empty(),
        pool.node_affinity.is_some(),
        !pool.namespace_name.is_empty(),
        pool.namespace_affinity.is_some(),
        !pool.multus_name.is_empty(),
    ]
}

/// [`sort_key`] as a number that orders alike (the first property is the most significant bit).
pub fn sort_rank(pool: &Pool) -> u8 {
    sort_key(pool)
        .iter()
        .fold(0, |rank, &has| (rank << 1) | u8::from(has))
}

/// More specific pools first; stable, so equal pools keep the order the user listed them in.
///
/// A key has 64 possible values, so this is a counting sort: one pass to rank every pool, one
/// to place it, no comparisons (a comparison sort spent most of a 1,000-pool decision here).
pub fn sort(ctx: &Context, _nic: &Nic, _family: IpFamily, order: &mut [u32]) {
    const RANKS: usize = 1 << 6;
    if order.len() < 2 {
        return;
    }
    let ranks: Vec<u8> = order.iter().map(|&i| sort_rank(ctx.pool(i))).collect();
    let mut counts = [0usize; RANKS];
    for &r in &ranks {
        counts[r as usize] += 1;
    }
    // Highest rank first: each rank starts after every higher one.
    let mut starts = [0usize; RANKS];
    let mut next = 0;
    for r in (0..RANKS).rev() {
        starts[r] = next;
        next += counts[r];
    }
    let mut sorted = vec![0u32; order.len()];
    for (&i, &r) in order.iter().zip(&ranks) {
        sorted[starts[r as usize]] = i;
        starts[r as usize] += 1;
    }
    order.copy_from_slice(&sorted);
}
