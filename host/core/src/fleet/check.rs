//! The checks the webhook and the controller share: may a pool be edited (or removed) given the
//! allocations made from it, and is an allocation consistent with its pool and its neighbours.

use std::fmt;

use ipnet::IpNet;

use super::runs::{Run, intersect, merge, subtract};
use super::{Allocation, AllocationType, FleetKind, FleetPool, bounds};
use crate::addr::{IpFamily, u128_to_addr};

/// Why an edit of one datacenter's pool is refused. The caller adds where (the IPAMPool and
/// the datacenter).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EditRefusal {
    #[error(
        "poolCidr is immutable ({old} → {new}): clusters hold addresses of {old}; for other addresses create another IPAMPool"
    )]
    CidrChanged { old: IpNet, new: IpNet },
    #[error(
        "type is immutable ({old} → {new}): clusters hold {old} allocations; for {new} allocations create another IPAMPool"
    )]
    TypeChanged {
        old: AllocationType,
        new: AllocationType,
    },
    #[error(
        "allocationPrefix is immutable ({old} → {new}): clusters hold /{old} prefixes, which cannot be resized in place; for /{new} prefixes create another IPAMPool"
    )]
    PrefixLengthChanged { old: u8, new: u8 },
    #[error(
        "cluster {cluster} holds {addresses}, which the new exclusions cover: release or move that cluster first, or exclude other addresses"
    )]
    ExclusionAllocated { cluster: String, addresses: Shown },
    #[error(
        "clusters {clusters} still hold allocations from this datacenter's pool: delete those clusters (or their allocations) first"
    )]
    RemovedWhileAllocated { clusters: Shown },
}

/// Why an allocation does not fit its pool and neighbours (the IPAMAllocation webhook's
/// consistency check).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AllocationProblem {
    #[error("type {found} does not match the pool's type {pool}")]
    WrongType {
        found: AllocationType,
        pool: AllocationType,
    },
    #[error("{addresses} lie outside poolCidr {cidr}")]
    OutsidePool { addresses: Shown, cidr: IpNet },
    #[error("{addresses} are excluded by the pool")]
    Excluded { addresses: Shown },
    #[error("{addresses} are poolCidr {cidr}'s network or broadcast address")]
    NetworkOrBroadcast { addresses: Shown, cidr: IpNet },
    #[error("{addresses} are also held by cluster {other}")]
    Overlaps { other: String, addresses: Shown },
    #[error("prefix {cidr} is not the pool's allocationPrefix /{len}")]
    WrongPrefixLength { cidr: IpNet, len: u8 },
}

/// A list for a message, cut after a few items.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shown(pub Vec<String>);

impl Shown {
    const MAX: usize = 3;

    fn runs(family: IpFamily, runs: &[Run]) -> Shown {
        Shown(
            runs.iter()
                .take(Self::MAX + 1)
                .map(|&(lo, hi)| {
                    let (lo, hi) = (u128_to_addr(family, lo), u128_to_addr(family, hi));
                    if lo == hi {
                        lo.to_string()
                    } else {
                        format!("{lo}-{hi}")
                    }
                })
                .collect(),
        )
    }
}

impl fmt::Display for Shown {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let shown = &self.0[..self.0.len().min(Self::MAX)];
        f.write_str(&shown.join(", "))?;
        if self.0.len() > Self::MAX {
            f.write_str(", …")?;
        }
        Ok(())
    }
}

/// Why the edit of one datacenter's pool from `old` to `new` must be refused, given the
/// allocations made from it (cluster name, allocation). `old` is `None` on creation, `new` is
/// `None` on removal. Empty when the edit is allowed.
///
/// Allowed: changing `allocationRange` (a larger one grows clusters by appending runs, a smaller
/// one leaves them their addresses), and exclusions that cover no allocated address. Refused:
/// changing `poolCidr`, the type or `allocationPrefix`; an exclusion that covers allocated
/// addresses (only addresses the old pool did not already exclude count); removing a pool that
/// clusters still hold allocations from.
pub fn check_edit(
    old: Option<&FleetPool>,
    new: Option<&FleetPool>,
    allocations: &[(String, Allocation)],
) -> Vec<EditRefusal> {
    let mut refusals = Vec::new();
    let Some(new) = new else {
        if old.is_some() && !allocations.is_empty() {
            let mut clusters: Vec<String> = allocations.iter().map(|(c, _)| c.clone()).collect();
            clusters.sort();
            clusters.dedup();
            refusals.push(EditRefusal::RemovedWhileAllocated {
                clusters: Shown(clusters),
            });
        }
        return refusals;
    };
    let mut newly_excluded = new.excluded.clone();
    if let Some(old) = old {
        if old.cidr != new.cidr {
            refusals.push(EditRefusal::CidrChanged {
                old: old.cidr,
                new: new.cidr,
            });
        }
        match (old.kind, new.kind) {
            (FleetKind::Prefix { len: o }, FleetKind::Prefix { len: n }) if o != n => {
                refusals.push(EditRefusal::PrefixLengthChanged { old: o, new: n });
            }
            (o, n) if o.allocation_type() != n.allocation_type() => {
                refusals.push(EditRefusal::TypeChanged {
                    old: o.allocation_type(),
                    new: n.allocation_type(),
                });
            }
            _ => {}
        }
        if IpFamily::of_net(&old.cidr) == IpFamily::of_net(&new.cidr) {
            newly_excluded = subtract(&newly_excluded, &old.excluded);
        }
    }
    if newly_excluded.is_empty() {
        return refusals;
    }
    let family = new.family();
    for (cluster, allocation) in allocations {
        let Some(runs) = allocation.runs_of(family) else {
            continue;
        };
        let hit = intersect(&merge(runs), &newly_excluded);
        if !hit.is_empty() {
            refusals.push(EditRefusal::ExclusionAllocated {
                cluster: cluster.clone(),
                addresses: Shown::runs(family, &hit),
            });
        }
    }
    refusals
}

/// Why `allocation`, held by `cluster`, is inconsistent with `pool` and with the other
/// allocations in `existing` (entries named `cluster` are skipped). Empty when it is consistent.
/// An allocation longer than `allocationRange` is consistent (a lowered range keeps clusters
/// their addresses); so is a prefix longer than `allocationPrefix`.
pub fn check_allocation(
    pool: &FleetPool,
    existing: &[(String, Allocation)],
    cluster: &str,
    allocation: &Allocation,
) -> Vec<AllocationProblem> {
    let mut problems = Vec::new();
    let (found, expected) = (allocation.allocation_type(), pool.kind.allocation_type());
    if found != expected {
        problems.push(AllocationProblem::WrongType {
            found,
            pool: expected,
        });
    }
    if let (FleetKind::Prefix { len }, Allocation::Prefix(net)) = (pool.kind, allocation)
        && net.prefix_len() < len
    {
        problems.push(AllocationProblem::WrongPrefixLength { cidr: *net, len });
    }
    let family = pool.family();
    let Some(runs) = allocation.runs_of(family) else {
        problems.push(AllocationProblem::OutsidePool {
            addresses: Shown(vec![allocation.to_string()]),
            cidr: pool.cidr,
        });
        return problems;
    };
    let runs = merge(runs);
    let bounds = bounds(&pool.cidr);
    let outside = subtract(&runs, &[bounds]);
    if !outside.is_empty() {
        problems.push(AllocationProblem::OutsidePool {
            addresses: Shown::runs(family, &outside),
            cidr: pool.cidr,
        });
    }
    let excluded = intersect(&runs, &pool.excluded);
    if !excluded.is_empty() {
        problems.push(AllocationProblem::Excluded {
            addresses: Shown::runs(family, &excluded),
        });
    }
    if pool.keeps_edges() {
        let edges = intersect(
            &runs,
            &merge(vec![(bounds.0, bounds.0), (bounds.1, bounds.1)]),
        );
        if !edges.is_empty() {
            problems.push(AllocationProblem::NetworkOrBroadcast {
                addresses: Shown::runs(family, &edges),
                cidr: pool.cidr,
            });
        }
    }
    for (other, theirs) in existing.iter().filter(|(name, _)| name != cluster) {
        let Some(theirs) = theirs.runs_of(family) else {
            continue;
        };
        let shared = intersect(&runs, &merge(theirs));
        if !shared.is_empty() {
            problems.push(AllocationProblem::Overlaps {
                other: other.clone(),
                addresses: Shown::runs(family, &shared),
            });
        }
    }
    problems
}
