//! The free-address index of one pool: free addresses as disjoint ranges in a B-tree, with a
//! cursor. Taking or returning an address costs O(log ranges), so choosing an address costs the
//! same in a /24, a /8 at 90% use, or an IPv6 /64.
//!
//! Addresses are handed out from the cursor onwards, wrapping around, like host-local: a
//! just-released address is not reused at once (neighbours' ARP caches may still point at it).

use std::collections::BTreeMap;
use std::net::IpAddr;

use allot_core::addr::{AddrSet, IpFamily, addr_to_u128, u128_to_addr};

/// Pools spanning at most this many addresses use a bitmap (2 MiB for a /8); larger spans (an
/// IPv6 /64) use free ranges in a B-tree.
const BITMAP_MAX_SPAN: u128 = 1 << 24;

#[derive(Clone, Debug)]
pub struct FreeIndex {
    family: IpFamily,
    repr: Repr,
}

#[derive(Clone, Debug)]
enum Repr {
    Bitmap(Bitmap),
    Ranges(RangeIndex),
}

impl FreeIndex {
    /// Every address of `assignable` is free.
    pub fn new(assignable: &AddrSet) -> Self {
        let family = assignable.family();
        let span = match (assignable.ranges().next(), assignable.ranges().last()) {
            (Some((lo, _)), Some((_, hi))) => Some((addr_to_u128(lo), addr_to_u128(hi))),
            _ => None,
        };
        let repr = match span {
            Some((lo, hi)) if hi - lo < BITMAP_MAX_SPAN => {
                Repr::Bitmap(Bitmap::new(assignable, lo, hi))
            }
            _ => Repr::Ranges(RangeIndex::new(assignable)),
        };
        FreeIndex { family, repr }
    }

    pub fn family(&self) -> IpFamily {
        self.family
    }

    /// Free addresses, saturating at `u64::MAX`.
    pub fn free_count(&self) -> u64 {
        let free = match &self.repr {
            Repr::Bitmap(b) => b.free,
            Repr::Ranges(r) => r.free,
        };
        u64::try_from(free).unwrap_or(u64::MAX)
    }

    pub fn is_free(&self, addr: IpAddr) -> bool {
        IpFamily::of(addr) == self.family
            && match &self.repr {
                Repr::Bitmap(b) => b.is_free(addr_to_u128(addr)),
                Repr::Ranges(r) => r.range_of(addr_to_u128(addr)).is_some(),
            }
    }

    /// Marks `addr` used. Returns whether it was free.
    pub fn remove(&mut self, addr: IpAddr) -> bool {
        if IpFamily::of(addr) != self.family {
            return false;
        }
        match &mut self.repr {
            Repr::Bitmap(b) => b.set(addr_to_u128(addr), false),
            Repr::Ranges(r) => r.remove(addr_to_u128(addr)),
        }
    }

    /// Marks `addr` free again. The caller makes sure it belongs to the pool. Returns whether it
    /// was used.
    pub fn insert(&mut self, addr: IpAddr) -> bool {
        if IpFamily::of(addr) != self.family {
            return false;
        }
        match &mut self.repr {
            Repr::Bitmap(b) => b.set(addr_to_u128(addr), true),
            Repr::Ranges(r) => r.insert(addr_to_u128(addr)),
        }
    }

    /// Moves the cursor just past `addr`, as if `addr` had been the last address taken (a
    /// cursor carried across reloads and restarts). Addresses outside the pool are ignored.
    pub fn resume_after(&mut self, addr: IpAddr) {
        if IpFamily::of(addr) != self.family {
            return;
        }
        let n = addr_to_u128(addr);
        match &mut self.repr {
            Repr::Bitmap(b) => {
                if let Some(o) = b.offset(n) {
                    b.cursor = o + 1;
                }
            }
            Repr::Ranges(r) => {
                if (r.span.0..=r.span.1).contains(&n) {
                    r.cursor = n.wrapping_add(1);
                }
            }
        }
    }

    /// Moves the cursor to a place of the pool chosen by `seed`. After losing a race to another
    /// writer of the store, an engine jumps elsewhere instead of following the other writers
    /// address by address (they walk the same order and would win again).
    pub fn scatter(&mut self, seed: u64) {
        match &mut self.repr {
            Repr::Bitmap(b) => b.cursor = (seed % b.len.max(1) as u64) as usize,
            Repr::Ranges(r) => {
                let size = r.span.1 - r.span.0;
                r.cursor = r.span.0 + u128::from(seed) % size.saturating_add(1).max(1);
            }
        }
    }

    /// The cursor, as the last address taken (for [`FreeIndex::resume_after`]), if any.
    pub fn last_taken(&self) -> Option<IpAddr> {
        let n = match &self.repr {
            Repr::Bitmap(b) => b.base + (b.cursor.checked_sub(1)? as u128),
            Repr::Ranges(r) => r.cursor.checked_sub(1)?,
        };
        Some(u128_to_addr(self.family, n))
    }

    /// The next `n` addresses [`FreeIndex::take_next`] would hand out, in order, if nothing
    /// changed in between: the first free ones at or after the cursor, wrapping around. Takes
    /// nothing.
    pub fn upcoming(&self, n: usize) -> Vec<IpAddr> {
        let found = match &self.repr {
            Repr::Bitmap(b) => b.upcoming(n),
            Repr::Ranges(r) => r.upcoming(n),
        };
        found
            .into_iter()
            .map(|a| u128_to_addr(self.family, a))
            .collect()
    }

    /// Takes the first free address at or after the cursor, wrapping around, and moves the
    /// cursor past it.
    pub fn take_next(&mut self) -> Option<IpAddr> {
        let n = match &mut self.repr {
            Repr::Bitmap(b) => b.take_next()?,
            Repr::Ranges(r) => r.take_next()?,
        };
        Some(u128_to_addr(self.family, n))
    }
}

/// One bit per address of the pool's span (1: free), and one summary bit per word (1: the word
/// has a free address), so a search skips 4,096 used addresses per summary word read.
#[derive(Clone, Debug)]
struct Bitmap {
    base: u128,
    len: usize,
    words: Vec<u64>,
    summary: Vec<u64>,
    free: u128,
    /// Offset of the next address to try.
    cursor: usize,
}

impl Bitmap {
    fn new(assignable: &AddrSet, lo: u128, hi: u128) -> Self {
        let len = (hi - lo + 1) as usize;
        let mut b = Bitmap {
            base: lo,
            len,
            words: vec![0; len.div_ceil(64)],
            summary: vec![0; len.div_ceil(64).div_ceil(64)],
            free: 0,
            cursor: 0,
        };
        for (first, last) in assignable.ranges() {
            b.fill(
                (addr_to_u128(first) - lo) as usize,
                (addr_to_u128(last) - lo) as usize,
            );
        }
        b
    }

    /// Marks offsets `from..=to` free, a word at a time: a /8 is 2^18 word writes, not 2^24
    /// bit flips. Only for building (the offsets must all be used before).
    fn fill(&mut self, from: usize, to: usize) {
        let (first_word, last_word) = (from / 64, to / 64);
        for w in first_word..=last_word {
            let lo = if w == first_word { from % 64 } else { 0 };
            let hi = if w == last_word { to % 64 } else { 63 };
            let mask = (!0u64 >> (63 - hi)) & (!0u64 << lo);
            self.free += (mask & !self.words[w]).count_ones() as u128;
            self.words[w] |= mask;
            self.summary[w / 64] |= 1 << (w % 64);
        }
    }

    fn offset(&self, n: u128) -> Option<usize> {
        n.checked_sub(self.base)
            .filter(|&o| o < self.len as u128)
            .map(|o| o as usize)
    }

    fn is_free(&self, n: u128) -> bool {
        self.offset(n)
            .is_some_and(|o| self.words[o / 64] & (1 << (o % 64)) != 0)
    }

    /// Sets address `n` free (`true`) or used; returns whether that changed anything.
    fn set(&mut self, n: u128, free: bool) -> bool {
        let Some(o) = self.offset(n) else {
            return false;
        };
        let (w, bit) = (o / 64, 1u64 << (o % 64));
        if (self.words[w] & bit != 0) == free {
            return false;
        }
        if free {
            self.words[w] |= bit;
            self.summary[w / 64] |= 1 << (w % 64);
            self.free += 1;
        } else {
            self.words[w] &= !bit;
            if self.words[w] == 0 {
                self.summary[w / 64] &= !(1 << (w % 64));
            }
            self.free -= 1;
        }
        true
    }

    /// The first free offset at or after `from`, without wrapping.
    fn next_free(&self, from: usize) -> Option<usize> {
        if from >= self.len {
            return None;
        }
        let w = from / 64;
        let bits = self.words[w] & (!0u64 << (from % 64));
        if bits != 0 {
            return Some(w * 64 + bits.trailing_zeros() as usize);
        }
        // The next word with a free bit, through the summary.
        let start = w + 1;
        let mut s = start / 64;
        let mut mask = if start.is_multiple_of(64) {
            !0u64
        } else {
            !0u64 << (start % 64)
        };
        while s < self.summary.len() {
            let words = self.summary[s] & mask;
            if words != 0 {
                let w = s * 64 + words.trailing_zeros() as usize;
                return Some(w * 64 + self.words[w].trailing_zeros() as usize);
            }
            s += 1;
            mask = !0;
        }
        None
    }

    fn upcoming(&self, n: usize) -> Vec<u128> {
        let mut out = Vec::with_capacity(n.min(64));
        let cursor = self.cursor.min(self.len);
        let mut from = cursor;
        // From the cursor to the end, then from the start up to the cursor.
        for end in [self.len, cursor] {
            while out.len() < n
                && let Some(o) = self.next_free(from).filter(|&o| o < end)
            {
                out.push(self.base + o as u128);
                from = o + 1;
            }
            from = 0;
        }
        out
    }

    fn take_next(&mut self) -> Option<u128> {
        if self.free == 0 {
            return None;
        }
        let o = self.next_free(self.cursor).or_else(|| self.next_free(0))?;
        let n = self.base + o as u128;
        self.set(n, false);
        self.cursor = o + 1;
        Some(n)
    }
}

#[derive(Clone, Debug)]
struct RangeIndex {
    /// start → end (inclusive) of each free range; disjoint and non-adjacent.
    ranges: BTreeMap<u128, u128>,
    free: u128,
    /// The next address to try.
    cursor: u128,
    /// The first and last address of the pool.
    span: (u128, u128),
}

impl RangeIndex {
    fn new(assignable: &AddrSet) -> Self {
        let mut ranges = BTreeMap::new();
        let mut free = 0u128;
        for (lo, hi) in assignable.ranges() {
            let (lo, hi) = (addr_to_u128(lo), addr_to_u128(hi));
            ranges.insert(lo, hi);
            free = free.saturating_add((hi - lo).saturating_add(1));
        }
        let span = match (ranges.first_key_value(), ranges.last_key_value()) {
            (Some((&lo, _)), Some((_, &hi))) => (lo, hi),
            _ => (1, 0),
        };
        RangeIndex {
            ranges,
            free,
            cursor: 0,
            span,
        }
    }

    /// The range holding `n`, if `n` is free.
    fn range_of(&self, n: u128) -> Option<(u128, u128)> {
        self.ranges
            .range(..=n)
            .next_back()
            .filter(|&(_, &hi)| hi >= n)
            .map(|(&lo, &hi)| (lo, hi))
    }

    fn remove(&mut self, n: u128) -> bool {
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

    fn insert(&mut self, n: u128) -> bool {
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

    fn upcoming(&self, n: usize) -> Vec<u128> {
        let mut out = Vec::with_capacity(n.min(64));
        // The free range holding the cursor (from the cursor on), the ranges after it, then
        // the ranges before it (wrapping around), and the part of the cursor's range before it.
        let first = self
            .range_of(self.cursor)
            .map(|(lo, hi)| (self.cursor, hi, lo));
        let after = self
            .ranges
            .range(self.cursor.saturating_add(1)..)
            .map(|(&lo, &hi)| (lo, hi));
        let before = self
            .ranges
            .range(..=self.cursor)
            .map(|(&lo, &hi)| (lo, hi.min(self.cursor.saturating_sub(1))))
            .filter(|&(lo, hi)| lo <= hi && lo < self.cursor);
        let ranges = first
            .map(|(from, hi, _)| (from, hi))
            .into_iter()
            .chain(after)
            .chain(before);
        for (lo, hi) in ranges {
            let mut a = lo;
            while out.len() < n {
                out.push(a);
                if a == hi {
                    break;
                }
                a += 1;
            }
            if out.len() == n {
                break;
            }
        }
        out
    }

    fn take_next(&mut self) -> Option<u128> {
        let n = match self.range_of(self.cursor) {
            Some(_) => self.cursor,
            None => match self.ranges.range(self.cursor..).next() {
                Some((&lo, _)) => lo,
                None => *self.ranges.keys().next()?,
            },
        };
        self.remove(n);
        self.cursor = n.wrapping_add(1);
        Some(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scattering_moves_the_cursor_within_the_pool() {
        for cidr in ["10.0.0.0/24", "fd00::/64"] {
            let set = AddrSet::from_net(&cidr.parse().unwrap());
            let mut index = FreeIndex::new(&set);
            let first = index.take_next().unwrap();
            let mut seen = std::collections::BTreeSet::new();
            for seed in [3, 77, 200, u64::MAX] {
                index.scatter(seed);
                let taken = index.take_next().unwrap();
                assert!(set.contains(taken), "{taken} in {cidr}");
                seen.insert(taken);
            }
            assert!(
                seen.len() >= 3,
                "different seeds, different places: {seen:?}"
            );
            assert!(!seen.contains(&first));
        }
    }

    fn set(entries: &[&str]) -> AddrSet {
        AddrSet::parse_entries(IpFamily::V4, entries).unwrap()
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn is_bitmap(idx: &FreeIndex) -> bool {
        matches!(idx.repr, Repr::Bitmap(_))
    }

    /// The same addresses, once in a span small enough for the bitmap and once spread wide
    /// enough for the range tree: every behaviour is checked on both.
    fn both(entries: &[&str]) -> [FreeIndex; 2] {
        let small = FreeIndex::new(&set(entries));
        let mut spread: Vec<&str> = entries.to_vec();
        spread.push("11.255.255.255");
        let mut wide = FreeIndex::new(&set(&spread));
        wide.remove(ip("11.255.255.255"));
        assert!(is_bitmap(&small) && !is_bitmap(&wide));
        [small, wide]
    }

    #[test]
    fn takes_in_order_then_wraps_without_reusing_at_once() {
        for mut idx in both(&["10.0.0.1-10.0.0.3"]) {
            assert_eq!(idx.take_next(), Some(ip("10.0.0.1")));
            assert_eq!(idx.take_next(), Some(ip("10.0.0.2")));
            assert!(idx.insert(ip("10.0.0.1")));
            // The cursor moves on: .3 before the just-released .1.
            assert_eq!(idx.take_next(), Some(ip("10.0.0.3")));
            assert_eq!(idx.take_next(), Some(ip("10.0.0.1")));
            assert_eq!(idx.take_next(), None);
            assert_eq!(idx.free_count(), 0);
        }
    }

    #[test]
    fn upcoming_is_what_take_next_hands_out() {
        for idx in both(&["10.0.0.1-10.0.0.9", "10.0.0.20-10.0.0.22"]) {
            let mut a = idx.clone();
            a.take_next();
            a.take_next();
            a.remove(ip("10.0.0.5"));
            a.insert(ip("10.0.0.1"));
            for n in [0, 1, 3, 20] {
                let peeked = a.upcoming(n);
                let mut b = a.clone();
                let taken: Vec<IpAddr> = (0..n).map_while(|_| b.take_next()).collect();
                assert_eq!(peeked, taken, "n = {n}");
                assert_eq!(a.free_count(), idx.free_count() - 2, "nothing taken");
            }
            // Wrapped: .1 (free again, behind the cursor) comes last.
            assert_eq!(a.upcoming(20).last(), Some(&ip("10.0.0.1")));
            // The cursor in the middle of a free range: its start comes after the wrap.
            let mut c = idx.clone();
            c.resume_after(ip("10.0.0.3"));
            let mut d = c.clone();
            let taken: Vec<IpAddr> = (0..12).map_while(|_| d.take_next()).collect();
            assert_eq!(c.upcoming(12), taken);
        }
    }

    #[test]
    fn remove_and_insert_are_exact() {
        for mut idx in both(&["10.0.0.0/24"]) {
            assert_eq!(idx.free_count(), 256);
            assert!(idx.remove(ip("10.0.0.100")));
            assert!(!idx.remove(ip("10.0.0.100")), "already used");
            assert!(!idx.is_free(ip("10.0.0.100")));
            assert!(idx.is_free(ip("10.0.0.101")));
            assert!(idx.insert(ip("10.0.0.100")));
            assert!(!idx.insert(ip("10.0.0.100")), "already free");
            assert_eq!(idx.free_count(), 256);
            assert!(!idx.remove(ip("fd00::1")), "other family");
            assert!(!idx.remove(ip("10.0.1.1")), "outside the pool");
        }
    }

    #[test]
    fn the_range_tree_merges_neighbours() {
        let [_, mut wide] = both(&["10.0.0.0/24"]);
        wide.remove(ip("10.0.0.100"));
        wide.insert(ip("10.0.0.100"));
        let Repr::Ranges(r) = &wide.repr else {
            unreachable!()
        };
        assert_eq!(r.ranges.len(), 1, "merged back into one range");
    }

    #[test]
    fn never_hands_out_an_address_twice() {
        for mut idx in both(&["10.0.0.1-10.0.0.50", "10.0.1.1-10.0.1.50"]) {
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
    }

    #[test]
    fn the_bitmap_skips_long_used_stretches_and_wraps() {
        let mut idx = FreeIndex::new(&AddrSet::from_net(&"10.0.0.0/8".parse().unwrap()));
        assert!(is_bitmap(&idx));
        // Use everything but the last address and one near the start.
        let keep = [ip("10.0.0.5"), ip("10.255.255.255")];
        while idx.free_count() > 2 {
            let a = idx.take_next().unwrap();
            assert!(!keep.contains(&a) || idx.insert(a));
            if keep.contains(&a) {
                // Put it back and move on: the cursor has passed it.
                continue;
            }
        }
        let mut last_two = vec![idx.take_next().unwrap(), idx.take_next().unwrap()];
        last_two.sort();
        assert_eq!(last_two, keep);
        assert_eq!(idx.take_next(), None);
    }

    #[test]
    fn the_cursor_carries_over_to_a_new_index() {
        for [mut a, mut b] in [both(&["10.0.0.1-10.0.0.9"]), both(&["10.0.0.1-10.0.0.9"])] {
            assert_eq!(a.last_taken(), None);
            a.take_next();
            a.take_next();
            let last = a.last_taken().unwrap();
            assert_eq!(last, ip("10.0.0.2"));
            b.resume_after(last);
            assert_eq!(
                b.take_next(),
                Some(ip("10.0.0.3")),
                "continues, not restarts"
            );
            b.resume_after(ip("192.168.0.1"));
            b.resume_after(ip("fd00::1"));
            assert_eq!(
                b.take_next(),
                Some(ip("10.0.0.4")),
                "foreign cursors are ignored"
            );
        }
    }

    #[test]
    fn building_from_ranges_counts_exactly() {
        // Ranges that start and end mid-word, span words, and touch.
        let entries = [
            "10.0.0.3-10.0.0.70",
            "10.0.0.100",
            "10.0.1.0-10.0.3.255",
            "10.0.4.0",
        ];
        let idx = FreeIndex::new(&set(&entries));
        assert!(is_bitmap(&idx));
        assert_eq!(idx.free_count(), set(&entries).len());
        for probe in [
            "10.0.0.2",
            "10.0.0.71",
            "10.0.0.99",
            "10.0.0.101",
            "10.0.4.1",
        ] {
            assert!(!idx.is_free(ip(probe)), "{probe}");
        }
        for probe in [
            "10.0.0.3",
            "10.0.0.64",
            "10.0.0.70",
            "10.0.0.100",
            "10.0.2.7",
            "10.0.4.0",
        ] {
            assert!(idx.is_free(ip(probe)), "{probe}");
        }
        let mut idx = idx;
        let mut taken = 0;
        while idx.take_next().is_some() {
            taken += 1;
        }
        assert_eq!(taken, set(&entries).len());
    }

    #[test]
    fn huge_pools_cost_the_same() {
        let mut v6 = FreeIndex::new(&AddrSet::usable_hosts(&"fd00::/64".parse().unwrap()));
        assert!(!is_bitmap(&v6));
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
