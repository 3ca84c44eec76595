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

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::{Mutex, MutexGuard};

use allot_core::block::block_of;
use allot_core::store::{Attachment, Change, ChangeKind, Changes, Claim, PodRef, Snapshot};
use allot_k8s::{BlockClaim, IPBlock, IPBlockSpec};

use super::compact::{Held, Interner, attachment_key, pod_key};
use ipnet::IpNet;
use kube::api::ObjectMeta;

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

/// What others put in an IPBlock's metadata (a GitOps tool's labels and annotations, the
/// garbage collector's `foregroundDeletion` finalizer, owner references): kept as read and
/// written back with every replace, which would drop them otherwise. `None` when the block
/// carries nothing but allot's own label, as nearly every block does.
#[derive(Clone, Debug, Default, PartialEq)]
pub(super) struct Kept {
    labels: BTreeMap<String, String>,
    annotations: BTreeMap<String, String>,
    finalizers: Vec<String>,
    owner_references: Vec<k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference>,
}

// Every field compares structurally (`OwnerReference` only lacks the derive).
impl Eq for Kept {}

impl Kept {
    fn of(meta: &ObjectMeta) -> Option<Box<Kept>> {
        let mut labels = meta.labels.clone().unwrap_or_default();
        if labels.get(MANAGED_BY).map(String::as_str) == Some("allot") {
            labels.remove(MANAGED_BY);
        }
        let kept = Kept {
            labels,
            annotations: meta.annotations.clone().unwrap_or_default(),
            finalizers: meta.finalizers.clone().unwrap_or_default(),
            owner_references: meta.owner_references.clone().unwrap_or_default(),
        };
        (kept != Kept::default()).then(|| Box::new(kept))
    }
}

const MANAGED_BY: &str = "app.kubernetes.io/managed-by";

/// One IPBlock, decoded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Block {
    pub name: String,
    pub cidr: IpNet,
    pub node: Option<String>,
    /// The resourceVersion this copy was read at; `None` for a block not created yet.
    pub version: Option<String>,
    /// Metadata others set, written back as it was read.
    pub kept: Option<Box<Kept>>,
    pub claims: BTreeMap<IpAddr, Claim>,
    /// Released addresses cooling down, with when (unix seconds). At most one entry per
    /// address of the block, so a block never grows past 64 of each.
    pub released: BTreeMap<IpAddr, u64>,
}

impl Block {
    pub fn empty(name: String, cidr: IpNet, node: Option<String>) -> Block {
        Block {
            name,
            cidr,
            node,
            version: None,
            kept: None,
            claims: BTreeMap::new(),
            released: BTreeMap::new(),
        }
    }

    /// Decodes an object. The name says which addresses the block holds (`spec.cidr` only
    /// repeats it for people): an object whose name is not a block's name holds nothing, and
    /// entries that are not addresses of the block (a hand edit) are skipped with a warning.
    /// An address's claim lives only in the block named after it, so such an entry never held
    /// anything, and skipping it frees nothing.
    pub fn from_object(object: &IPBlock) -> Block {
        let name = object.metadata.name.clone().unwrap_or_default();
        let cidr = allot_core::block::block_named(&name);
        if cidr.is_none() {
            tracing::warn!(block = %name, "an IPBlock whose name is not a block's name holds nothing; ignoring it");
        }
        let mut block = Block::empty(
            name.clone(),
            cidr.unwrap_or_else(|| block_of(IpAddr::from([0, 0, 0, 0]))),
            object.spec.node.clone(),
        );
        block.version = object.metadata.resource_version.clone();
        block.kept = Kept::of(&object.metadata);
        let belongs = |text: &str| -> Option<IpAddr> {
            let address: IpAddr = text.parse().ok()?;
            (cidr.is_some() && block_of(address) == block.cidr).then_some(address)
        };
        for (text, c) in &object.spec.claims {
            match belongs(text) {
                Some(address) => {
                    block.claims.insert(address, claim_of(address, c));
                }
                None => tracing::warn!(
                    block = %name,
                    entry = %text,
                    "IPBlock holds a claim that is not one of its addresses; ignoring it"
                ),
            }
        }
        for (text, at) in &object.spec.released {
            if let Some(address) = belongs(text) {
                block.released.insert(address, *at);
            }
        }
        block
    }

    pub fn to_object(&self) -> IPBlock {
        let kept = self.kept.as_deref().cloned().unwrap_or_default();
        let mut labels = kept.labels;
        labels.insert(MANAGED_BY.to_string(), "allot".to_string());
        IPBlock {
            metadata: ObjectMeta {
                name: Some(self.name.clone()),
                resource_version: self.version.clone(),
                labels: Some(labels),
                annotations: (!kept.annotations.is_empty()).then_some(kept.annotations),
                finalizers: (!kept.finalizers.is_empty()).then_some(kept.finalizers),
                owner_references: (!kept.owner_references.is_empty())
                    .then_some(kept.owner_references),
                ..ObjectMeta::default()
            },
            spec: IPBlockSpec {
                cidr: self.cidr.to_string(),
                node: self.node.clone(),
                claims: self
                    .claims
                    .iter()
                    .map(|(a, c)| (a.to_string(), block_claim_of(c)))
                    .collect(),
                released: self
                    .released
                    .iter()
                    .map(|(a, t)| (a.to_string(), *t))
                    .collect(),
            },
        }
    }
}

fn claim_of(address: IpAddr, c: &BlockClaim) -> Claim {
    Claim {
        address,
        pool: c.pool.clone(),
        network: c.network.clone(),
        attachment: match (&c.container_id, &c.interface) {
            (Some(container_id), Some(interface)) => Some(Attachment {
                container_id: container_id.clone(),
                interface: interface.clone(),
            }),
            _ => None,
        },
        pod: PodRef {
            namespace: c.namespace.clone(),
            name: c.pod.clone(),
            uid: c.uid.clone(),
            owner_kind: c.owner_kind.clone(),
            owner_name: c.owner_name.clone(),
        },
        node: c.node.clone(),
        updated_at: c.updated_at,
    }
}

fn block_claim_of(c: &Claim) -> BlockClaim {
    BlockClaim {
        pool: c.pool.clone(),
        network: c.network.clone(),
        container_id: c.attachment.as_ref().map(|a| a.container_id.clone()),
        interface: c.attachment.as_ref().map(|a| a.interface.clone()),
        namespace: c.pod.namespace.clone(),
        pod: c.pod.name.clone(),
        uid: c.pod.uid.clone(),
        owner_kind: c.pod.owner_kind.clone(),
        owner_name: c.pod.owner_name.clone(),
        node: c.node.clone(),
        updated_at: c.updated_at,
    }
}

#[derive(Default)]
pub(super) struct Mirror {
    state: Mutex<MirrorState>,
}

/// A block as the mirror keeps it (see [`compact`](super::compact)).
struct Stored {
    cidr: IpNet,
    node: Option<String>,
    version: Option<String>,
    kept: Option<Box<Kept>>,
    claims: BTreeMap<IpAddr, Held>,
    released: BTreeMap<IpAddr, u64>,
}

impl Stored {
    fn expand(&self, name: &str) -> Block {
        Block {
            name: name.to_string(),
            cidr: self.cidr,
            node: self.node.clone(),
            version: self.version.clone(),
            kept: self.kept.clone(),
            claims: self.claims.iter().map(|(a, h)| (*a, h.claim(*a))).collect(),
            released: self.released.clone(),
        }
    }
}

#[derive(Default)]
struct MirrorState {
    blocks: HashMap<String, Stored>,
    words: Interner,
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

    /// Starts over from a full list at `rv`: blocks that changed since the mirror last saw them
    /// are reported as changes, so readers follow on without a resync.
    pub fn reset(&self, blocks: Vec<Block>, rv: &str, at: u64) {
        let mut st = self.lock();
        let listed: BTreeSet<String> = blocks.iter().map(|b| b.name.clone()).collect();
        let gone: Vec<String> = st
            .blocks
            .keys()
            .filter(|n| !listed.contains(*n))
            .cloned()
            .collect();
        for b in blocks {
            st.apply(b.name.clone(), Some(b), None, at);
        }
        for name in gone {
            st.apply(name, None, Some(rv), at);
        }
        st.words.prune();
        if let Some(rv) = rv_number(rv) {
            if st.log.is_empty() && st.position < end_of(rv) {
                // Nothing to report: readers behind the list's version have seen everything.
                st.position = end_of(rv);
                st.from = st.position;
            } else {
                st.position = st.position.max(end_of(rv));
            }
        }
    }

    /// Applies a version of a block (`None`: deleted at `deleted_at`) if it is newer than the
    /// one held.
    pub fn apply(&self, name: &str, block: Option<Block>, deleted_at: Option<&str>, at: u64) {
        self.lock().apply(name.to_string(), block, deleted_at, at);
    }

    pub fn block(&self, name: &str) -> Option<Block> {
        self.lock().blocks.get(name).map(|b| b.expand(name))
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
                Some(block.claims.get(&a)?.claim(a))
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
            .flat_map(|b| b.claims.iter().map(|(a, h)| h.claim(*a)))
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
                    .filter(|(a, at)| **at >= released_since && !b.claims.contains_key(a))
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
        let mut claims: Vec<Claim> = st
            .blocks
            .values()
            .flat_map(|b| b.claims.iter().map(|(a, h)| h.claim(*a)))
            .collect();
        claims.sort_by_key(|c| c.address);
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
            .filter(|(_, b)| {
                b.claims.is_empty() && b.released.values().all(|at| *at < cooled_before)
            })
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
            .is_some_and(|b| b.claims.is_empty() && b.version.as_deref() == Some(version))
        {
            st.blocks.remove(name);
        }
    }

    /// Blocks and claims held (for measurements).
    pub fn counts(&self) -> (usize, usize) {
        let st = self.lock();
        (
            st.blocks.len(),
            st.blocks.values().map(|b| b.claims.len()).sum(),
        )
    }
}

impl MirrorState {
    fn apply(&mut self, name: String, next: Option<Block>, deleted_at: Option<&str>, at: u64) {
        let version = match &next {
            Some(b) => b.version.clone(),
            None => deleted_at.map(str::to_string),
        };
        let held = self.blocks.get(&name);
        let newer = match (held.and_then(|b| b.version.as_deref()), version.as_deref()) {
            (Some(h), Some(v)) => match (rv_number(h), rv_number(v)) {
                (Some(h), Some(v)) => v > h,
                _ => h != v,
            },
            (None, _) => next.is_some(),
            (Some(_), None) => true,
        };
        if !newer {
            return;
        }
        let first_seen = held.is_none();
        let before = held.map(|b| b.claims.clone()).unwrap_or_default();
        let next: Option<Stored> = next.map(|b| Stored {
            claims: b
                .claims
                .iter()
                .map(|(a, c)| (*a, Held::new(c, &mut self.words)))
                .collect(),
            cidr: b.cidr,
            node: b.node,
            version: b.version,
            kept: b.kept,
            released: b.released,
        });
        let empty = BTreeMap::new();
        let after = next.as_ref().map(|b| &b.claims).unwrap_or(&empty);
        let mut changes: Vec<(IpAddr, ChangeKind, u64)> = Vec::new();
        for (a, old) in &before {
            match after.get(a) {
                None => {
                    let when = next
                        .as_ref()
                        .and_then(|b| b.released.get(a).copied())
                        .unwrap_or(at);
                    changes.push((*a, ChangeKind::Released, when));
                }
                Some(new) if new != old => changes.push((*a, ChangeKind::Updated, at)),
                Some(_) => {}
            }
        }
        for a in after.keys().filter(|a| !before.contains_key(a)) {
            changes.push((*a, ChangeKind::Claimed, at));
        }
        for (a, h) in &before {
            self.unindex(*a, h);
        }
        for (a, h) in after {
            self.index(*a, h);
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
                    Cursor::Listed(c.updated_at(), address)
                } else {
                    Cursor::Seen(position, address)
                };
                let e = self.cursors.entry(c.pool().to_string()).or_insert(cursor);
                if cursor > *e {
                    *e = cursor;
                }
            }
            self.log.push_back(Change {
                revision: position,
                address,
                kind,
                at: when,
            });
        }
        while self.log.len() > LOG_LIMIT {
            let dropped = self.log.pop_front().expect("non-empty");
            self.from = dropped.revision;
        }
        match next {
            Some(b) => {
                self.blocks.insert(name, b);
            }
            None => {
                self.blocks.remove(&name);
            }
        }
    }

    fn index(&mut self, address: IpAddr, h: &Held) {
        if let Some(k) = h.attachment_key() {
            self.by_attachment.insert((k, address));
        }
        self.by_pod.insert((h.pod_key(), address));
    }

    fn unindex(&mut self, address: IpAddr, h: &Held) {
        if let Some(k) = h.attachment_key() {
            self.by_attachment.remove(&(k, address));
        }
        self.by_pod.remove(&(h.pod_key(), address));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A block's replace carries what others set in its metadata, and allot's own label.
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
