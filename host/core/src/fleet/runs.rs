//! Runs: inclusive `(first, last)` intervals of addresses as `u128`, the only representation the
//! fleet allocator works in. Every function costs O(runs) (or O(runs log runs) to sort), never
//! O(addresses): a /8 or an IPv6 /32 costs what a /24 does.
//!
//! ([`crate::addr::AddrSet`] is the public set type; it keeps its runs private and has no
//! gap walk or aligned search, and its difference is O(runs²), hence these few functions.)

pub(crate) type Run = (u128, u128);

/// Sorts and merges overlapping or adjacent runs into sorted, disjoint, non-adjacent runs.
pub(crate) fn merge(mut runs: Vec<Run>) -> Vec<Run> {
    runs.sort_unstable();
    let mut merged: Vec<Run> = Vec::with_capacity(runs.len());
    for (lo, hi) in runs {
        match merged.last_mut() {
            Some(last) if lo <= last.1.saturating_add(1) => last.1 = last.1.max(hi),
            _ => merged.push((lo, hi)),
        }
    }
    merged
}

/// The parts of `runs` inside `within`.
pub(crate) fn clip(runs: impl IntoIterator<Item = Run>, within: Run) -> impl Iterator<Item = Run> {
    runs.into_iter().filter_map(move |(lo, hi)| {
        let (lo, hi) = (lo.max(within.0), hi.min(within.1));
        (lo <= hi).then_some((lo, hi))
    })
}

/// The runs of `within` not covered by `taken` (merged), lowest first.
pub(crate) fn gaps(within: Run, taken: &[Run]) -> impl Iterator<Item = Run> + '_ {
    let mut next = Some(within.0);
    taken
        .iter()
        .map(Some)
        .chain(std::iter::once(None))
        .filter_map(move |t| {
            let start = next?;
            match t {
                Some(&(lo, hi)) => {
                    if hi < start || lo > within.1 {
                        return None;
                    }
                    next = if hi >= within.1 { None } else { Some(hi + 1) };
                    (lo > start).then(|| (start, lo - 1))
                }
                None => {
                    next = None;
                    Some((start, within.1))
                }
            }
        })
}

/// Addresses in a run, saturating (an IPv6 /0 holds 2^128).
pub(crate) fn size(run: Run) -> u128 {
    (run.1 - run.0).saturating_add(1)
}

/// Addresses in all runs, saturating.
pub(crate) fn total(runs: impl IntoIterator<Item = Run>) -> u128 {
    runs.into_iter()
        .fold(0u128, |acc, r| acc.saturating_add(size(r)))
}

/// `n` addresses (n ≥ 1) from `free` (sorted, disjoint): the lowest run that holds them all if
/// there is one, otherwise the lowest free addresses across as many runs as it takes. `None`
/// when `free` holds fewer than `n`.
pub(crate) fn take(free: &[Run], n: u128) -> Option<Vec<Run>> {
    if let Some(&(lo, _)) = free.iter().find(|&&r| size(r) >= n) {
        return Some(vec![(lo, lo + (n - 1))]);
    }
    let mut left = n;
    let mut out = Vec::new();
    for &(lo, hi) in free {
        let k = size((lo, hi)).min(left);
        out.push((lo, lo + (k - 1)));
        left -= k;
        if left == 0 {
            return Some(out);
        }
    }
    None
}

/// The lowest block `[start, start + host_mask]` aligned on `host_mask + 1` (a power of two)
/// that lies entirely inside one of `free`'s runs.
pub(crate) fn first_aligned(free: impl IntoIterator<Item = Run>, host_mask: u128) -> Option<Run> {
    free.into_iter().find_map(|(lo, hi)| {
        let start = if lo & host_mask == 0 {
            lo
        } else {
            (lo | host_mask).checked_add(1)?
        };
        (start <= hi && hi - start >= host_mask).then_some((start, start + host_mask))
    })
}

/// The intersection of two merged run lists.
pub(crate) fn intersect(a: &[Run], b: &[Run]) -> Vec<Run> {
    let (mut i, mut j) = (0, 0);
    let mut out = Vec::new();
    while i < a.len() && j < b.len() {
        let (lo, hi) = (a[i].0.max(b[j].0), a[i].1.min(b[j].1));
        if lo <= hi {
            out.push((lo, hi));
        }
        if a[i].1 < b[j].1 {
            i += 1;
        } else {
            j += 1;
        }
    }
    out
}

/// `a` minus `b`, both merged.
pub(crate) fn subtract(a: &[Run], b: &[Run]) -> Vec<Run> {
    a.iter()
        .flat_map(|&run| gaps(run, b).collect::<Vec<_>>())
        .collect()
}

/// The host bits of a prefix of `len` in an address of `bits` bits, as a mask.
pub(crate) fn host_mask(bits: u8, len: u8) -> u128 {
    match bits.saturating_sub(len) {
        0 => 0,
        128.. => u128::MAX,
        host => (1u128 << host) - 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merge_joins_overlapping_and_adjacent_runs() {
        assert_eq!(
            merge(vec![(10, 12), (1, 3), (4, 5), (11, 20), (30, 30)]),
            [(1, 5), (10, 20), (30, 30)]
        );
        assert_eq!(merge(vec![(0, u128::MAX), (5, 6)]), [(0, u128::MAX)]);
    }

    #[test]
    fn gaps_are_the_complement_within() {
        let taken = merge(vec![(0, 2), (5, 5), (9, 30)]);
        assert_eq!(gaps((1, 12), &taken).collect::<Vec<_>>(), [(3, 4), (6, 8)]);
        assert_eq!(gaps((0, 40), &[]).collect::<Vec<_>>(), [(0, 40)]);
        assert_eq!(
            gaps((0, u128::MAX), &[(0, 0), (u128::MAX, u128::MAX)]).collect::<Vec<_>>(),
            [(1, u128::MAX - 1)]
        );
        assert_eq!(gaps((3, 4), &[(0, 10)]).count(), 0);
    }

    #[test]
    fn take_prefers_one_run_then_fills_from_the_bottom() {
        let free = [(1, 2), (5, 9), (20, 40)];
        assert_eq!(take(&free, 4), Some(vec![(5, 8)]));
        assert_eq!(take(&free, 10), Some(vec![(20, 29)]));
        assert_eq!(take(&free, 25), Some(vec![(1, 2), (5, 9), (20, 37)]));
        assert_eq!(take(&free, 28).map(total), Some(28));
        assert_eq!(take(&free, 29), None);
        assert_eq!(take(&free, 100), None);
    }

    #[test]
    fn first_aligned_skips_misaligned_starts() {
        assert_eq!(first_aligned([(1, 14), (17, 40)], 7), Some((24, 31)));
        assert_eq!(
            first_aligned([(0, u128::MAX)], u128::MAX),
            Some((0, u128::MAX))
        );
        assert_eq!(first_aligned([(1, u128::MAX)], u128::MAX), None);
        assert_eq!(first_aligned([(u128::MAX - 2, u128::MAX)], 3), None);
    }

    #[test]
    fn intersect_and_subtract() {
        let a = [(0, 10), (20, 30)];
        let b = [(5, 22), (30, 40)];
        assert_eq!(intersect(&a, &b), [(5, 10), (20, 22), (30, 30)]);
        assert_eq!(subtract(&a, &b), [(0, 4), (23, 29)]);
    }

    #[test]
    fn host_masks() {
        assert_eq!(host_mask(32, 24), 255);
        assert_eq!(host_mask(32, 32), 0);
        assert_eq!(host_mask(128, 0), u128::MAX);
        assert_eq!(host_mask(128, 1), u128::MAX >> 1);
    }
}
