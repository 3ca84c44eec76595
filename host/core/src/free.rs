//! The free-address index of one pool: free addresses as disjoint ranges in a B-tree, with a
//! cursor. Taking or returning an address costs O(log ranges), so choosing an address costs the
//! same in a /24, a /8 at 90% use, or an IPv6 /64.
//!
//! Addresses are handed out from the cursor onwards, wrapping around, like host-local: a
//! just-released address is not reused at once (neighbours' ARP caches may still point at it).

use std::collections::BTreeMap;
use std::net::IpAddr;

use crate::addr::{AddrSet, IpFamily, addr_to_u128, u128_to_addr};

#[derive(Clone, Debug)]
pub struct FreeIndex {
    family: IpFamily,
    /// start → end (inclusive) of each free range; disjoint and non-adjacent.
    ranges: BTreeMap<u128, u128>,
    free: u128,
    /// The next address to try.
    cursor: u128,
}

impl FreeIndex {
    /// Every address of `assignable` is free.
    pub fn new(assignable: &AddrSet) -> Self {
        let mut ranges = BTreeMap::new();
        let mut free = 0u128;
        for (lo, hi) in assignable.ranges() {
            let (lo, hi) = (addr_to_u128(lo), addr_to_u128(hi));
            ranges.insert(lo, hi);
            free = free.saturating_add((hi - lo).saturating_add(1));
        }
        FreeIndex {
            family: assignable.family(),
            ranges,
            free,
            cursor: 0,
        }
    }

    pub fn family(&self) -> IpFamily {
        self.family
    }

    /// Free addresses, saturating at `u64::MAX`.
    pub fn free_count(&self) -> u64 {
        u64::try_from(self.free).unwrap_or(u64::MAX)
    }

    /// The range holding `n`, if `n` is free.
    fn range_of(&self, n: u128) -> Option<(u128, u128)> {
        self.ranges
            .range(..=n)
            .next_back()
            .filter(|&(_, &hi)| hi >= n)
            .map(|(&lo, &hi)| (lo, hi))
    }

    pub fn is_free(&self, addr: IpAddr) -> bool {
        IpFamily::of(addr) == self.family && self.range_of(addr_to_u128(addr)).is_some()
    }

    /// Marks `addr` used. Returns whether it was free.
    pub fn remove(&mut self, addr: IpAddr) -> bool {
        if IpFamily::of(addr) != self.family {
            return false;
        }
        let n = addr_to_u128(addr);
        let Some((lo, hi)) = self.range_of(n) else {
            return false;
        };
        self.ranges.remove(&lo);
        if lo < n {
            self.ranges.insert(lo, n - 1);
        }
        if n < hi {
            self.ranges.insert(n + 1, hi);
        }
        self.free -= 1;
        true
    }

    /// Marks `addr` free again. The caller makes sure it belongs to the pool. Returns whether it
    /// was used.
    pub fn insert(&mut self, addr: IpAddr) -> bool {
        if IpFamily::of(addr) != self.family {
            return false;
        }
        let n = addr_to_u128(addr);
        if self.range_of(n).is_some() {
            return false;
        }
        let (mut lo, mut hi) = (n, n);
        // Merge with the range ending right before, and the one starting right after.
        if let Some((&plo, &phi)) = self.ranges.range(..n).next_back()
            && phi.checked_add(1) == Some(n)
        {
            self.ranges.remove(&plo);
            lo = plo;
        }
        if let Some(next) = n.checked_add(1)
            && let Some(nhi) = self.ranges.remove(&next)
        {
            hi = nhi;
        }
        self.ranges.insert(lo, hi);
        self.free += 1;
        true
    }

    /// Takes the first free address at or after the cursor, wrapping around, and moves the
    /// cursor past it.
    pub fn take_next(&mut self) -> Option<IpAddr> {
        let n = match self.range_of(self.cursor) {
            Some(_) => self.cursor,
            None => match self.ranges.range(self.cursor..).next() {
                Some((&lo, _)) => lo,
                None => *self.ranges.keys().next()?,
            },
        };
        let addr = u128_to_addr(self.family, n);
        self.remove(addr);
        self.cursor = n.wrapping_add(1);
        Some(addr)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(entries: &[&str]) -> AddrSet {
        AddrSet::parse_entries(IpFamily::V4, entries).unwrap()
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn takes_in_order_then_wraps_without_reusing_at_once() {
        let mut idx = FreeIndex::new(&set(&["10.0.0.1-10.0.0.3"]));
        assert_eq!(idx.take_next(), Some(ip("10.0.0.1")));
        assert_eq!(idx.take_next(), Some(ip("10.0.0.2")));
        assert!(idx.insert(ip("10.0.0.1")));
        // The cursor moves on: .3 before the just-released .1.
        assert_eq!(idx.take_next(), Some(ip("10.0.0.3")));
        assert_eq!(idx.take_next(), Some(ip("10.0.0.1")));
        assert_eq!(idx.take_next(), None);
        assert_eq!(idx.free_count(), 0);
    }

    #[test]
    fn remove_and_insert_split_and_merge_ranges() {
        let mut idx = FreeIndex::new(&set(&["10.0.0.0/24"]));
        assert_eq!(idx.free_count(), 256);
        assert!(idx.remove(ip("10.0.0.100")));
        assert!(!idx.remove(ip("10.0.0.100")), "already used");
        assert!(!idx.is_free(ip("10.0.0.100")));
        assert_eq!(idx.ranges.len(), 2);
        assert!(idx.insert(ip("10.0.0.100")));
        assert!(!idx.insert(ip("10.0.0.100")), "already free");
        assert_eq!(idx.ranges.len(), 1, "merged back into one range");
        assert_eq!(idx.free_count(), 256);
        assert!(!idx.remove(ip("fd00::1")), "other family");
    }

    #[test]
    fn never_hands_out_an_address_twice() {
        let mut idx = FreeIndex::new(&set(&["10.0.0.1-10.0.0.50", "10.0.1.1-10.0.1.50"]));
        let mut held = std::collections::BTreeSet::new();
        let mut takes = 0;
        while let Some(a) = idx.take_next() {
            assert!(held.insert(a), "{a} handed out while held");
            takes += 1;
            if takes % 7 == 0 {
                // Release the lowest held address now and then; it may come back, once.
                let back = *held.iter().next().unwrap();
                held.remove(&back);
                assert!(idx.insert(back));
            }
        }
        assert_eq!(held.len(), 100, "every address ends up held exactly once");
        assert_eq!(idx.free_count(), 0);
        assert!(takes > 100);
    }

    #[test]
    fn huge_pools_cost_the_same() {
        let mut v6 = FreeIndex::new(&AddrSet::usable_hosts(&"fd00::/64".parse().unwrap()));
        assert_eq!(v6.free_count(), u64::MAX);
        assert_eq!(v6.take_next(), Some(ip("fd00::1")));
        let mut big = FreeIndex::new(&AddrSet::from_net(&"10.0.0.0/8".parse().unwrap()));
        for i in 0..1000u32 {
            big.remove(u128_to_addr(IpFamily::V4, (0x0A00_0000 + i * 2) as u128));
        }
        assert_eq!(big.free_count(), (1 << 24) - 1000);
        assert_eq!(big.take_next(), Some(ip("10.0.0.1")));
    }
}
