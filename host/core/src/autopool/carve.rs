//! Which addresses an auto pool gets, grows by or gives back. Every step walks ranges, never
//! addresses: carving from an IPv6 /64 costs what carving from a /24 costs.

use std::cmp::Reverse;

use ipnet::IpNet;

use crate::addr::{AddrSet, IpFamily};
use crate::pool::Subnet;

/// A pool cannot be created or grown: its Subnet has fewer free addresses than it needs.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "Subnet {subnet} has {free} free {family} addresses, {needed} more are needed: add addresses \
     to the Subnet, free some (delete pools carved from it), or lower ippool-ip-number"
)]
pub struct TooSmall {
    pub subnet: String,
    pub family: IpFamily,
    pub needed: u64,
    pub free: u64,
}

/// What one Subnet leaves for its auto pools.
#[derive(Clone, Debug)]
pub struct SubnetSpace {
    name: String,
    /// What a pool of this Subnet may hand out: the Subnet's `ips` minus `excludeIPs`, the
    /// gateway, an IPv4 network and broadcast address (below /31), IPv6's subnet-router anycast
    /// address (below /127), and every reserved address.
    usable: AddrSet,
    /// `usable` minus every pool's addresses.
    free: AddrSet,
}

impl SubnetSpace {
    /// `reserved`: what live ReservedIPs of the Subnet's family reserve; `taken`: the addresses
    /// of every pool of the family (auto or not, valid or not, this workload's own included).
    pub fn new(subnet: &Subnet, reserved: &AddrSet, taken: &AddrSet) -> SubnetSpace {
        let mut usable = subnet.allocatable().difference(reserved);
        if let IpNet::V6(net) = subnet.subnet
            && net.prefix_len() < 127
        {
            usable.remove(std::net::IpAddr::V6(net.network()));
        }
        let free = usable.difference(taken);
        SubnetSpace {
            name: subnet.meta.name.clone(),
            usable,
            free,
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn family(&self) -> IpFamily {
        self.usable.family()
    }

    pub fn usable(&self) -> &AddrSet {
        &self.usable
    }

    pub fn free(&self) -> &AddrSet {
        &self.free
    }

    /// Marks `addresses` as held by a pool (one created or grown earlier in the same pass).
    pub fn take(&mut self, addresses: &AddrSet) {
        self.free = self.free.difference(addresses);
    }

    fn too_small(&self, needed: u64, free: u64) -> TooSmall {
        TooSmall {
            subnet: self.name.clone(),
            family: self.family(),
            needed,
            free,
        }
    }
}

/// The addresses of a new auto pool of `want` addresses: one run when the Subnet has one long
/// enough (the shortest such, then the lowest), else the longest runs first. Deterministic.
pub fn carve(space: &SubnetSpace, want: u64) -> Result<AddrSet, TooSmall> {
    grow(space, &AddrSet::empty(space.family()), want)
}

/// What resizing a pool leads to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Resize {
    /// The pool's addresses afterwards.
    pub ips: AddrSet,
    pub added: AddrSet,
    pub removed: AddrSet,
    /// Addresses it should give back but cannot yet: claims hold them. They go on a later
    /// resize, once released.
    pub unreturned: u64,
}

impl Resize {
    pub fn changed(&self) -> bool {
        !self.added.is_empty() || !self.removed.is_empty()
    }
}

/// Resizes a pool holding `current` (of which `claimed` are held by claims) to `want` usable
/// addresses. Growing keeps every address it has and adds the fewest new runs (extending its
/// runs first). Shrinking removes only addresses no claim holds, whole runs and run ends first;
/// what claims keep is counted in [`Resize::unreturned`]. Addresses that are no longer usable
/// (excluded or reserved since) are removed when free and never counted. Too little room to grow
/// is an error and changes nothing.
pub fn resize(
    space: &SubnetSpace,
    current: &AddrSet,
    claimed: &AddrSet,
    want: u64,
) -> Result<Resize, TooSmall> {
    let claimed = claimed.intersection(current);
    let live = current.intersection(&space.usable);
    let dead_free = current.difference(&space.usable).difference(&claimed);
    let have = live.len();
    let (added, removed, unreturned) = if have < want {
        (grow(space, current, want - have)?, dead_free, 0)
    } else {
        let excess = have - want;
        let returnable = live.difference(&claimed);
        let returned = shrink(current, &returnable, excess.min(returnable.len()));
        let unreturned = excess - returned.len();
        (
            AddrSet::empty(current.family()),
            dead_free.union(&returned),
            unreturned,
        )
    };
    Ok(Resize {
        ips: current.difference(&removed).union(&added),
        added,
        removed,
        unreturned,
    })
}

fn run_len((lo, hi): (u128, u128)) -> u128 {
    (hi - lo).saturating_add(1)
}

fn contains(ranges: &[(u128, u128)], n: u128) -> bool {
    let i = ranges.partition_point(|&(_, hi)| hi < n);
    ranges.get(i).is_some_and(|&(lo, _)| lo <= n)
}

/// `need` free addresses for a pool holding `current`: first where they extend one of its runs,
/// then one run that fits (the shortest, then the lowest), else the longest runs first.
fn grow(space: &SubnetSpace, current: &AddrSet, need: u64) -> Result<AddrSet, TooSmall> {
    let free = space.free.difference(current);
    if free.len() < need {
        return Err(space.too_small(need, free.len()));
    }
    let held = current.raw_ranges();
    let mut remaining = u128::from(need);
    let mut picked = Vec::new();
    let mut rest = Vec::new();
    for &(lo, hi) in free.raw_ranges() {
        let take = run_len((lo, hi)).min(remaining);
        if take > 0 && lo > 0 && contains(held, lo - 1) {
            picked.push((lo, lo + (take - 1)));
            if lo + (take - 1) < hi {
                rest.push((lo + take, hi));
            }
            remaining -= take;
        } else if take > 0 && hi < u128::MAX && contains(held, hi + 1) {
            picked.push((hi - (take - 1), hi));
            if hi - (take - 1) > lo {
                rest.push((lo, hi - take));
            }
            remaining -= take;
        } else {
            rest.push((lo, hi));
        }
    }
    if remaining > 0 {
        let fit = rest
            .iter()
            .filter(|&&r| run_len(r) >= remaining)
            .min_by_key(|&&r| (run_len(r), r.0));
        match fit {
            Some(&(lo, _)) => picked.push((lo, lo + (remaining - 1))),
            None => {
                rest.sort_by_key(|&r| (Reverse(run_len(r)), r.0));
                for (lo, hi) in rest {
                    let take = run_len((lo, hi)).min(remaining);
                    picked.push((lo, lo + (take - 1)));
                    remaining -= take;
                    if remaining == 0 {
                        break;
                    }
                }
            }
        }
    }
    Ok(AddrSet::from_ranges(free.family(), picked))
}

/// `count` addresses of `returnable` (free addresses of a pool holding `current`) to give back:
/// whole runs of the pool first, then the free ends of runs, then free stretches inside runs,
/// highest first, so the pool keeps as few runs as it can.
fn shrink(current: &AddrSet, returnable: &AddrSet, count: u64) -> AddrSet {
    let held = current.raw_ranges();
    let mut segments: Vec<(u8, bool, (u128, u128))> = returnable
        .raw_ranges()
        .iter()
        .map(|&(lo, hi)| {
            let run = held[held.partition_point(|&(_, b)| b < lo)];
            let (whole, bottom, top) = (lo == run.0 && hi == run.1, lo == run.0, hi == run.1);
            let class = if whole {
                0
            } else if bottom || top {
                1
            } else {
                2
            };
            // Trim from the bottom only for a stretch that starts a run and does not end it.
            (class, bottom && !top, (lo, hi))
        })
        .collect();
    segments.sort_by_key(|&(class, _, (lo, _))| (class, Reverse(lo)));
    let mut remaining = u128::from(count);
    let mut removed = Vec::new();
    for (_, from_bottom, (lo, hi)) in segments {
        if remaining == 0 {
            break;
        }
        let take = run_len((lo, hi)).min(remaining);
        removed.push(if from_bottom {
            (lo, lo + (take - 1))
        } else {
            (hi - (take - 1), hi)
        });
        remaining -= take;
    }
    AddrSet::from_ranges(current.family(), removed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::{ObjectMeta, SubnetSpec};

    fn subnet(cidr: &str, ips: &[&str], exclude: &[&str], gateway: Option<&str>) -> Subnet {
        Subnet::from_spec(
            ObjectMeta {
                name: "s".into(),
                ..Default::default()
            },
            SubnetSpec {
                subnet: cidr.into(),
                ips: ips.iter().map(|s| s.to_string()).collect(),
                exclude_ips: exclude.iter().map(|s| s.to_string()).collect(),
                gateway: gateway.map(str::to_string),
                ..Default::default()
            },
        )
        .unwrap()
    }

    fn v4(entries: &[&str]) -> AddrSet {
        AddrSet::parse_entries(IpFamily::V4, entries).unwrap()
    }

    fn space(s: &Subnet, reserved: &[&str], taken: &[&str]) -> SubnetSpace {
        SubnetSpace::new(s, &v4(reserved), &v4(taken))
    }

    #[test]
    fn a_new_pool_is_one_run_that_avoids_everything_not_free() {
        let s = subnet("10.0.0.0/24", &[], &["10.0.0.2-10.0.0.3"], Some("10.0.0.1"));
        let sp = space(&s, &["10.0.0.4"], &["10.0.0.5-10.0.0.9"]);
        // Free: .10-.254 (network, gateway, excluded, reserved and taken are not).
        assert_eq!(carve(&sp, 3).unwrap().to_entries(), ["10.0.0.10-10.0.0.12"]);
        // The shortest run that fits, not the lowest.
        let sp = space(&s, &[], &["10.0.0.8-10.0.0.100", "10.0.0.103-10.0.0.200"]);
        assert_eq!(
            carve(&sp, 2).unwrap().to_entries(),
            ["10.0.0.101-10.0.0.102"]
        );
        // No run fits: the longest first.
        let sp = space(&s, &[], &["10.0.0.8-10.0.0.100", "10.0.0.103-10.0.0.250"]);
        assert_eq!(
            carve(&sp, 9).unwrap().to_entries(),
            ["10.0.0.4-10.0.0.7", "10.0.0.101", "10.0.0.251-10.0.0.254"]
        );
    }

    #[test]
    fn broadcast_and_ipv6_anycast_are_never_carved() {
        let s = subnet("10.0.0.0/30", &["10.0.0.0-10.0.0.3"], &[], None);
        let sp = space(&s, &[], &[]);
        assert_eq!(carve(&sp, 2).unwrap().to_entries(), ["10.0.0.1-10.0.0.2"]);
        let err = carve(&sp, 3).unwrap_err();
        assert_eq!((err.needed, err.free), (3, 2));
        assert!(
            err.to_string()
                .contains("Subnet s has 2 free ipv4 addresses"),
            "{err}"
        );
        let s6 = Subnet::from_spec(
            ObjectMeta {
                name: "s6".into(),
                ..Default::default()
            },
            SubnetSpec {
                subnet: "fd00::/64".into(),
                ips: vec!["fd00::-fd00::3".into()],
                ..Default::default()
            },
        )
        .unwrap();
        let sp = SubnetSpace::new(
            &s6,
            &AddrSet::empty(IpFamily::V6),
            &AddrSet::empty(IpFamily::V6),
        );
        assert_eq!(carve(&sp, 3).unwrap().to_entries(), ["fd00::1-fd00::3"]);
    }

    #[test]
    fn growing_extends_the_pools_runs_first() {
        let s = subnet("10.0.0.0/24", &[], &[], None);
        let current = v4(&["10.0.0.10-10.0.0.12"]);
        let taken = [
            "10.0.0.1-10.0.0.9",
            "10.0.0.10-10.0.0.12",
            "10.0.0.14-10.0.0.20",
        ];
        let sp = space(&s, &[], &taken);
        let r = resize(&sp, &current, &AddrSet::empty(IpFamily::V4), 6).unwrap();
        // .13 extends the run; the other two are one new run, the shortest that fits.
        assert_eq!(r.added.to_entries(), ["10.0.0.13", "10.0.0.21-10.0.0.22"]);
        assert_eq!(
            r.ips.to_entries(),
            ["10.0.0.10-10.0.0.13", "10.0.0.21-10.0.0.22"]
        );
        assert_eq!(r.unreturned, 0);
        // Too little room: an error, and nothing is proposed.
        let err = resize(&sp, &current, &AddrSet::empty(IpFamily::V4), 1000).unwrap_err();
        assert_eq!(err.needed, 997);
    }

    #[test]
    fn shrinking_keeps_claimed_addresses_and_says_what_it_could_not_return() {
        let s = subnet("10.0.0.0/24", &[], &[], None);
        let current = v4(&["10.0.0.10-10.0.0.19", "10.0.0.30-10.0.0.31"]);
        let sp = space(&s, &[], &["10.0.0.10-10.0.0.19", "10.0.0.30-10.0.0.31"]);
        let claimed = v4(&["10.0.0.10", "10.0.0.15"]);
        // 12 -> 5: the whole free run .30-.31 goes first, then the top end .16-.19, then one
        // address next to the claimed .15 (inside the run).
        let r = resize(&sp, &current, &claimed, 5).unwrap();
        assert_eq!(
            r.removed.to_entries(),
            ["10.0.0.14", "10.0.0.16-10.0.0.19", "10.0.0.30-10.0.0.31"]
        );
        assert_eq!(r.ips.to_entries(), ["10.0.0.10-10.0.0.13", "10.0.0.15"]);
        assert_eq!(r.unreturned, 0);
        // 12 -> 1: never below the claimed ones.
        let r = resize(&sp, &current, &claimed, 1).unwrap();
        assert_eq!(r.ips.to_entries(), ["10.0.0.10", "10.0.0.15"]);
        assert_eq!(r.unreturned, 1);
        assert!(r.added.is_empty());
    }

    #[test]
    fn addresses_reserved_since_are_dropped_when_free_and_replaced() {
        let s = subnet("10.0.0.0/24", &[], &[], None);
        let current = v4(&["10.0.0.10-10.0.0.13"]);
        // .11 (free) and .12 (claimed) are reserved now.
        let sp = space(&s, &["10.0.0.11-10.0.0.12"], &["10.0.0.10-10.0.0.13"]);
        let r = resize(&sp, &current, &v4(&["10.0.0.12"]), 4).unwrap();
        assert_eq!(r.removed.to_entries(), ["10.0.0.11"]);
        assert_eq!(r.added.to_entries(), ["10.0.0.8-10.0.0.9"]);
        assert_eq!(
            r.ips.to_entries(),
            ["10.0.0.8-10.0.0.10", "10.0.0.12-10.0.0.13"]
        );
    }

    #[test]
    fn cost_does_not_depend_on_the_subnet_size() {
        let s6 = Subnet::from_spec(
            ObjectMeta {
                name: "huge".into(),
                ..Default::default()
            },
            SubnetSpec {
                subnet: "fd00::/48".into(),
                ..Default::default()
            },
        )
        .unwrap();
        let taken = AddrSet::parse_entries(IpFamily::V6, &["fd00::1-fd00::ffff:ffff"]).unwrap();
        let sp = SubnetSpace::new(&s6, &AddrSet::empty(IpFamily::V6), &taken);
        let ips = carve(&sp, 1 << 40).unwrap();
        assert_eq!(ips.to_entries(), ["fd00::1:0:0-fd00::100:ffff:ffff"]);
    }
}
