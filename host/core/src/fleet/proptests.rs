//! Property tests: random IPv4 and IPv6 pools (from a single address to the whole IPv6 space),
//! random exclusions, and random sequences of new clusters, resizes, releases and exclusion
//! edits, as a controller and a webhook would apply them. After every step the allocations are
//! checked by plain pairwise comparison, independently of the allocator's own run arithmetic.

use std::net::IpAddr;

use ipnet::IpNet;
use proptest::prelude::*;

use super::*;

#[derive(Clone, Debug)]
enum Op {
    /// A new cluster asks for an allocation.
    New,
    /// `allocationRange` or `allocationPrefix` changes (a prefix change is forced past the
    /// webhook, as if it were down), then every cluster is reconciled.
    Resize(u128),
    /// A cluster is deleted.
    Release(usize),
    /// An exclusion is added through the edit check.
    Exclude(u128, u128),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => Just(Op::New),
        2 => any::<u128>().prop_map(Op::Resize),
        1 => any::<usize>().prop_map(Op::Release),
        2 => (any::<u128>(), any::<u128>()).prop_map(|(a, b)| Op::Exclude(a, b)),
    ]
}

#[derive(Clone, Debug)]
struct Setup {
    v6: bool,
    base: u128,
    host_bits: u8,
    prefix: bool,
    size_raw: u128,
    divisor: u8,
    exclusions: Vec<(bool, u128, u128)>,
}

fn setup() -> impl Strategy<Value = Setup> {
    (
        any::<bool>(),
        any::<u128>(),
        prop_oneof![0..=16u8, 16..=128u8],
        any::<bool>(),
        any::<u128>(),
        1..=64u8,
        prop::collection::vec((any::<bool>(), any::<u128>(), any::<u128>()), 0..4),
    )
        .prop_map(
            |(v6, base, host_bits, prefix, size_raw, divisor, exclusions)| Setup {
                v6,
                base,
                host_bits: if v6 { host_bits } else { host_bits.min(16) },
                prefix,
                size_raw,
                divisor,
                exclusions,
            },
        )
}

fn family_bits(v6: bool) -> u8 {
    if v6 { 128 } else { 32 }
}

fn to_addr(v6: bool, n: u128) -> IpAddr {
    u128_to_addr(if v6 { IpFamily::V6 } else { IpFamily::V4 }, n)
}

/// Addresses in a pool with `host_bits` host bits, saturating.
fn pool_size(host_bits: u8) -> u128 {
    runs::host_mask(host_bits, 0).saturating_add(1)
}

/// A number in `1..=max(1, cap)` from a raw random number.
fn between_one_and(raw: u128, cap: u128) -> u128 {
    1 + raw % cap.max(1)
}

/// An exclusion inside `cidr`: a range ("first-last") or a prefix, from raw random numbers.
fn exclusion(
    cidr: &IpNet,
    as_prefix: bool,
    a: u128,
    b: u128,
) -> (Option<(IpAddr, IpAddr)>, Option<IpNet>) {
    let v6 = matches!(cidr, IpNet::V6(_));
    let bits = family_bits(v6);
    let host_bits = bits - cidr.prefix_len();
    let lo = addr_to_u128(cidr.network());
    let size = pool_size(host_bits);
    if as_prefix {
        let len = cidr.prefix_len() + (b % (u128::from(host_bits) + 1)) as u8;
        let start = lo + a % size;
        let net = IpNet::new(to_addr(v6, start), len).unwrap().trunc();
        (None, Some(net))
    } else {
        let first = lo + a % size;
        let room = addr_to_u128(cidr.broadcast()) - first;
        // Mostly short runs, sometimes long ones.
        let len = b % (room.min(u128::from(u16::MAX)).saturating_add(1));
        let last = if b & 1 == 1 {
            first + len
        } else {
            first + room / (1 + (b >> 1) % 64)
        };
        (Some((to_addr(v6, first), to_addr(v6, last))), None)
    }
}

fn build(s: &Setup) -> Option<FleetPool> {
    let bits = family_bits(s.v6);
    let len = bits - s.host_bits;
    let cidr = IpNet::new(to_addr(s.v6, s.base & runs::host_mask(bits, 0)), len)
        .unwrap()
        .trunc();
    let kind = if s.prefix {
        let deeper = (s.size_raw % (u128::from(s.host_bits.min(10)) + 1)) as u8;
        FleetKind::Prefix { len: len + deeper }
    } else {
        let cap = pool_size(s.host_bits) / u128::from(s.divisor);
        FleetKind::Range {
            per_cluster: between_one_and(s.size_raw, cap),
        }
    };
    let mut ranges = Vec::new();
    let mut prefixes = Vec::new();
    for &(as_prefix, a, b) in &s.exclusions {
        let (r, p) = exclusion(&cidr, as_prefix, a, b);
        ranges.extend(r);
        prefixes.extend(p);
    }
    FleetPool::new(kind, cidr, ranges, prefixes).ok()
}

fn runs_of(a: &Allocation) -> Vec<(u128, u128)> {
    match a {
        Allocation::Range(runs) => runs
            .iter()
            .map(|&(f, l)| (addr_to_u128(f), addr_to_u128(l)))
            .collect(),
        Allocation::Prefix(net) => {
            vec![(addr_to_u128(net.network()), addr_to_u128(net.broadcast()))]
        }
    }
}

fn overlaps(a: (u128, u128), b: (u128, u128)) -> bool {
    a.0 <= b.1 && b.0 <= a.1
}

/// The invariants, checked by brute comparison of every pair.
fn check_invariants(
    pool: &FleetPool,
    exclusions: &[(u128, u128)],
    all: &[(String, Allocation)],
) -> Result<(), TestCaseError> {
    let cidr = pool.cidr();
    let (net, bcast) = (addr_to_u128(cidr.network()), addr_to_u128(cidr.broadcast()));
    // Only a range pool keeps its IPv4 network and broadcast addresses back: a prefix pool's
    // subnets are the clusters' to use.
    let edges = matches!(pool.kind(), FleetKind::Range { .. })
        && matches!(cidr, IpNet::V4(n) if n.prefix_len() < 31);
    let mut every: Vec<((u128, u128), &str)> = Vec::new();
    for (cluster, a) in all {
        if let Allocation::Prefix(n) = a {
            prop_assert_eq!(*n, n.trunc(), "{} got an unaligned prefix", cluster);
        }
        for run in runs_of(a) {
            prop_assert!(run.0 <= run.1, "{} got a reversed run", cluster);
            prop_assert!(
                net <= run.0 && run.1 <= bcast,
                "{} got {} outside {}",
                cluster,
                a,
                cidr
            );
            for &x in exclusions {
                prop_assert!(!overlaps(run, x), "{} got {}, excluded {:?}", cluster, a, x);
            }
            if edges {
                prop_assert!(
                    !overlaps(run, (net, net)) && !overlaps(run, (bcast, bcast)),
                    "{} got {}, which holds {}'s network or broadcast",
                    cluster,
                    a,
                    cidr
                );
            }
            every.push((run, cluster));
        }
        let problems: Vec<_> = check_allocation(pool, all, cluster, a)
            .into_iter()
            .filter(|p| !matches!(p, AllocationProblem::WrongPrefixLength { .. }))
            .collect();
        prop_assert!(problems.is_empty(), "{} {}: {:?}", cluster, a, problems);
    }
    every.sort();
    for w in every.windows(2) {
        prop_assert!(
            !overlaps(w[0].0, w[1].0),
            "{} and {} overlap at {:?} / {:?}",
            w[0].1,
            w[1].1,
            w[0].0,
            w[1].0
        );
    }
    Ok(())
}

/// A prefix pool refused a cluster: every aligned prefix of length `len` overlaps an exclusion
/// or an allocation (checked one by one when there are at most 4096 of them), so none that
/// could be handed out was kept back, the pool's first and last included.
fn no_aligned_prefix_is_free(
    pool: &FleetPool,
    len: u8,
    all: &[(String, Allocation)],
) -> Result<(), TestCaseError> {
    let cidr = pool.cidr();
    if len - cidr.prefix_len() > 12 {
        return Ok(());
    }
    let taken: Vec<(u128, u128)> = exclusion_runs(pool)
        .into_iter()
        .chain(all.iter().flat_map(|(_, a)| runs_of(a)))
        .collect();
    let mask = runs::host_mask(cidr.max_prefix_len(), len);
    let first = addr_to_u128(cidr.network());
    for i in 0..(1u128 << (len - cidr.prefix_len())) {
        // (`mask + 1` overflows only for a /0, which holds one prefix.)
        let lo = if i == 0 {
            first
        } else {
            first + i * (mask + 1)
        };
        let candidate = (lo, lo + mask);
        prop_assert!(
            taken.iter().any(|&t| overlaps(t, candidate)),
            "/{} at {} is free, yet the pool refused a cluster",
            len,
            u128_to_addr(pool.family(), lo)
        );
    }
    Ok(())
}

fn exclusion_runs(pool: &FleetPool) -> Vec<(u128, u128)> {
    let ranges = pool
        .exclude_ranges()
        .iter()
        .map(|&(f, l)| (addr_to_u128(f), addr_to_u128(l)));
    let prefixes = pool
        .exclude_prefixes()
        .iter()
        .map(|n| (addr_to_u128(n.network()), addr_to_u128(n.broadcast())));
    ranges.chain(prefixes).collect()
}

fn run(setup: Setup, ops: Vec<Op>) -> Result<(), TestCaseError> {
    let Some(mut pool) = build(&setup) else {
        return Ok(());
    };
    let mut all: Vec<(String, Allocation)> = Vec::new();
    let mut next = 0usize;
    for op in ops {
        match op {
            Op::New => {
                let name = format!("c{next}");
                next += 1;
                match allocate(&pool, &all, &name, None) {
                    Ok(a) => {
                        match (pool.kind(), &a) {
                            (FleetKind::Range { per_cluster }, Allocation::Range(_)) => {
                                prop_assert_eq!(a.len(), per_cluster)
                            }
                            (FleetKind::Prefix { len }, Allocation::Prefix(n)) => {
                                prop_assert_eq!(n.prefix_len(), len)
                            }
                            _ => prop_assert!(false, "{} is not of the pool's type", a),
                        }
                        all.push((name, a));
                    }
                    Err(FleetError::NoFreePrefix { len, .. }) => {
                        no_aligned_prefix_is_free(&pool, len, &all)?
                    }
                    Err(FleetError::Exhausted { .. }) => {}
                    Err(e) => prop_assert!(false, "unexpected refusal: {}", e),
                }
            }
            Op::Resize(raw) => {
                let kind = match pool.kind() {
                    FleetKind::Range { per_cluster } => FleetKind::Range {
                        per_cluster: between_one_and(raw, per_cluster.saturating_mul(3)),
                    },
                    FleetKind::Prefix { .. } => {
                        let (min, max) = (pool.cidr().prefix_len(), pool.cidr().max_prefix_len());
                        FleetKind::Prefix {
                            len: min + (raw % (u128::from(max - min) + 1)) as u8,
                        }
                    }
                };
                let Ok(resized) = pool.with_kind(kind) else {
                    continue;
                };
                let refusals = check_edit(Some(&pool), Some(&resized), &all);
                let prefix_changed =
                    pool.kind() != kind && matches!(kind, FleetKind::Prefix { .. });
                prop_assert_eq!(
                    refusals.len(),
                    usize::from(prefix_changed),
                    "{:?}",
                    refusals
                );
                pool = resized;
                for i in 0..all.len() {
                    let (cluster, current) = all[i].clone();
                    match allocate(&pool, &all, &cluster, Some(&current)) {
                        Ok(after) => {
                            let (before, grown) = (runs_of(&current), runs_of(&after));
                            prop_assert!(
                                grown.starts_with(&before),
                                "{}: {} became {}",
                                cluster,
                                current,
                                after
                            );
                            if let FleetKind::Range { per_cluster } = kind {
                                prop_assert_eq!(after.len(), per_cluster.max(current.len()));
                            } else {
                                prop_assert_eq!(&after, &current);
                            }
                            all[i].1 = after;
                        }
                        Err(FleetError::Exhausted { .. }) => {}
                        Err(FleetError::PrefixLengthLowered {
                            current: n, len, ..
                        }) => {
                            prop_assert!(len < n.prefix_len())
                        }
                        Err(e) => prop_assert!(false, "unexpected refusal: {}", e),
                    }
                }
            }
            Op::Release(i) => {
                if !all.is_empty() {
                    all.remove(i % all.len());
                }
            }
            Op::Exclude(a, b) => {
                let (r, p) = exclusion(&pool.cidr(), a & 1 == 1, a >> 1, b);
                let mut ranges = pool.exclude_ranges().to_vec();
                let mut prefixes = pool.exclude_prefixes().to_vec();
                ranges.extend(r);
                prefixes.extend(p);
                let Ok(edited) = FleetPool::new(pool.kind(), pool.cidr(), ranges, prefixes) else {
                    continue;
                };
                let refusals = check_edit(Some(&pool), Some(&edited), &all);
                let new_run = r
                    .map(|(f, l)| (addr_to_u128(f), addr_to_u128(l)))
                    .or_else(|| p.map(|n| (addr_to_u128(n.network()), addr_to_u128(n.broadcast()))))
                    .unwrap();
                let hit = all
                    .iter()
                    .any(|(_, al)| runs_of(al).into_iter().any(|x| overlaps(x, new_run)));
                prop_assert_eq!(!refusals.is_empty(), hit, "{:?}", refusals);
                if refusals.is_empty() {
                    pool = edited;
                }
            }
        }
        check_invariants(&pool, &exclusion_runs(&pool), &all)?;
    }
    Ok(())
}

/// Clusters already holding addresses anywhere in the pool (placed as another tool would place
/// them, not by [`allocate`]), then a new `allocationRange` and every cluster, holders and new
/// ones, reconciled in a random order against all the others.
fn grow(
    setup: Setup,
    holders: Vec<(u128, u128)>,
    resize: u128,
    order: Vec<u64>,
) -> Result<(), TestCaseError> {
    let Some(pool) = build(&setup) else {
        return Ok(());
    };
    let cidr = pool.cidr();
    let v6 = matches!(cidr, IpNet::V6(_));
    let (net, bcast) = (addr_to_u128(cidr.network()), addr_to_u128(cidr.broadcast()));
    let host = bcast - net;
    let mut blocked = exclusion_runs(&pool);
    if matches!(pool.kind(), FleetKind::Range { .. })
        && matches!(cidr, IpNet::V4(n) if n.prefix_len() < 31)
    {
        blocked.extend([(net, net), (bcast, bcast)]);
    }
    let mut all: Vec<(String, Allocation)> = Vec::new();
    for (i, &(a, b)) in holders.iter().enumerate() {
        let offset = if host == u128::MAX { a } else { a % (host + 1) };
        let (run, held) = match pool.kind() {
            FleetKind::Range { per_cluster } => {
                let first = net + offset;
                let last = first
                    .saturating_add(b % per_cluster.saturating_mul(2).max(1))
                    .min(bcast);
                let held = Allocation::Range(vec![(to_addr(v6, first), to_addr(v6, last))]);
                ((first, last), held)
            }
            FleetKind::Prefix { len } => {
                let mask = runs::host_mask(cidr.max_prefix_len(), len);
                let start = net | (offset & !mask);
                let held = Allocation::Prefix(IpNet::new(to_addr(v6, start), len).unwrap());
                ((start, start + mask), held)
            }
        };
        let placed = all.iter().flat_map(|(_, a)| runs_of(a));
        if blocked
            .iter()
            .copied()
            .chain(placed)
            .any(|x| overlaps(x, run))
        {
            continue;
        }
        all.push((format!("h{i}"), held));
    }
    let kind = match pool.kind() {
        FleetKind::Range { per_cluster } => FleetKind::Range {
            per_cluster: between_one_and(resize, per_cluster.saturating_mul(3)),
        },
        prefix => prefix,
    };
    let Ok(pool) = pool.with_kind(kind) else {
        return Ok(());
    };
    check_invariants(&pool, &exclusion_runs(&pool), &all)?;
    let mut names: Vec<(u64, String)> = all
        .iter()
        .map(|(n, _)| n.clone())
        .chain((0..3).map(|i| format!("n{i}")))
        .zip(order.iter().copied().chain(std::iter::repeat(0)))
        .map(|(n, key)| (key, n))
        .collect();
    names.sort();
    for (_, name) in names {
        let current = all.iter().find(|(n, _)| *n == name).map(|(_, a)| a.clone());
        match allocate(&pool, &all, &name, current.as_ref()) {
            Ok(after) => {
                match (&current, pool.kind()) {
                    (Some(before), FleetKind::Range { per_cluster }) => {
                        prop_assert!(
                            runs_of(&after).starts_with(&runs_of(before)),
                            "{}: {} became {}",
                            name,
                            before,
                            after
                        );
                        prop_assert_eq!(after.len(), per_cluster.max(before.len()));
                    }
                    (Some(before), FleetKind::Prefix { .. }) => prop_assert_eq!(&after, before),
                    (None, FleetKind::Range { per_cluster }) => {
                        prop_assert_eq!(after.len(), per_cluster)
                    }
                    (None, FleetKind::Prefix { len }) => {
                        prop_assert!(
                            matches!(after, Allocation::Prefix(n) if n.prefix_len() == len)
                        )
                    }
                }
                all.retain(|(n, _)| *n != name);
                all.push((name, after));
            }
            Err(FleetError::Exhausted { .. }) => {
                let short = match pool.kind() {
                    FleetKind::Range { per_cluster } => {
                        current.as_ref().map_or(0, Allocation::len) < per_cluster
                    }
                    FleetKind::Prefix { .. } => false,
                };
                prop_assert!(short, "{} refused while it holds enough", name);
            }
            Err(FleetError::NoFreePrefix { len, .. }) if current.is_none() => {
                no_aligned_prefix_is_free(&pool, len, &all)?
            }
            Err(e) => prop_assert!(false, "unexpected refusal: {}", e),
        }
        check_invariants(&pool, &exclusion_runs(&pool), &all)?;
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn allocations_never_overlap_each_other_exclusions_or_edges(
        setup in setup(),
        ops in prop::collection::vec(op(), 1..40),
    ) {
        run(setup, ops)?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    /// Small IPv4 pools fill up: exhaustion, fragmentation and growth into scattered holes.
    #[test]
    fn small_pools_fill_up_without_overlap(
        base in any::<u32>(),
        host_bits in 2..=8u8,
        prefix in any::<bool>(),
        size_raw in any::<u128>(),
        exclusions in prop::collection::vec((any::<bool>(), any::<u128>(), any::<u128>()), 0..6),
        ops in prop::collection::vec(op(), 1..60),
    ) {
        let setup = Setup {
            v6: false,
            base: base.into(),
            host_bits,
            prefix,
            size_raw,
            divisor: 8,
            exclusions,
        };
        run(setup, ops)?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Holders anywhere, growth, new clusters: nobody overlaps, nobody's runs change.
    #[test]
    fn growth_keeps_every_holder_and_takes_nothing_held(
        setup in setup(),
        holders in prop::collection::vec((any::<u128>(), any::<u128>()), 0..12),
        resize in any::<u128>(),
        order in prop::collection::vec(any::<u64>(), 0..16),
    ) {
        grow(setup, holders, resize, order)?;
    }

    /// The same in small IPv4 pools, where holders sit next to each other and growth runs out.
    #[test]
    fn growth_in_small_pools_keeps_every_holder_and_takes_nothing_held(
        base in any::<u32>(),
        host_bits in 2..=8u8,
        prefix in any::<bool>(),
        size_raw in any::<u128>(),
        exclusions in prop::collection::vec((any::<bool>(), any::<u128>(), any::<u128>()), 0..3),
        holders in prop::collection::vec((any::<u128>(), any::<u128>()), 0..16),
        resize in any::<u128>(),
        order in prop::collection::vec(any::<u64>(), 0..20),
    ) {
        let setup = Setup {
            v6: false,
            base: base.into(),
            host_bits,
            prefix,
            size_raw,
            divisor: 8,
            exclusions,
        };
        grow(setup, holders, resize, order)?;
    }
}
