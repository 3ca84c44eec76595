//! Properties of carving, growing and shrinking on random Subnets, pools, reservations and
//! claims: never another pool's address, never an address a pool may not hand out, never a
//! claimed address returned, the size asked for whenever it can be met, the same answer twice.

use allot_core::autopool::{SubnetSpace, carve, resize};
use allot_core::spec::{ObjectMeta, SubnetSpec};
use allot_core::{AddrSet, IpFamily, Subnet};
use proptest::prelude::*;

/// Ranges inside 10.0.0.0/24 given as (first octet, length).
fn set(ranges: &[(u8, u8)]) -> AddrSet {
    let entries: Vec<String> = ranges
        .iter()
        .map(|&(lo, len)| {
            let hi = lo.saturating_add(len);
            format!("10.0.0.{lo}-10.0.0.{hi}")
        })
        .collect();
    AddrSet::parse_entries(IpFamily::V4, &entries).unwrap()
}

fn ranges(max: usize) -> impl Strategy<Value = Vec<(u8, u8)>> {
    long_ranges(max, 12)
}

fn long_ranges(max: usize, len: u8) -> impl Strategy<Value = Vec<(u8, u8)>> {
    prop::collection::vec((any::<u8>(), 0..len), 0..max)
}

fn naive_contains(entries: &[(u8, u8)], n: u8) -> bool {
    entries
        .iter()
        .any(|&(lo, len)| lo <= n && n <= lo.saturating_add(len))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// The sweep difference agrees with a per-address difference.
    #[test]
    fn difference_is_per_address_difference(a in ranges(8), b in ranges(8)) {
        let d = set(&a).difference(&set(&b));
        for n in 0..=255u8 {
            let addr = format!("10.0.0.{n}").parse().unwrap();
            prop_assert_eq!(d.contains(addr), naive_contains(&a, n) && !naive_contains(&b, n), "{}", n);
        }
    }

    #[test]
    fn carving_and_resizing_keep_every_rule(
        subnet_ips in long_ranges(4, 100),
        excluded in ranges(3),
        gateway in any::<u8>(),
        reserved in ranges(3),
        others in ranges(5),
        current in long_ranges(3, 30),
        claims in ranges(4),
        want in 1u64..60,
    ) {
        let mut ips = subnet_ips;
        ips.push((0, 0));
        let subnet = Subnet::from_spec(
            ObjectMeta { name: "s".into(), ..Default::default() },
            SubnetSpec {
                subnet: "10.0.0.0/24".into(),
                ips: set(&ips).to_entries(),
                exclude_ips: set(&excluded).to_entries(),
                gateway: Some(format!("10.0.0.{gateway}")),
                ..Default::default()
            },
        )
        .unwrap();
        let reserved = set(&reserved);
        // Other pools never overlap this one.
        let current = set(&current);
        let others = set(&others).difference(&current);
        let taken = others.union(&current);
        let space = SubnetSpace::new(&subnet, &reserved, &taken);
        let gw = format!("10.0.0.{gateway}").parse().unwrap();
        let never = others
            .union(&reserved)
            .union(&set(&excluded))
            .union(&AddrSet::single(gw))
            .union(&set(&[(0, 0), (255, 0)]));
        prop_assert!(!space.usable().overlaps(&never.difference(&others)));

        // A new pool.
        match carve(&space, want) {
            Ok(new) => {
                prop_assert_eq!(new.len(), want);
                prop_assert!(new.is_subset(space.free()));
                prop_assert!(!new.overlaps(&never));
                prop_assert!(!new.overlaps(&current));
                prop_assert_eq!(Some(new), carve(&space, want).ok());
            }
            Err(e) => {
                prop_assert!(space.free().len() < want);
                prop_assert_eq!(e.free, space.free().len());
            }
        }

        // Resizing the pool holding `current`, some of it claimed.
        let claimed = set(&claims).intersection(&current);
        let live = current.intersection(space.usable());
        match resize(&space, &current, &claimed, want) {
            Ok(r) => {
                prop_assert!(claimed.is_subset(&r.ips), "a claimed address left the pool");
                prop_assert!(!r.removed.overlaps(&claimed));
                prop_assert!(r.removed.is_subset(&current));
                prop_assert!(r.added.is_subset(space.free()));
                prop_assert!(!r.ips.overlaps(&others), "overlaps another pool");
                prop_assert!(r.ips.difference(space.usable()).is_subset(&claimed),
                    "a free address the pool may not hand out was kept");
                prop_assert_eq!(r.ips.clone(), current.difference(&r.removed).union(&r.added));
                let now_live = r.ips.intersection(space.usable()).len();
                if live.len() <= want {
                    prop_assert_eq!(now_live, want);
                    prop_assert_eq!(r.unreturned, 0);
                } else {
                    let floor = live.intersection(&claimed).len();
                    prop_assert_eq!(now_live, want.max(floor));
                    prop_assert_eq!(r.unreturned, floor.saturating_sub(want));
                    prop_assert!(r.added.is_empty());
                }
                prop_assert_eq!(Some(r), resize(&space, &current, &claimed, want).ok());
            }
            Err(e) => {
                prop_assert!(live.len() < want);
                prop_assert!(space.free().len() < want - live.len());
                prop_assert_eq!(e.needed, want - live.len());
            }
        }
    }
}
