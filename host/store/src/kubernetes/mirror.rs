//! The mirror: every IPBlock as the watch last delivered it (or as this store last wrote it),
//! the indexes reads answer from, and the change feed derived from block versions.
//!
//! # Positions
//!
//! A block version changes several claims at one resourceVersion, but the feed's contract gives
//! each change a revision of its own. Feed revisions are therefore positions, as in the etcd
//! store: resourceVersion × 65,536 plus the change's place, numbered so that the last change of
//! a version ends it (`rv << 16 | 0xffff`, the position a snapshot at that version reports). A
//! version that arrives late (the watch delivers another node's write after this store applied
//! a newer one of its own) is placed after everything already recorded, so positions only grow
//! and no reader skips it. Kubernetes documents resourceVersions as opaque; every API server
//! in use writes etcd's revision there, and a version that does not parse is applied as newer.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::{Mutex, MutexGuard};

use allot_core::block::block_of;
use allot_core::store::{Attachment, Change, ChangeKind, Changes, Claim, Snapshot, Taken};

use super::compact::{Block, Stored, Word, Words, attachment_key, pod_key, slot_of};

/// Changes kept in memory; a reader further behind resyncs from a snapshot.
const LOG_LIMIT: usize = 100_000;

/// The position that ends resourceVersion `rv`.
pub(super) fn end_of(rv: u64) -> u64 {
    (rv << 16) | 0xffff
}

/// A resourceVersion as a number, where it is one.
pub(super) fn rv_number(version: &str) -> Option<u64> {
    version.parse().ok()
}

#[derive(Default)]
pub(super) struct Mirror {
    state: Mutex<MirrorState>,
}

/// A list being applied to the mirror ([`Mirror::begin_list`]). Dropped unfinished (a page
/// failed), it leaves the blocks applied so far, each at a version it really had, as watch
/// events would have, and readers of a first list resync.
pub(super) struct Listing<'a> {
    mirror: &'a Mirror,
    listed: HashSet<String>,
    first: bool,
}

impl Listing<'_> {
    /// Applies one page of the list.
    pub fn page(&mut self, blocks: impl IntoIterator<Item = Block>, at: u64) {
        let mut st = self.mirror.lock();
        for b in blocks {
            self.listed.insert(b.name.clone());
            st.apply(b.name.clone(), Some(b), None, at);
        }
    }

    /// Ends the list, read at `rv`: blocks it did not hold are gone.
    pub fn finish(self, rv: &str, at: u64) {
        let mut st = self.mirror.lock();
        let gone: Vec<String> = st
            .blocks
            .keys()
            .filter(|n| !self.listed.contains(*n))
            .cloned()
            .collect();
        for name in gone {
            st.apply_version(name, None, Some(rv), true, at);
        }
        st.prune_words();
        if let Some(rv) = rv_number(rv) {
            if st.log.is_empty() && st.position < end_of(rv) {
                // Nothing to report: readers behind the list's version have seen everything.
                st.position = end_of(rv);
                st.from = st.position;
            } else {
                st.position = st.position.max(end_of(rv));
            }
        }
        // Before `self` is dropped, which takes the lock again.
        drop(st);
    }
}

impl Drop for Listing<'_> {
    fn drop(&mut self) {
        let mut st = self.mirror.lock();
        if self.first {
            st.from = st.position;
        }
        st.quiet = false;
    }
}

#[derive(Default)]
struct MirrorState {
    blocks: HashMap<String, Stored>,
    words: Words,
    /// Words known after they were last pruned.
    words_pruned: usize,
    /// Changes are not logged: the first list is being applied.
    quiet: bool,
    /// (hash of the attachment or of the pod's namespace and name, address).
    by_attachment: BTreeSet<(u64, IpAddr)>,
    by_pod: BTreeSet<(u64, IpAddr)>,
    /// Every change at a position in `(from, position]`.
    log: VecDeque<Change>,
    from: u64,
    position: u64,
    /// The last address claimed per pool (the pool's round-robin cursor).
    cursors: HashMap<String, Cursor>,
}

/// Where a pool's cursor stands, and how sure the mirror is: a claim it saw being made beats
/// one it found in a list (ordered by when it was made, to the second).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Cursor {
    Listed(u64, IpAddr),
    Seen(u64, IpAddr),
}

impl Cursor {
    fn address(&self) -> IpAddr {
        match self {
            Cursor::Listed(_, a) | Cursor::Seen(_, a) => *a,
        }
    }
}

impl Mirror {
    fn lock(&self) -> MutexGuard<'_, MirrorState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Starts over from a full list, applied page by page as it is read ([`Listing`]): blocks
    /// that changed since the mirror last saw them are reported as changes, so readers follow
    /// on without a resync. Each page's blocks are kept as they arrive, so a list of 100,000
    /// claims never sits in memory decoded in full beside the mirror (the agent's resident set
    /// would keep much of that peak).
    pub fn begin_list(&self) -> Listing<'_> {
        let mut st = self.lock();
        // The first list is not recorded as changes: nobody can have read anything before it
        // (a reader from before it is told to resync), and 100,000 claims would otherwise stay
        // in the log as 5 MB of changes nobody reads.
        let first = st.position == 0 && st.log.is_empty();
        st.quiet = first;
        Listing {
            mirror: self,
            listed: HashSet::new(),
            first,
        }
    }

    /// Applies a version of a block (`None`: deleted at `deleted_at`) if it is newer than the
    /// one held.
    pub fn apply(&self, name: &str, block: Option<Block>, deleted_at: Option<&str>, at: u64) {
        self.lock().apply(name.to_string(), block, deleted_at, at);
    }

    pub fn block(&self, name: &str) -> Option<Block> {
        let st = self.lock();
        st.blocks.get(name).map(|b| b.expand(name, &st.words))
    }

    /// The claims whose index key is `key`, that `belongs` says are the ones asked for.
    fn lookup(
        st: &MirrorState,
        index: &BTreeSet<(u64, IpAddr)>,
        key: u64,
        belongs: impl Fn(&Claim) -> bool,
    ) -> Vec<Claim> {
        let lowest = IpAddr::V4(Ipv4Addr::UNSPECIFIED);
        let highest = IpAddr::V6(Ipv6Addr::from(u128::MAX));
        index
            .range((key, lowest)..=(key, highest))
            .filter_map(|&(_, a)| {
                let block = st
                    .blocks
                    .get(&allot_core::block::block_name(&block_of(a)))?;
                Some(block.claim(block.get(a)?, &st.words))
            })
            .filter(|c| belongs(c))
            .collect()
    }

    pub fn addresses_of(&self, attachment: &Attachment) -> Vec<IpAddr> {
        self.claims_of(attachment)
            .iter()
            .map(|c| c.address)
            .collect()
    }

    pub fn claims_of(&self, attachment: &Attachment) -> Vec<Claim> {
        let st = self.lock();
        Self::lookup(&st, &st.by_attachment, attachment_key(attachment), |c| {
            c.attachment.as_ref() == Some(attachment)
        })
    }

    pub fn claims_of_pod(&self, namespace: &str, name: &str) -> Vec<Claim> {
        let st = self.lock();
        Self::lookup(&st, &st.by_pod, pod_key(namespace, name), |c| {
            c.pod.namespace == namespace && c.pod.name == name
        })
    }

    pub fn all(&self, keep: impl Fn(&Claim) -> bool) -> Vec<Claim> {
        let st = self.lock();
        let mut claims: Vec<Claim> = st
            .blocks
            .values()
            .flat_map(|b| b.iter().map(|(_, h)| b.claim(h, &st.words)))
            .filter(|c| keep(c))
            .collect();
        claims.sort_by_key(|c| c.address);
        claims
    }

    pub fn snapshot(&self, released_since: u64) -> Snapshot {
        let st = self.lock();
        let mut released: Vec<(IpAddr, u64)> = st
            .blocks
            .values()
            .flat_map(|b| {
                b.released
                    .iter()
                    .filter(|(a, at)| **at >= released_since && !b.contains(**a))
                    .map(|(a, at)| (*a, *at))
            })
            .collect();
        released.sort();
        let mut cursors: Vec<(String, IpAddr)> = st
            .cursors
            .iter()
            .map(|(pool, c)| (pool.clone(), c.address()))
            .collect();
        cursors.sort();
        let mut claims: Vec<Taken> = st
            .blocks
            .values()
            .flat_map(|b| b.taken(&st.words))
            .collect();
        claims.sort();
        Snapshot {
            revision: st.position,
            claims,
            released,
            cursors,
        }
    }

    pub fn changes_since(&self, revision: u64) -> Changes {
        let st = self.lock();
        if revision > st.position || revision < st.from {
            return Changes::Compacted;
        }
        Changes::Since {
            changes: st
                .log
                .iter()
                .filter(|c| c.revision > revision)
                .cloned()
                .collect(),
            revision: st.position,
        }
    }

    /// Up to `limit` blocks that hold no claim and whose every release happened before
    /// `cooled_before` (unix seconds), with the resourceVersion they were seen at.
    pub fn emptied(&self, cooled_before: u64, limit: usize) -> Vec<(String, String)> {
        let st = self.lock();
        let mut out: Vec<(String, String)> = st
            .blocks
            .iter()
            .filter(|(_, b)| b.is_empty() && b.released.values().all(|at| *at < cooled_before))
            .filter_map(|(name, b)| Some((name.clone(), b.version.clone()?)))
            .collect();
        out.sort();
        out.truncate(limit);
        out
    }

    /// Drops a block this store deleted, unless the mirror already holds a newer version of it
    /// (created again since): the watch's DELETED event, when it comes, finds nothing to do.
    pub fn forget_deleted(&self, name: &str, version: &str) {
        let mut st = self.lock();
        if st
            .blocks
            .get(name)
            .is_some_and(|b| b.is_empty() && b.version.as_deref() == Some(version))
        {
            st.blocks.remove(name);
        }
    }

    /// Blocks and claims held (for measurements).
    pub fn counts(&self) -> (usize, usize) {
        let st = self.lock();
        (st.blocks.len(), st.blocks.values().map(|b| b.len()).sum())
    }
}

impl MirrorState {
    fn apply(&mut self, name: String, next: Option<Block>, deleted_at: Option<&str>, at: u64) {
        self.apply_version(name, next, deleted_at, false, at);
    }

    /// Applies a version of a block, or its deletion at `deleted_at`. `unlisted`: the deletion
    /// is a list's at `deleted_at` that did not hold the block, which then held no version
    /// up to that one (deleted, or outside the store's scope): one read at exactly that version
    /// is gone too, where a deletion would need a later one.
    fn apply_version(
        &mut self,
        name: String,
        mut next: Option<Block>,
        deleted_at: Option<&str>,
        unlisted: bool,
        at: u64,
    ) {
        let version = match &next {
            Some(b) => b.version.clone(),
            None => deleted_at.map(str::to_string),
        };
        let held = self.blocks.get(&name);
        let newer = match (held.and_then(|b| b.version.as_deref()), version.as_deref()) {
            (Some(h), Some(v)) => match (rv_number(h), rv_number(v)) {
                (Some(h), Some(v)) if unlisted => v >= h,
                (Some(h), Some(v)) => v > h,
                _ => h != v,
            },
            (None, _) => next.is_some(),
            (Some(_), None) => true,
        };
        if !newer {
            return;
        }
        if let Some(b) = &mut next {
            // Only the block's own addresses (what the decoder keeps; a claim elsewhere was
            // never made here): the mirror keeps nothing else, so indexes nothing else.
            let cidr = b.cidr;
            b.claims.retain(|a, _| slot_of(&cidr, *a).is_some());
        }
        let before = self.blocks.remove(&name);
        let first_seen = before.is_none();
        let empty = BTreeMap::new();
        let after = next.as_ref().map(|b| &b.claims).unwrap_or(&empty);
        let mut changes: Vec<(IpAddr, ChangeKind, u64)> = Vec::new();
        if let Some(old) = &before {
            for (a, h) in old.iter() {
                match after.get(&a) {
                    None => {
                        let when = next
                            .as_ref()
                            .and_then(|b| b.released.get(&a).copied())
                            .unwrap_or(at);
                        changes.push((a, ChangeKind::Released, when));
                    }
                    Some(new) if !old.matches(h, new, &self.words) => {
                        changes.push((a, ChangeKind::Updated, at))
                    }
                    Some(_) => {}
                }
                let (attachment, pod) = old.keys(h, &self.words);
                if let Some(k) = attachment {
                    self.by_attachment.remove(&(k, a));
                }
                self.by_pod.remove(&(pod, a));
            }
        }
        for (a, c) in after {
            if !before.as_ref().is_some_and(|old| old.contains(*a)) {
                changes.push((*a, ChangeKind::Claimed, at));
            }
            if let Some(attachment) = &c.attachment {
                self.by_attachment.insert((attachment_key(attachment), *a));
            }
            self.by_pod
                .insert((pod_key(&c.pod.namespace, &c.pod.name), *a));
        }
        let base = version.as_deref().and_then(rv_number).map(|rv| rv << 16);
        let count = changes.len() as u64;
        for (i, (address, kind, when)) in changes.into_iter().enumerate() {
            let numbered = base
                .map(|b| b | (0xffff - (count - 1 - i as u64)))
                .unwrap_or(0);
            let position = numbered.max(self.position + 1);
            self.position = position;
            if let Some(c) = after.get(&address).filter(|_| kind == ChangeKind::Claimed) {
                let cursor = if first_seen {
                    // Claims of a block seen for the first time (a list): the latest stands
                    // for its pool's cursor until this store sees a newer claim.
                    Cursor::Listed(c.updated_at, address)
                } else {
                    Cursor::Seen(position, address)
                };
                match self.cursors.get_mut(&c.pool) {
                    Some(e) => *e = cursor.max(*e),
                    None => {
                        self.cursors.insert(c.pool.clone(), cursor);
                    }
                }
            }
            if !self.quiet {
                self.log.push_back(Change {
                    revision: position,
                    address,
                    kind,
                    at: when,
                });
            }
        }
        while self.log.len() > LOG_LIMIT {
            let dropped = self.log.pop_front().expect("non-empty");
            self.from = dropped.revision;
        }
        if let Some(b) = next {
            let stored = Stored::new(b, &mut self.words);
            self.blocks.insert(name, stored);
        }
        if self.words.len() > 2 * self.words_pruned + 1024 {
            self.prune_words();
        }
    }

    /// Forgets the words no claim uses any more (pods' owners and namespaces come and go).
    fn prune_words(&mut self) {
        let used: HashSet<Word> = self.blocks.values().flat_map(Stored::words).collect();
        self.words.keep_only(&used);
        self.words_pruned = self.words.len();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use allot_core::store::PodRef;
    use allot_k8s::IPBlock;
    use ipnet::IpNet;

    fn block_with(cidr: &str, version: &str, pods: &[(&str, &str)]) -> Block {
        let cidr: IpNet = cidr.parse().unwrap();
        let mut b = Block::empty(allot_core::block::block_name(&cidr), cidr, None);
        b.version = Some(version.into());
        for (address, pod) in pods {
            let address: IpAddr = address.parse().unwrap();
            let claim = Claim {
                address,
                pool: "p".into(),
                network: "n".into(),
                attachment: Some(Attachment {
                    container_id: format!("c-{pod}"),
                    interface: "eth0".into(),
                }),
                pod: PodRef {
                    namespace: "ns".into(),
                    name: (*pod).into(),
                    uid: format!("u-{pod}"),
                    owner_kind: None,
                    owner_name: None,
                },
                node: "a".into(),
                updated_at: 1,
            };
            b.claims.insert(address, claim);
        }
        b
    }

    fn kinds(changes: Changes) -> Vec<(String, ChangeKind)> {
        match changes {
            Changes::Since { changes, .. } => changes
                .into_iter()
                .map(|c| (c.address.to_string(), c.kind))
                .collect(),
            Changes::Compacted => panic!("compacted"),
        }
    }

    /// A list that does not hold a block (deleted, or outside a narrowed scope) drops it, even
    /// when the block's last version is the list's own (the last write of the cluster); a
    /// block written after the list's version stays.
    #[test]
    fn a_list_without_a_block_drops_it_unless_it_was_written_since() {
        let mirror = Mirror::default();
        let mut list = mirror.begin_list();
        list.page([block_with("10.0.0.0/26", "5", &[("10.0.0.1", "a")])], 1);
        list.page([block_with("10.0.0.64/26", "9", &[("10.0.0.65", "b")])], 1);
        list.finish("9", 1);
        mirror.apply(
            "v4-10-0-0-128-26",
            Some(block_with("10.0.0.128/26", "11", &[("10.0.0.129", "c")])),
            None,
            1,
        );
        // Listed again at 9 (nothing written between, another scope): neither is held.
        let list = mirror.begin_list();
        list.finish("9", 2);
        assert!(mirror.claims_of_pod("ns", "a").is_empty());
        assert!(
            mirror.claims_of_pod("ns", "b").is_empty(),
            "read at 9, not in the list at 9"
        );
        assert_eq!(mirror.claims_of_pod("ns", "c").len(), 1, "written at 11");
        let list = mirror.begin_list();
        list.finish("11", 3);
        assert_eq!(
            mirror.claims_of_pod("ns", "c").len(),
            0,
            "gone from the list at 11"
        );
    }

    /// Lists arrive in pages: the first is not recorded as changes (a reader from before it
    /// resyncs); a later one reports what changed, including blocks that are gone; one that
    /// fails midway keeps what it applied, and a first one still sends earlier readers to a
    /// resync.
    #[test]
    fn lists_applied_page_by_page_report_what_changed_since_the_last() {
        let mirror = Mirror::default();
        let mut list = mirror.begin_list();
        list.page([block_with("10.0.0.0/26", "5", &[("10.0.0.1", "a")])], 1);
        list.page([block_with("10.0.0.64/26", "6", &[("10.0.0.65", "b")])], 1);
        list.finish("7", 1);
        assert!(matches!(mirror.changes_since(0), Changes::Compacted));
        let snapshot = mirror.snapshot(0);
        assert_eq!(snapshot.revision, end_of(7));
        assert_eq!(snapshot.claims.len(), 2);
        assert_eq!(mirror.claims_of_pod("ns", "b").len(), 1);
        assert!(kinds(mirror.changes_since(end_of(7))).is_empty());

        // Relisted at 9: block 0 gained a claim, block 64 is gone.
        let mut list = mirror.begin_list();
        list.page(
            [block_with(
                "10.0.0.0/26",
                "8",
                &[("10.0.0.1", "a"), ("10.0.0.2", "c")],
            )],
            2,
        );
        list.finish("9", 2);
        assert_eq!(
            kinds(mirror.changes_since(end_of(7))),
            [
                ("10.0.0.2".to_string(), ChangeKind::Claimed),
                ("10.0.0.65".to_string(), ChangeKind::Released)
            ]
        );
        assert!(mirror.claims_of_pod("ns", "b").is_empty());
        assert_eq!(mirror.claims_of_pod("ns", "c").len(), 1);

        // A first list that fails after a page: its blocks stay, readers resync, and the next
        // list is recorded.
        let mirror = Mirror::default();
        let mut list = mirror.begin_list();
        list.page([block_with("10.0.0.0/26", "5", &[("10.0.0.1", "a")])], 1);
        drop(list);
        assert_eq!(mirror.counts(), (1, 1));
        assert!(matches!(mirror.changes_since(0), Changes::Compacted));
        let at = mirror.snapshot(0).revision;
        let mut list = mirror.begin_list();
        list.page([block_with("10.0.0.0/26", "8", &[])], 2);
        list.finish("9", 2);
        assert_eq!(
            kinds(mirror.changes_since(at)),
            [("10.0.0.1".to_string(), ChangeKind::Released)]
        );
    }

    /// A block's replace carries what others set in its metadata, and allot's own labels (its
    /// region's written anew).
    #[test]
    fn a_rewritten_block_keeps_what_others_set_in_its_metadata() {
        let object: IPBlock = serde_json::from_value(serde_json::json!({
            "apiVersion": "allot.dev/v1alpha1", "kind": "IPBlock",
            "metadata": {"name": "v4-10-0-0-0-26", "resourceVersion": "12",
                         "labels": {"app.kubernetes.io/managed-by": "allot", "gitops": "yes"},
                         "annotations": {"note": "kept"},
                         "finalizers": ["foregroundDeletion"],
                         "ownerReferences": [{"apiVersion": "v1", "kind": "Namespace",
                                              "name": "x", "uid": "u"}]},
            "spec": {"cidr": "10.0.0.0/26"}
        }))
        .unwrap();
        let block = Block::from_object(&object);
        let written = block.to_object();
        let meta = &written.metadata;
        assert_eq!(meta.resource_version.as_deref(), Some("12"));
        assert_eq!(
            meta.labels.clone().unwrap(),
            BTreeMap::from([
                (
                    "app.kubernetes.io/managed-by".to_string(),
                    "allot".to_string()
                ),
                ("allot.dev/region".to_string(), "v4-10-0-0-0-20".to_string()),
                ("gitops".to_string(), "yes".to_string())
            ])
        );
        assert_eq!(meta.annotations.clone().unwrap()["note"], "kept");
        assert_eq!(meta.finalizers.clone().unwrap(), ["foregroundDeletion"]);
        assert_eq!(meta.owner_references.clone().unwrap()[0].kind, "Namespace");

        // A block with allot's label alone keeps nothing extra.
        let plain = Block::empty(
            "v4-10-0-0-64-26".into(),
            "10.0.0.64/26".parse().unwrap(),
            None,
        );
        let meta = plain.to_object().metadata;
        assert!(plain.kept.is_none());
        assert!(meta.annotations.is_none() && meta.finalizers.is_none());
        assert!(meta.owner_references.is_none());
    }
}
