//! Fleet ranges: per-cluster address ranges carved from a shared per-datacenter pool (the
//! multi-cluster IPAM proposal, Kubermatic's `IPAMPool` / `IPAMAllocation` shapes).
//!
//! Pure arithmetic on `u128` runs, no I/O. What users notice:
//! - a cluster gets either `range` (N addresses, as one run when a free run holds them all,
//!   otherwise the lowest free addresses as several disjoint runs) or `prefix` (the lowest free
//!   aligned subnet of the given length);
//! - `excludeRanges` and `excludePrefixes` are matched by overlap, never by string, and both
//!   apply to both types; an IPv4 range pool's network and broadcast addresses (below /31) are
//!   never handed out, while a prefix pool hands out every aligned prefix, its first and last
//!   too (a subnet is the cluster's to use, the pool's edges are not hosts there);
//! - an existing allocation is always kept: a larger `allocationRange` appends disjoint runs and
//!   never rewrites the runs a cluster holds; a smaller one leaves the cluster its addresses; a
//!   shorter `allocationPrefix` (a larger subnet) is refused with the reason, since a prefix
//!   cannot grow without moving the cluster;
//! - the pool CIDR, the type and the prefix length are immutable, and an exclusion that covers
//!   allocated addresses is refused ([`check_edit`], shared by the webhook and the controller);
//! - the cost depends on the number of allocations and exclusions, never on the pool's size
//!   (Kubermatic expands the whole CIDR into single addresses).

use std::fmt;
use std::net::IpAddr;

use ipnet::IpNet;

use crate::addr::{IpFamily, addr_to_u128, u128_to_addr};

mod check;
#[cfg(test)]
mod proptests;
mod runs;
pub mod spec;
#[cfg(test)]
mod tests;

pub use check::{AllocationProblem, EditRefusal, Shown, check_allocation, check_edit};
pub use spec::{AllocationType, IpamAllocationSpec, IpamPoolDatacenter, IpamPoolSpec};

use runs::{Run, clip, first_aligned, gaps, host_mask, merge, take, total};

/// What a pool hands each cluster.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FleetKind {
    /// `per_cluster` addresses, possibly as several disjoint runs.
    Range { per_cluster: u128 },
    /// One subnet of prefix length `len`.
    Prefix { len: u8 },
}

impl FleetKind {
    pub fn allocation_type(self) -> AllocationType {
        match self {
            FleetKind::Range { .. } => AllocationType::Range,
            FleetKind::Prefix { .. } => AllocationType::Prefix,
        }
    }
}

/// One datacenter's pool whose settings have been checked: built only by [`FleetPool::new`],
/// [`FleetPool::parse`] or [`FleetPool::from_spec`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FleetPool {
    kind: FleetKind,
    cidr: IpNet,
    exclude_ranges: Vec<(IpAddr, IpAddr)>,
    exclude_prefixes: Vec<IpNet>,
    /// The exclusions, clipped to the pool and merged.
    excluded: Vec<Run>,
}

/// Why a pool's settings or an allocation's addresses cannot be used, and what to write instead.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FleetSpecError {
    #[error("poolCidr `{cidr}` is not a CIDR such as 10.6.0.0/16 or fd00:6::/48")]
    BadCidr { cidr: String },
    #[error("type {kind} needs {field}: {hint}")]
    Missing {
        kind: AllocationType,
        field: &'static str,
        hint: &'static str,
    },
    #[error("{field} is for type {other}, but the type is {kind}: remove it")]
    Misplaced {
        kind: AllocationType,
        other: AllocationType,
        field: &'static str,
    },
    #[error("allocationRange must be at least 1: set how many addresses each cluster gets")]
    ZeroRange,
    #[error(
        "allocationRange {per_cluster} exceeds the {usable} addresses poolCidr {cidr} can hand out (exclusions and the IPv4 network and broadcast addresses left out): lower allocationRange or use a wider poolCidr"
    )]
    RangeTooLarge {
        per_cluster: u128,
        usable: u128,
        cidr: IpNet,
    },
    #[error(
        "allocationPrefix {len} does not fit poolCidr {cidr}: use a length from {min} to {max}"
    )]
    PrefixOutOfBounds {
        len: u8,
        cidr: IpNet,
        min: u8,
        max: u8,
    },
    #[error(
        "no /{len} of poolCidr {cidr} is free of the exclusions, so no cluster could get one: use a longer allocationPrefix, a wider poolCidr or fewer exclusions"
    )]
    NoPrefixLeft { len: u8, cidr: IpNet },
    #[error("excludeRanges entry `{entry}` {problem}")]
    BadExcludeRange { entry: String, problem: String },
    #[error("excludePrefixes entry `{entry}` {problem}")]
    BadExcludePrefix { entry: String, problem: String },
    #[error("addresses entry `{entry}` {problem}")]
    BadAddresses { entry: String, problem: String },
    #[error("an allocation of type range needs addresses: list \"first-last\" runs")]
    NoAddresses,
    #[error("cidr `{cidr}` is not a CIDR such as 10.6.0.0/28")]
    BadAllocationCidr { cidr: String },
}

/// Why a cluster gets no (new or larger) allocation. The cluster's current allocation, if any,
/// stays as it is.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FleetError {
    #[error(
        "cluster {cluster}: poolCidr {cidr} has {free} free addresses, the cluster needs {wanted} more: widen the pool with another IPAMPool, or release clusters"
    )]
    Exhausted {
        cluster: String,
        cidr: IpNet,
        wanted: u128,
        free: u128,
    },
    #[error(
        "cluster {cluster}: no free /{len} is left in poolCidr {cidr}: release a cluster's prefix or give the datacenter another IPAMPool"
    )]
    NoFreePrefix {
        cluster: String,
        cidr: IpNet,
        len: u8,
    },
    #[error(
        "cluster {cluster} keeps {current}: allocationPrefix {len} asks for a larger subnet, and a prefix cannot grow without moving the cluster; set allocationPrefix back to {current_len} (it is immutable)",
        current_len = current.prefix_len()
    )]
    PrefixLengthLowered {
        cluster: String,
        current: IpNet,
        len: u8,
    },
    #[error(
        "cluster {cluster} keeps its {current_type} allocation {current}: the pool now hands out type {pool_type}, and the type is immutable; set it back to {current_type}"
    )]
    TypeChanged {
        cluster: String,
        current: Allocation,
        current_type: AllocationType,
        pool_type: AllocationType,
    },
    #[error(
        "cluster {cluster} keeps {current}, which lies outside poolCidr {cidr}: the pool CIDR is immutable; set it back, or delete the cluster's allocation to get a new one"
    )]
    OutsidePool {
        cluster: String,
        current: Allocation,
        cidr: IpNet,
    },
}

/// A cluster's allocation: what an `IPAMAllocation` holds.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Allocation {
    /// Inclusive runs, in the order they were handed out (growth appends).
    Range(Vec<(IpAddr, IpAddr)>),
    Prefix(IpNet),
}

impl Allocation {
    /// Parses an `IPAMAllocation`'s `addresses`: "first-last" runs (a single address is a run
    /// of one), of one family, not overlapping each other.
    pub fn parse_addresses<S: AsRef<str>>(entries: &[S]) -> Result<Allocation, FleetSpecError> {
        let bad = |entry: &str, problem: String| FleetSpecError::BadAddresses {
            entry: entry.to_string(),
            problem,
        };
        let mut out: Vec<(IpAddr, IpAddr)> = Vec::with_capacity(entries.len());
        for entry in entries {
            let entry = entry.as_ref().trim();
            let (first, last) = parse_run(entry).map_err(|p| bad(entry, p))?;
            if let Some(&(f, _)) = out.first()
                && IpFamily::of(f) != IpFamily::of(first)
            {
                return Err(bad(
                    entry,
                    format!(
                        "is {} but the first entry is {}",
                        IpFamily::of(first),
                        IpFamily::of(f)
                    ),
                ));
            }
            let run = (addr_to_u128(first), addr_to_u128(last));
            if let Some(&(f, l)) = out
                .iter()
                .find(|&&(f, l)| run.0 <= addr_to_u128(l) && addr_to_u128(f) <= run.1)
            {
                return Err(bad(
                    entry,
                    format!("overlaps entry {f}-{l}: list each address once"),
                ));
            }
            out.push((first, last));
        }
        if out.is_empty() {
            return Err(FleetSpecError::NoAddresses);
        }
        Ok(Allocation::Range(out))
    }

    /// Parses an `IPAMAllocation`'s `cidr` (a prefix allocation).
    pub fn parse_cidr(cidr: &str) -> Result<Allocation, FleetSpecError> {
        let net: IpNet = cidr
            .trim()
            .parse()
            .map_err(|_| FleetSpecError::BadAllocationCidr {
                cidr: cidr.to_string(),
            })?;
        Ok(Allocation::Prefix(net.trunc()))
    }

    pub fn allocation_type(&self) -> AllocationType {
        match self {
            Allocation::Range(_) => AllocationType::Range,
            Allocation::Prefix(_) => AllocationType::Prefix,
        }
    }

    /// The `addresses` of an `IPAMAllocation`: one "first-last" string per run (a run of one
    /// address too, as Kubermatic writes it and as MetalLB reads it). Empty for a prefix.
    pub fn addresses(&self) -> Vec<String> {
        match self {
            Allocation::Range(runs) => runs.iter().map(|(f, l)| format!("{f}-{l}")).collect(),
            Allocation::Prefix(_) => Vec::new(),
        }
    }

    /// How many addresses the allocation holds, saturating at `u128::MAX`.
    pub fn len(&self) -> u128 {
        match self {
            Allocation::Range(runs) => total(runs.iter().map(|&(f, l)| ordered(f, l))),
            Allocation::Prefix(net) => {
                runs::size((addr_to_u128(net.network()), addr_to_u128(net.broadcast())))
            }
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The allocation's runs in `family`'s number space, in order; `None` when it holds an
    /// address of the other family.
    fn runs_of(&self, family: IpFamily) -> Option<Vec<Run>> {
        match self {
            Allocation::Range(runs) => runs
                .iter()
                .map(|&(f, l)| {
                    (IpFamily::of(f) == family && IpFamily::of(l) == family).then(|| ordered(f, l))
                })
                .collect(),
            Allocation::Prefix(net) => (IpFamily::of_net(net) == family)
                .then(|| vec![(addr_to_u128(net.network()), addr_to_u128(net.broadcast()))]),
        }
    }
}

/// The form a ConfigMap carries: a prefix's CIDR, or the runs joined by commas.
impl fmt::Display for Allocation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Allocation::Range(_) => f.write_str(&self.addresses().join(",")),
            Allocation::Prefix(net) => write!(f, "{net}"),
        }
    }
}

fn ordered(a: IpAddr, b: IpAddr) -> Run {
    let (a, b) = (addr_to_u128(a), addr_to_u128(b));
    (a.min(b), a.max(b))
}

/// Parses "first-last" or a single address; the problem is worded to follow the entry.
fn parse_run(entry: &str) -> Result<(IpAddr, IpAddr), String> {
    let addr = |s: &str| {
        s.trim()
            .parse::<IpAddr>()
            .map_err(|_| "is not an address or a \"first-last\" range".to_string())
    };
    let (first, last) = match entry.split_once('-') {
        Some((a, b)) => (addr(a)?, addr(b)?),
        None => {
            let a = addr(entry)?;
            (a, a)
        }
    };
    if IpFamily::of(first) != IpFamily::of(last) {
        return Err("mixes IPv4 and IPv6: write both ends in one family".into());
    }
    if addr_to_u128(first) > addr_to_u128(last) {
        return Err("ends before it starts: write the lower address first".into());
    }
    Ok((first, last))
}

impl FleetPool {
    /// Checks a pool: the allocation fits the CIDR, exclusions are of the pool's family and
    /// touch the pool, and at least one cluster could be served by the empty pool. The CIDR is
    /// truncated (users write 10.0.0.1/24 meaning 10.0.0.0/24), so are excluded prefixes.
    pub fn new(
        kind: FleetKind,
        cidr: IpNet,
        exclude_ranges: Vec<(IpAddr, IpAddr)>,
        exclude_prefixes: Vec<IpNet>,
    ) -> Result<FleetPool, FleetSpecError> {
        let cidr = cidr.trunc();
        let family = IpFamily::of_net(&cidr);
        let bounds = bounds(&cidr);
        let mut user = Vec::with_capacity(exclude_ranges.len() + exclude_prefixes.len());
        for &(first, last) in &exclude_ranges {
            let entry = if first == last {
                first.to_string()
            } else {
                format!("{first}-{last}")
            };
            let problem = if IpFamily::of(first) != family || IpFamily::of(last) != family {
                Some(format!("is not {family} like poolCidr {cidr}"))
            } else if addr_to_u128(first) > addr_to_u128(last) {
                Some("ends before it starts: write the lower address first".into())
            } else {
                None
            };
            let run = ordered(first, last);
            let problem = problem.or_else(|| outside(run, bounds, &cidr));
            if let Some(problem) = problem {
                return Err(FleetSpecError::BadExcludeRange { entry, problem });
            }
            user.push(run);
        }
        let exclude_prefixes: Vec<IpNet> = exclude_prefixes.iter().map(IpNet::trunc).collect();
        for net in &exclude_prefixes {
            let run = (addr_to_u128(net.network()), addr_to_u128(net.broadcast()));
            let problem = if IpFamily::of_net(net) != family {
                Some(format!("is not {family} like poolCidr {cidr}"))
            } else {
                outside(run, bounds, &cidr)
            };
            if let Some(problem) = problem {
                return Err(FleetSpecError::BadExcludePrefix {
                    entry: net.to_string(),
                    problem,
                });
            }
            user.push(run);
        }
        let pool = FleetPool {
            kind,
            cidr,
            exclude_ranges,
            exclude_prefixes,
            excluded: merge(clip(user, bounds).collect()),
        };
        let never = pool.never_handed_out();
        match kind {
            FleetKind::Range { per_cluster: 0 } => return Err(FleetSpecError::ZeroRange),
            FleetKind::Range { per_cluster } => {
                let usable = total(gaps(bounds, &never));
                if per_cluster > usable {
                    return Err(FleetSpecError::RangeTooLarge {
                        per_cluster,
                        usable,
                        cidr,
                    });
                }
            }
            FleetKind::Prefix { len } => {
                let (min, max) = (cidr.prefix_len(), cidr.max_prefix_len());
                if len < min || len > max {
                    return Err(FleetSpecError::PrefixOutOfBounds {
                        len,
                        cidr,
                        min,
                        max,
                    });
                }
                if first_aligned(gaps(bounds, &never), host_mask(max, len)).is_none() {
                    return Err(FleetSpecError::NoPrefixLeft { len, cidr });
                }
            }
        }
        Ok(pool)
    }

    /// [`FleetPool::new`] from the strings users write: `cidr` such as "10.6.0.0/16",
    /// `exclude_ranges` entries "first-last" or a single address, `exclude_prefixes` CIDRs.
    pub fn parse<S: AsRef<str>>(
        kind: FleetKind,
        cidr: &str,
        exclude_ranges: &[S],
        exclude_prefixes: &[S],
    ) -> Result<FleetPool, FleetSpecError> {
        let net: IpNet = cidr.trim().parse().map_err(|_| FleetSpecError::BadCidr {
            cidr: cidr.to_string(),
        })?;
        let ranges = exclude_ranges
            .iter()
            .map(|e| {
                let entry = e.as_ref().trim();
                parse_run(entry).map_err(|problem| FleetSpecError::BadExcludeRange {
                    entry: entry.to_string(),
                    problem,
                })
            })
            .collect::<Result<_, _>>()?;
        let prefixes = exclude_prefixes
            .iter()
            .map(|e| {
                let entry = e.as_ref().trim();
                entry
                    .parse::<IpNet>()
                    .map_err(|_| FleetSpecError::BadExcludePrefix {
                        entry: entry.to_string(),
                        problem: "is not a CIDR such as 10.6.0.0/28".into(),
                    })
            })
            .collect::<Result<_, _>>()?;
        FleetPool::new(kind, net, ranges, prefixes)
    }

    pub fn kind(&self) -> FleetKind {
        self.kind
    }

    pub fn cidr(&self) -> IpNet {
        self.cidr
    }

    pub fn family(&self) -> IpFamily {
        IpFamily::of_net(&self.cidr)
    }

    pub fn exclude_ranges(&self) -> &[(IpAddr, IpAddr)] {
        &self.exclude_ranges
    }

    pub fn exclude_prefixes(&self) -> &[IpNet] {
        &self.exclude_prefixes
    }

    /// The same pool handing out `kind` instead (checked again): what an edit of
    /// `allocationRange` makes of it.
    pub fn with_kind(&self, kind: FleetKind) -> Result<FleetPool, FleetSpecError> {
        FleetPool::new(
            kind,
            self.cidr,
            self.exclude_ranges.clone(),
            self.exclude_prefixes.clone(),
        )
    }

    /// How many addresses an empty pool could hand out: the CIDR less the exclusions and, for
    /// an IPv4 range pool below /31, the network and broadcast addresses.
    pub fn usable(&self) -> u128 {
        total(gaps(bounds(&self.cidr), &self.never_handed_out()))
    }

    /// Whether the pool keeps its network and broadcast addresses back: an IPv4 range pool
    /// below /31, whose addresses are hosts on the pool's network. A prefix pool hands out
    /// subnets, which the clusters address themselves, so its first and last prefixes are
    /// handed out like any other (as Kubermatic does).
    fn keeps_edges(&self) -> bool {
        matches!(self.kind, FleetKind::Range { .. })
            && matches!(self.cidr, IpNet::V4(n) if n.prefix_len() < 31)
    }

    /// The exclusions plus, when the pool [keeps its edges](Self::keeps_edges), the network
    /// and broadcast addresses: merged, within the pool.
    fn never_handed_out(&self) -> Vec<Run> {
        let (net, bcast) = bounds(&self.cidr);
        if !self.keeps_edges() {
            return self.excluded.clone();
        }
        let mut never = self.excluded.clone();
        never.extend([(net, net), (bcast, bcast)]);
        merge(never)
    }
}

fn bounds(cidr: &IpNet) -> Run {
    (addr_to_u128(cidr.network()), addr_to_u128(cidr.broadcast()))
}

fn outside(run: Run, bounds: Run, cidr: &IpNet) -> Option<String> {
    (run.1 < bounds.0 || run.0 > bounds.1)
        .then(|| format!("lies outside poolCidr {cidr}, so it excludes nothing: fix or remove it"))
}

/// The allocation `cluster` should hold in `pool`, given every allocation of the pool's
/// datacenter in `existing` (entries named `cluster` are ignored: `current` stands for them)
/// and the cluster's `current` allocation. `existing` must hold every allocation that holds
/// addresses, whether the caller has a record of it or not: what it leaves out may be handed
/// out again.
///
/// - No current allocation: the lowest free space, avoiding the other clusters, the exclusions
///   and (an IPv4 range pool below /31) the network and broadcast addresses.
/// - A current allocation is kept as it is when it holds at least what the pool asks. A range
///   that holds fewer addresses than `allocationRange` grows: its runs stay as they are, first,
///   and new disjoint runs follow. A prefix longer than `allocationPrefix` is refused.
/// - On an error the cluster keeps whatever it has; the error says why and what to do.
///
/// Cost: O(k log k) in the number of allocations and exclusions, whatever the pool's size.
pub fn allocate(
    pool: &FleetPool,
    existing: &[(String, Allocation)],
    cluster: &str,
    current: Option<&Allocation>,
) -> Result<Allocation, FleetError> {
    let family = pool.family();
    let bounds = bounds(&pool.cidr);
    let mut held: Vec<Run> = Vec::new();
    if let Some(current) = current {
        if current.allocation_type() != pool.kind.allocation_type() {
            return Err(FleetError::TypeChanged {
                cluster: cluster.to_string(),
                current: current.clone(),
                current_type: current.allocation_type(),
                pool_type: pool.kind.allocation_type(),
            });
        }
        held = match current.runs_of(family) {
            Some(runs)
                if runs
                    .iter()
                    .all(|&(lo, hi)| bounds.0 <= lo && hi <= bounds.1) =>
            {
                runs
            }
            _ => {
                return Err(FleetError::OutsidePool {
                    cluster: cluster.to_string(),
                    current: current.clone(),
                    cidr: pool.cidr,
                });
            }
        };
        match (pool.kind, current) {
            (FleetKind::Prefix { len }, Allocation::Prefix(net)) if len < net.prefix_len() => {
                return Err(FleetError::PrefixLengthLowered {
                    cluster: cluster.to_string(),
                    current: *net,
                    len,
                });
            }
            (FleetKind::Range { per_cluster }, Allocation::Range(_))
                if current.len() < per_cluster => {}
            _ => return Ok(current.clone()),
        }
    }

    let others = existing
        .iter()
        .filter(|(name, _)| name != cluster)
        .filter_map(|(_, a)| a.runs_of(family))
        .flatten();
    let taken = merge(
        clip(others.chain(held.iter().copied()), bounds)
            .chain(pool.never_handed_out())
            .collect(),
    );
    match pool.kind {
        FleetKind::Range { per_cluster } => {
            // Only a range short of `per_cluster` gets here.
            let wanted = per_cluster - current.map_or(0, Allocation::len);
            let free: Vec<Run> = gaps(bounds, &taken).collect();
            let Some(new) = take(&free, wanted) else {
                return Err(FleetError::Exhausted {
                    cluster: cluster.to_string(),
                    cidr: pool.cidr,
                    wanted,
                    free: total(free),
                });
            };
            let mut out = match current {
                Some(Allocation::Range(runs)) => runs.clone(),
                _ => Vec::with_capacity(new.len()),
            };
            out.extend(
                new.into_iter()
                    .map(|(lo, hi)| (u128_to_addr(family, lo), u128_to_addr(family, hi))),
            );
            Ok(Allocation::Range(out))
        }
        FleetKind::Prefix { len } => {
            let mask = host_mask(pool.cidr.max_prefix_len(), len);
            let Some((lo, _)) = first_aligned(gaps(bounds, &taken), mask) else {
                return Err(FleetError::NoFreePrefix {
                    cluster: cluster.to_string(),
                    cidr: pool.cidr,
                    len,
                });
            };
            let net = IpNet::new(u128_to_addr(family, lo), len)
                .expect("allocationPrefix was checked against the pool's family");
            Ok(Allocation::Prefix(net))
        }
    }
}
