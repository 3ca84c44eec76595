//! The writes that bring allot's ResourceSlices to what the pools want: pure, so that which
//! slice is created, replaced or deleted is tested without an API server.

use std::collections::BTreeMap;

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
}
