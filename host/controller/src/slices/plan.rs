//! The writes that bring allot's ResourceSlices to what the pools want: pure, so that which
//! slice is created, replaced or deleted is tested without an API server.

use std::collections::BTreeMap;

use allot_core::addr::{AddrSet, IpFamily};
use allot_core::store::{Change, ChangeKind, Snapshot};

/// Every claimed address, by family, as of a store revision. Read in full once (and again
/// after the store compacted its feed), then kept current from the change feed: a round reads
/// what changed since the last, not every claim of the cluster twice a second.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClaimedAddresses {
    pub revision: u64,
    pub v4: AddrSet,
    pub v6: AddrSet,
}

impl ClaimedAddresses {
    pub fn of(snapshot: &Snapshot) -> ClaimedAddresses {
        let family = |f: IpFamily| {
            AddrSet::from_addresses(
                f,
                snapshot
                    .claims
                    .iter()
                    .map(|t| t.address)
                    .filter(|a| IpFamily::of(*a) == f),
            )
        };
        ClaimedAddresses {
            revision: snapshot.revision,
            v4: family(IpFamily::V4),
            v6: family(IpFamily::V6),
        }
    }

    /// Applies `changes` (in feed order) and moves to `revision`.
    pub fn apply(&mut self, changes: &[Change], revision: u64) {
        for c in changes {
            let set = match IpFamily::of(c.address) {
                IpFamily::V4 => &mut self.v4,
                IpFamily::V6 => &mut self.v6,
            };
            match c.kind {
                ChangeKind::Claimed | ChangeKind::Updated => set.insert(c.address),
                ChangeKind::Released => set.remove(c.address),
            }
        }
        self.revision = revision;
    }

    pub fn of_family(&self, family: IpFamily) -> &AddrSet {
        match family {
            IpFamily::V4 => &self.v4,
            IpFamily::V6 => &self.v6,
        }
    }
}

/// A slice as the API server holds it: the digest annotation allot wrote on it (None when
/// absent, as after an edit by hand that dropped it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Existing {
    pub digest: Option<String>,
}

/// One write.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Write {
    Create(String),
    Replace(String),
    Delete(String),
}

/// The writes from `existing` (slice name → what is stored) to `wanted` (slice name → digest
/// of the spec wanted): a slice whose digest matches is left alone, so an unchanged pool costs
/// no write; a slice no pool wants (its pool was deleted) is deleted.
pub fn plan(
    existing: &BTreeMap<String, Existing>,
    wanted: &BTreeMap<String, String>,
) -> Vec<Write> {
    let mut writes = Vec::new();
    for (name, digest) in wanted {
        match existing.get(name) {
            None => writes.push(Write::Create(name.clone())),
            Some(e) if e.digest.as_deref() != Some(digest.as_str()) => {
                writes.push(Write::Replace(name.clone()))
            }
            Some(_) => {}
        }
    }
    for name in existing.keys() {
        if !wanted.contains_key(name) {
            writes.push(Write::Delete(name.clone()));
        }
    }
    writes
}

#[cfg(test)]
mod tests {
    use super::*;

    fn existing(entries: &[(&str, Option<&str>)]) -> BTreeMap<String, Existing> {
        entries
            .iter()
            .map(|(n, d)| {
                (
                    n.to_string(),
                    Existing {
                        digest: d.map(str::to_string),
                    },
                )
            })
            .collect()
    }

    fn wanted(entries: &[(&str, &str)]) -> BTreeMap<String, String> {
        entries
            .iter()
            .map(|(n, d)| (n.to_string(), d.to_string()))
            .collect()
    }

    #[test]
    fn creates_replaces_and_deletes_only_what_differs() {
        let have = existing(&[
            ("same.ipam.allot.dev", Some("a")),
            ("changed.ipam.allot.dev", Some("b")),
            ("edited.ipam.allot.dev", None),
            ("gone.ipam.allot.dev", Some("c")),
        ]);
        let want = wanted(&[
            ("same.ipam.allot.dev", "a"),
            ("changed.ipam.allot.dev", "b2"),
            ("edited.ipam.allot.dev", "d"),
            ("new.ipam.allot.dev", "e"),
        ]);
        let mut writes = plan(&have, &want);
        writes.sort();
        assert_eq!(
            writes,
            vec![
                Write::Create("new.ipam.allot.dev".into()),
                Write::Replace("changed.ipam.allot.dev".into()),
                Write::Replace("edited.ipam.allot.dev".into()),
                Write::Delete("gone.ipam.allot.dev".into()),
            ]
        );
    }

    #[test]
    fn nothing_to_do_when_all_match() {
        let have = existing(&[("p.ipam.allot.dev", Some("a"))]);
        assert!(plan(&have, &wanted(&[("p.ipam.allot.dev", "a")])).is_empty());
        assert!(plan(&BTreeMap::new(), &BTreeMap::new()).is_empty());
    }

    fn change(revision: u64, address: &str, kind: ChangeKind) -> Change {
        Change {
            revision,
            address: address.parse().unwrap(),
            kind,
            at: 0,
        }
    }

    /// Kept from the feed, the claimed addresses are what a new snapshot would read.
    #[test]
    fn claimed_addresses_follow_the_change_feed() {
        use allot_core::store::Taken;
        let taken = |a: &str| Taken {
            address: a.parse().unwrap(),
            pool: "p".into(),
        };
        let snapshot = Snapshot {
            revision: 7,
            claims: vec![taken("192.0.2.1"), taken("192.0.2.2"), taken("2001:db8::1")],
            ..Snapshot::default()
        };
        let mut claimed = ClaimedAddresses::of(&snapshot);
        assert_eq!((claimed.v4.len(), claimed.v6.len()), (2, 1));
        claimed.apply(
            &[
                change(8, "192.0.2.1", ChangeKind::Released),
                change(9, "192.0.2.3", ChangeKind::Claimed),
                // Detached or reattached: still claimed.
                change(10, "192.0.2.2", ChangeKind::Updated),
                change(11, "2001:db8::1", ChangeKind::Released),
                change(12, "2001:db8::2", ChangeKind::Claimed),
            ],
            12,
        );
        let later = Snapshot {
            revision: 12,
            claims: vec![taken("192.0.2.2"), taken("192.0.2.3"), taken("2001:db8::2")],
            ..Snapshot::default()
        };
        assert_eq!(claimed, ClaimedAddresses::of(&later));
        assert!(
            claimed
                .of_family(IpFamily::V6)
                .contains("2001:db8::2".parse().unwrap())
        );
        // Nothing changed: only the revision moves.
        claimed.apply(&[], 15);
        assert_eq!(claimed.revision, 15);
        assert_eq!(claimed.v4.len(), 2);
    }
}
