//! Address-set arithmetic: sets of IPv4 or IPv6 addresses as sorted, disjoint, inclusive ranges.
//!
//! Every operation costs O(ranges), never O(addresses), so a /8 or an IPv6 /64 costs the same as
//! a /24 (Spiderpool's set difference over every address took over a minute for a /10).

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum IpFamily {
    #[serde(rename = "ipv4")]
    V4,
    #[serde(rename = "ipv6")]
    V6,
}

impl IpFamily {
    pub fn of(addr: IpAddr) -> Self {
        match addr {
            IpAddr::V4(_) => IpFamily::V4,
            IpAddr::V6(_) => IpFamily::V6,
        }
    }

    pub fn of_net(net: &IpNet) -> Self {
        Self::of(net.addr())
    }

    /// The `ipVersion` number of the CRDs.
    pub fn version(self) -> u8 {
        match self {
            IpFamily::V4 => 4,
            IpFamily::V6 => 6,
        }
    }

    pub fn from_version(v: u8) -> Option<Self> {
        match v {
            4 => Some(IpFamily::V4),
            6 => Some(IpFamily::V6),
            _ => None,
        }
    }

    pub(crate) fn max(self) -> u128 {
        match self {
            IpFamily::V4 => u32::MAX as u128,
            IpFamily::V6 => u128::MAX,
        }
    }
}

impl fmt::Display for IpFamily {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            IpFamily::V4 => "ipv4",
            IpFamily::V6 => "ipv6",
        })
    }
}

pub fn addr_to_u128(addr: IpAddr) -> u128 {
    match addr {
        IpAddr::V4(a) => u32::from(a) as u128,
        IpAddr::V6(a) => u128::from(a),
    }
}

pub fn u128_to_addr(family: IpFamily, n: u128) -> IpAddr {
    match family {
        IpFamily::V4 => IpAddr::V4(Ipv4Addr::from(n as u32)),
        IpFamily::V6 => IpAddr::V6(Ipv6Addr::from(n)),
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AddrError {
    #[error("`{entry}` is not an address, a range \"first-last\" or a CIDR")]
    Unparsable { entry: String },
    #[error("`{entry}` is {found}, but this set holds {expected} addresses")]
    WrongFamily {
        entry: String,
        expected: IpFamily,
        found: IpFamily,
    },
    #[error("range `{entry}` ends before it starts: write the lower address first")]
    Reversed { entry: String },
}

/// A set of addresses of one family.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct AddrSet {
    family: IpFamily,
    /// Sorted, disjoint, non-adjacent inclusive ranges.
    ranges: Vec<(u128, u128)>,
}

impl fmt::Debug for AddrSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "AddrSet{:?}", self.to_entries())
    }
}

impl AddrSet {
    pub fn empty(family: IpFamily) -> Self {
        AddrSet {
            family,
            ranges: Vec::new(),
        }
    }

    pub fn family(&self) -> IpFamily {
        self.family
    }

    pub fn from_net(net: &IpNet) -> Self {
        let family = IpFamily::of_net(net);
        AddrSet {
            family,
            ranges: vec![(addr_to_u128(net.network()), addr_to_u128(net.broadcast()))],
        }
    }

    /// Every address of a subnet that a host may use: for IPv4 shorter than /31, the network
    /// and broadcast addresses are left out; for IPv6, the subnet-router anycast address.
    pub fn usable_hosts(net: &IpNet) -> Self {
        let mut set = Self::from_net(net);
        let (first, last) = set.ranges[0];
        match net {
            IpNet::V4(n) if n.prefix_len() < 31 => {
                set.remove_range(first, first);
                set.remove_range(last, last);
            }
            IpNet::V6(n) if n.prefix_len() < 127 => set.remove_range(first, first),
            _ => {}
        }
        set
    }

    pub fn single(addr: IpAddr) -> Self {
        let n = addr_to_u128(addr);
        AddrSet {
            family: IpFamily::of(addr),
            ranges: vec![(n, n)],
        }
    }

    /// The addresses of `family` among `addresses` (others are left out), in O(n log n): for
    /// sets built from many single addresses, such as every claim of a pool.
    pub fn from_addresses(family: IpFamily, addresses: impl IntoIterator<Item = IpAddr>) -> Self {
        let ranges = addresses
            .into_iter()
            .filter(|a| IpFamily::of(*a) == family)
            .map(|a| {
                let n = addr_to_u128(a);
                (n, n)
            })
            .collect();
        Self::from_ranges(family, ranges)
    }

    /// Parses Spiderpool-style entries: `"10.0.0.1"`, `"10.0.0.10-10.0.0.20"`, or a CIDR.
    pub fn parse_entries<S: AsRef<str>>(
        family: IpFamily,
        entries: &[S],
    ) -> Result<Self, AddrError> {
        let mut ranges = Vec::with_capacity(entries.len());
        for entry in entries {
            let entry = entry.as_ref().trim();
            let (first, last) = parse_entry(entry)?;
            for a in [first, last] {
                let found = IpFamily::of(a);
                if found != family {
                    return Err(AddrError::WrongFamily {
                        entry: entry.to_string(),
                        expected: family,
                        found,
                    });
                }
            }
            let (lo, hi) = (addr_to_u128(first), addr_to_u128(last));
            if lo > hi {
                return Err(AddrError::Reversed {
                    entry: entry.to_string(),
                });
            }
            ranges.push((lo, hi));
        }
        Ok(Self::from_ranges(family, ranges))
    }

    /// Parses what it can: the set of the entries that parse (and are of `family`), and an
    /// error for each entry that does not. For fail-safe loading: a ReservedIP with one typo
    /// still reserves everything else it lists.
    pub fn parse_entries_lenient<S: AsRef<str>>(
        family: IpFamily,
        entries: &[S],
    ) -> (Self, Vec<AddrError>) {
        let mut set = AddrSet::empty(family);
        let mut errors = Vec::new();
        for entry in entries {
            match Self::parse_entries(family, std::slice::from_ref(entry)) {
                Ok(one) => set = set.union(&one),
                Err(e) => errors.push(e),
            }
        }
        (set, errors)
    }

    /// The sorted, disjoint, non-adjacent inclusive ranges as numbers (for range-level
    /// algorithms in this crate).
    pub(crate) fn raw_ranges(&self) -> &[(u128, u128)] {
        &self.ranges
    }

    /// A set from inclusive ranges as numbers, in any order, overlapping or not.
    pub(crate) fn from_ranges(family: IpFamily, mut ranges: Vec<(u128, u128)>) -> Self {
        ranges.sort_unstable();
        let mut merged: Vec<(u128, u128)> = Vec::with_capacity(ranges.len());
        for (lo, hi) in ranges {
            match merged.last_mut() {
                Some(last) if lo <= last.1.saturating_add(1) => last.1 = last.1.max(hi),
                _ => merged.push((lo, hi)),
            }
        }
        AddrSet {
            family,
            ranges: merged,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    /// Number of addresses, saturating at `u64::MAX` (an IPv6 /0 holds 2^128).
    pub fn len(&self) -> u64 {
        let total: u128 = self.ranges.iter().fold(0u128, |acc, (lo, hi)| {
            acc.saturating_add((hi - lo).saturating_add(1))
        });
        u64::try_from(total).unwrap_or(u64::MAX)
    }

    pub fn contains(&self, addr: IpAddr) -> bool {
        if IpFamily::of(addr) != self.family {
            return false;
        }
        let n = addr_to_u128(addr);
        let i = self.ranges.partition_point(|&(_, hi)| hi < n);
        self.ranges.get(i).is_some_and(|&(lo, _)| lo <= n)
    }

    pub fn union(&self, other: &AddrSet) -> AddrSet {
        if other.family != self.family {
            return self.clone();
        }
        let mut ranges = self.ranges.clone();
        ranges.extend_from_slice(&other.ranges);
        Self::from_ranges(self.family, ranges)
    }

    /// One sweep over both lists: O(ranges of self + ranges of other).
    pub fn difference(&self, other: &AddrSet) -> AddrSet {
        if other.family != self.family {
            return self.clone();
        }
        let mut ranges = Vec::with_capacity(self.ranges.len());
        let mut j = 0;
        for &(lo, hi) in &self.ranges {
            // Skip what ends before this range; what is left of it starts at `from`.
            while j < other.ranges.len() && other.ranges[j].1 < lo {
                j += 1;
            }
            let mut from = lo;
            let mut k = j;
            let mut consumed = false;
            while k < other.ranges.len() && other.ranges[k].0 <= hi {
                let (b_lo, b_hi) = other.ranges[k];
                if b_lo > from {
                    ranges.push((from, b_lo - 1));
                }
                if b_hi >= hi {
                    consumed = true;
                    break;
                }
                from = from.max(b_hi + 1);
                k += 1;
            }
            if !consumed {
                ranges.push((from, hi));
            }
            j = k;
        }
        AddrSet {
            family: self.family,
            ranges,
        }
    }

    pub fn intersection(&self, other: &AddrSet) -> AddrSet {
        if other.family != self.family {
            return AddrSet::empty(self.family);
        }
        let (mut i, mut j) = (0, 0);
        let mut ranges = Vec::new();
        while i < self.ranges.len() && j < other.ranges.len() {
            let (a_lo, a_hi) = self.ranges[i];
            let (b_lo, b_hi) = other.ranges[j];
            let (lo, hi) = (a_lo.max(b_lo), a_hi.min(b_hi));
            if lo <= hi {
                ranges.push((lo, hi));
            }
            if a_hi < b_hi {
                i += 1;
            } else {
                j += 1;
            }
        }
        AddrSet {
            family: self.family,
            ranges,
        }
    }

    pub fn is_subset(&self, other: &AddrSet) -> bool {
        self.difference(other).is_empty()
    }

    pub fn overlaps(&self, other: &AddrSet) -> bool {
        !self.intersection(other).is_empty()
    }

    fn remove_range(&mut self, lo: u128, hi: u128) {
        let mut out = Vec::with_capacity(self.ranges.len() + 1);
        for &(a, b) in &self.ranges {
            if b < lo || a > hi {
                out.push((a, b));
                continue;
            }
            if a < lo {
                out.push((a, lo - 1));
            }
            if b > hi {
                out.push((hi + 1, b));
            }
        }
        self.ranges = out;
    }

    pub fn insert(&mut self, addr: IpAddr) {
        if IpFamily::of(addr) == self.family {
            let n = addr_to_u128(addr);
            self.ranges.push((n, n));
            *self = Self::from_ranges(self.family, std::mem::take(&mut self.ranges));
        }
    }

    pub fn remove(&mut self, addr: IpAddr) {
        if IpFamily::of(addr) == self.family {
            let n = addr_to_u128(addr);
            self.remove_range(n, n);
        }
    }

    /// The lowest address in the set.
    pub fn first(&self) -> Option<IpAddr> {
        self.ranges
            .first()
            .map(|&(lo, _)| u128_to_addr(self.family, lo))
    }

    /// The ranges as inclusive (first, last) address pairs.
    pub fn ranges(&self) -> impl Iterator<Item = (IpAddr, IpAddr)> + '_ {
        self.ranges
            .iter()
            .map(|&(lo, hi)| (u128_to_addr(self.family, lo), u128_to_addr(self.family, hi)))
    }

    /// Spiderpool-style entries: single addresses and "first-last" ranges.
    pub fn to_entries(&self) -> Vec<String> {
        self.ranges()
            .map(|(lo, hi)| {
                if lo == hi {
                    lo.to_string()
                } else {
                    format!("{lo}-{hi}")
                }
            })
            .collect()
    }

    /// Iterates the addresses in order. Lazy: safe on huge sets when bounded by the caller.
    pub fn iter(&self) -> impl Iterator<Item = IpAddr> + '_ {
        let family = self.family;
        debug_assert!(self.ranges.iter().all(|&(_, hi)| hi <= family.max()));
        self.ranges
            .iter()
            .flat_map(move |&(lo, hi)| RangeIter {
                next: Some(lo),
                last: hi,
            })
            .map(move |n| u128_to_addr(family, n))
    }
}

struct RangeIter {
    next: Option<u128>,
    last: u128,
}

impl Iterator for RangeIter {
    type Item = u128;
    fn next(&mut self) -> Option<u128> {
        let n = self.next?;
        self.next = if n < self.last { Some(n + 1) } else { None };
        Some(n)
    }
}

fn parse_entry(entry: &str) -> Result<(IpAddr, IpAddr), AddrError> {
    let unparsable = || AddrError::Unparsable {
        entry: entry.to_string(),
    };
    if let Some((a, b)) = entry.split_once('-') {
        let a: IpAddr = a.trim().parse().map_err(|_| unparsable())?;
        let b: IpAddr = b.trim().parse().map_err(|_| unparsable())?;
        return Ok((a, b));
    }
    if entry.contains('/') {
        let net: IpNet = entry.parse().map_err(|_| unparsable())?;
        return Ok((net.network(), net.broadcast()));
    }
    let a: IpAddr = entry.parse().map_err(|_| unparsable())?;
    Ok((a, a))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v4(entries: &[&str]) -> AddrSet {
        AddrSet::parse_entries(IpFamily::V4, entries).unwrap()
    }

    #[test]
    fn parses_singles_ranges_and_cidrs_and_merges_them() {
        let s = v4(&["10.0.0.5", "10.0.0.1-10.0.0.4", "10.0.0.8/30", "10.0.0.6"]);
        assert_eq!(
            s.to_entries(),
            vec!["10.0.0.1-10.0.0.6", "10.0.0.8-10.0.0.11"]
        );
        assert_eq!(s.len(), 10);
    }

    #[test]
    fn rejects_bad_entries_with_the_entry_named() {
        let err = AddrSet::parse_entries(IpFamily::V4, &["10.0.0.9-10.0.0.1"]).unwrap_err();
        assert!(err.to_string().contains("10.0.0.9-10.0.0.1"), "{err}");
        let err = AddrSet::parse_entries(IpFamily::V4, &["fd00::1"]).unwrap_err();
        assert!(matches!(err, AddrError::WrongFamily { .. }));
        let err = AddrSet::parse_entries(IpFamily::V4, &["10.0.0.x"]).unwrap_err();
        assert!(matches!(err, AddrError::Unparsable { .. }));
    }

    #[test]
    fn difference_intersection_subset() {
        let a = v4(&["10.0.0.1-10.0.0.100"]);
        let b = v4(&["10.0.0.10-10.0.0.19", "10.0.0.50"]);
        let d = a.difference(&b);
        assert_eq!(d.len(), 89);
        assert!(!d.contains("10.0.0.15".parse().unwrap()));
        assert!(d.contains("10.0.0.51".parse().unwrap()));
        assert_eq!(a.intersection(&b), b);
        assert!(b.is_subset(&a));
        assert!(!a.is_subset(&b));
        assert!(a.overlaps(&b));
    }

    #[test]
    fn usable_hosts_leave_out_network_and_broadcast() {
        let s = AddrSet::usable_hosts(&"10.0.0.0/24".parse().unwrap());
        assert_eq!(s.len(), 254);
        assert_eq!(s.first(), Some("10.0.0.1".parse().unwrap()));
        let p2p = AddrSet::usable_hosts(&"10.0.0.0/31".parse().unwrap());
        assert_eq!(p2p.len(), 2);
        let v6 = AddrSet::usable_hosts(&"fd00::/64".parse().unwrap());
        assert_eq!(v6.len(), u64::MAX); // 2^64 - 1 saturates nowhere, it is exactly u64::MAX
    }

    #[test]
    fn sets_from_single_addresses_merge_runs_and_keep_one_family() {
        let addrs = [
            "10.0.0.3", "10.0.0.1", "fd00::1", "10.0.0.2", "10.0.0.9", "10.0.0.2",
        ]
        .map(|a| a.parse::<IpAddr>().unwrap());
        let s = AddrSet::from_addresses(IpFamily::V4, addrs);
        assert_eq!(s.to_entries(), ["10.0.0.1-10.0.0.3", "10.0.0.9"]);
        let six = AddrSet::from_addresses(IpFamily::V6, addrs);
        assert_eq!(six.to_entries(), ["fd00::1"]);
    }

    #[test]
    fn huge_sets_cost_ranges_not_addresses() {
        let big = AddrSet::from_net(&"10.0.0.0/8".parse().unwrap());
        let holes = v4(&["10.1.0.0-10.1.255.255", "10.200.0.1"]);
        let d = big.difference(&holes);
        assert_eq!(d.len(), (1 << 24) - 65536 - 1);
        let v6 = AddrSet::from_net(&"::/0".parse().unwrap());
        assert_eq!(v6.len(), u64::MAX);
    }
}
