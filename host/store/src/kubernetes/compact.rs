//! An IPBlock decoded ([`Block`]: its claims, its cooling addresses and the metadata others set
//! on it, to and from the object), and claims as the mirror keeps them ([`Stored`]). The mirror,
//! the writes and the watch all speak [`Block`]; the mirror keeps [`Stored`].
//!
//! Claims as the mirror keeps them: small, and in few allocations. An agent mirrors every claim
//! of the cluster (150,000 of them in a large one), so
//! - a claim's repeated words (pool, network, namespace, interface, owner, node) are kept once,
//!   in [`Words`], and named by a 4-byte number;
//! - container IDs (64 hex digits) and pod UIDs (UUIDs) are kept as the bytes they spell;
//! - a block's claims are one array in address order, each address its place in the block, and
//!   the block's pod names one string beside it: two allocations per block of up to 64 claims,
//!   not a dozen per claim. Small allocations that outlive a list made at the same time are
//!   what keeps freed memory from going back to the system.
//!
//! About 120 bytes a claim before the indexes (`cargo bench -p allot-store --bench kube_scale`).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::IpAddr;
use std::num::NonZeroU32;
use std::sync::Arc;

use allot_core::addr::{IpFamily, addr_to_u128, u128_to_addr};
use allot_core::block::{BLOCK_HOST_BITS, REGION_LABEL, block_of, region_of};
use allot_core::store::{Attachment, Claim, PodRef, Taken};
use allot_k8s::{BlockClaim, IPBlock, IPBlockSpec};
use ipnet::IpNet;
use kube::api::ObjectMeta;

/// What others put in an IPBlock's metadata (a GitOps tool's labels and annotations, the
/// garbage collector's `foregroundDeletion` finalizer, owner references): kept as read and
/// written back with every replace, which would drop them otherwise. `None` when the block
/// carries nothing but allot's own labels, as nearly every block does.
#[derive(Clone, Debug, Default, PartialEq)]
pub(super) struct Kept {
    labels: BTreeMap<String, String>,
    annotations: BTreeMap<String, String>,
    finalizers: Vec<String>,
    owner_references: Vec<allot_k8s::openapi::apimachinery::pkg::apis::meta::v1::OwnerReference>,
}

// Every field compares structurally (`OwnerReference` only lacks the derive).
impl Eq for Kept {}

impl Kept {
    fn of(meta: &ObjectMeta) -> Option<Box<Kept>> {
        let mut labels = meta.labels.clone().unwrap_or_default();
        if labels.get(MANAGED_BY).map(String::as_str) == Some("allot") {
            labels.remove(MANAGED_BY);
        }
        // Allot's too: written anew from the block's name with every write.
        labels.remove(REGION_LABEL);
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
        labels.insert(REGION_LABEL.to_string(), region_of(self.cidr.network()));
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

/// A word's number in [`Words`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) struct Word(NonZeroU32);

impl Word {
    fn index(self) -> usize {
        self.0.get() as usize - 1
    }
}

/// The words claims repeat, each kept once.
#[derive(Default)]
pub(super) struct Words {
    numbers: HashMap<Arc<str>, Word>,
    texts: Vec<Option<Arc<str>>>,
    /// Numbers of forgotten words, given to new ones.
    free: Vec<Word>,
}

impl Words {
    pub fn word(&mut self, s: &str) -> Word {
        if let Some(&w) = self.numbers.get(s) {
            return w;
        }
        let text: Arc<str> = Arc::from(s);
        let w = match self.free.pop() {
            Some(w) => {
                self.texts[w.index()] = Some(text.clone());
                w
            }
            None => {
                self.texts.push(Some(text.clone()));
                let n = u32::try_from(self.texts.len()).expect("fewer than 2^32 words");
                Word(NonZeroU32::new(n).expect("at least one word"))
            }
        };
        self.numbers.insert(text, w);
        w
    }

    pub fn text(&self, w: Word) -> &str {
        self.shared(w)
    }

    pub fn shared(&self, w: Word) -> &Arc<str> {
        self.texts[w.index()]
            .as_ref()
            .expect("a word in use is kept (Words::keep_only is given every word in use)")
    }

    /// Words known.
    pub fn len(&self) -> usize {
        self.numbers.len()
    }

    /// Forgets every word not in `used`.
    pub fn keep_only(&mut self, used: &HashSet<Word>) {
        for (i, text) in self.texts.iter_mut().enumerate() {
            let w = Word(NonZeroU32::new(i as u32 + 1).expect("from 1"));
            if text.is_some() && !used.contains(&w) {
                self.numbers.remove(text.as_deref().expect("checked"));
                *text = None;
                self.free.push(w);
            }
        }
    }
}

/// An identifier, as the bytes it spells when it is 64 lowercase hex digits (a container ID)
/// or a lowercase UUID, else as a word.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Id {
    Hex([u8; 32]),
    Uuid([u8; 16]),
    Text(Word),
}

fn hex_bytes<const N: usize>(s: &str) -> Option<[u8; N]> {
    if s.len() != 2 * N || !s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
        return None;
    }
    let mut out = [0u8; N];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The bytes of a lowercase UUID.
fn uuid_bytes(s: &str) -> Option<[u8; 16]> {
    let b = s.as_bytes();
    if b.len() != 36 || [8, 13, 18, 23].iter().any(|&i| b[i] != b'-') {
        return None;
    }
    let digits: String = s.split('-').collect();
    hex_bytes::<16>(&digits)
}

impl Id {
    pub fn new(s: &str, words: &mut Words) -> Id {
        Id::of_bytes(s).unwrap_or_else(|| Id::Text(words.word(s)))
    }

    fn of_bytes(s: &str) -> Option<Id> {
        hex_bytes::<32>(s)
            .map(Id::Hex)
            .or_else(|| uuid_bytes(s).map(Id::Uuid))
    }

    /// Whether this is the identifier `s`.
    pub fn is(&self, s: &str, words: &Words) -> bool {
        match self {
            Id::Text(w) => words.text(*w) == s,
            bytes => Id::of_bytes(s).as_ref() == Some(bytes),
        }
    }

    pub fn text(&self, words: &Words) -> String {
        match self {
            Id::Hex(b) => hex(b),
            Id::Uuid(b) => {
                let h = hex(b);
                format!(
                    "{}-{}-{}-{}-{}",
                    &h[..8],
                    &h[8..12],
                    &h[12..16],
                    &h[16..20],
                    &h[20..]
                )
            }
            Id::Text(w) => words.text(*w).to_string(),
        }
    }

    fn word(&self) -> Option<Word> {
        match self {
            Id::Text(w) => Some(*w),
            _ => None,
        }
    }
}

/// One claim in the mirror.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Held {
    /// The address's place in its block.
    slot: u8,
    /// The pod's name: where it stands in the block's names.
    name: (u32, u32),
    pool: Word,
    network: Word,
    /// Container ID and interface.
    attachment: Option<(Id, Word)>,
    namespace: Word,
    uid: Id,
    owner_kind: Option<Word>,
    owner_name: Option<Word>,
    node: Word,
    updated_at: u64,
}

impl Held {
    fn words(&self) -> impl Iterator<Item = Word> + '_ {
        let attachment = self
            .attachment
            .iter()
            .flat_map(|(id, i)| [id.word(), Some(*i)]);
        [self.pool, self.network, self.namespace, self.node]
            .into_iter()
            .chain(attachment.flatten())
            .chain(self.uid.word())
            .chain(self.owner_kind)
            .chain(self.owner_name)
    }
}

/// Where `address` stands in the block `cidr` (64 addresses), if it is one of its addresses.
pub(super) fn slot_of(cidr: &IpNet, address: IpAddr) -> Option<u8> {
    let base = cidr.network();
    let slot = addr_to_u128(address).wrapping_sub(addr_to_u128(base));
    (IpFamily::of(address) == IpFamily::of(base) && slot >> BLOCK_HOST_BITS == 0)
        .then_some(slot as u8)
}

/// A block as the mirror keeps it.
pub(super) struct Stored {
    pub cidr: IpNet,
    pub node: Option<String>,
    pub version: Option<String>,
    pub kept: Option<Box<Kept>>,
    /// In address order.
    claims: Box<[Held]>,
    /// The claims' pod names, one after another.
    names: Box<str>,
    pub released: BTreeMap<IpAddr, u64>,
}

impl Stored {
    /// Keeps `block`. A claim of an address outside the block (never made by this store; the
    /// decoder already skips such entries, and the mirror before it comes here) is left out.
    pub fn new(block: Block, words: &mut Words) -> Stored {
        let mut names = String::new();
        let mut claims = Vec::with_capacity(block.claims.len());
        for (address, c) in &block.claims {
            let Some(slot) = slot_of(&block.cidr, *address) else {
                continue;
            };
            let start = names.len();
            names.push_str(&c.pod.name);
            claims.push(Held {
                slot,
                name: (start as u32, names.len() as u32),
                pool: words.word(&c.pool),
                network: words.word(&c.network),
                attachment: c
                    .attachment
                    .as_ref()
                    .map(|a| (Id::new(&a.container_id, words), words.word(&a.interface))),
                namespace: words.word(&c.pod.namespace),
                uid: Id::new(&c.pod.uid, words),
                owner_kind: c.pod.owner_kind.as_deref().map(|k| words.word(k)),
                owner_name: c.pod.owner_name.as_deref().map(|n| words.word(n)),
                node: words.word(&c.node),
                updated_at: c.updated_at,
            });
        }
        Stored {
            cidr: block.cidr,
            node: block.node,
            version: block.version,
            kept: block.kept,
            claims: claims.into_boxed_slice(),
            names: names.into_boxed_str(),
            released: block.released,
        }
    }

    pub fn len(&self) -> usize {
        self.claims.len()
    }

    pub fn is_empty(&self) -> bool {
        self.claims.is_empty()
    }

    fn address(&self, h: &Held) -> IpAddr {
        let base = addr_to_u128(self.cidr.network());
        u128_to_addr(IpFamily::of(self.cidr.network()), base + u128::from(h.slot))
    }

    pub fn get(&self, address: IpAddr) -> Option<&Held> {
        let slot = slot_of(&self.cidr, address)?;
        let i = self.claims.binary_search_by_key(&slot, |h| h.slot).ok()?;
        Some(&self.claims[i])
    }

    pub fn contains(&self, address: IpAddr) -> bool {
        self.get(address).is_some()
    }

    /// The claims, in address order.
    pub fn iter(&self) -> impl Iterator<Item = (IpAddr, &Held)> + '_ {
        self.claims.iter().map(|h| (self.address(h), h))
    }

    fn pod_name(&self, h: &Held) -> &str {
        &self.names[h.name.0 as usize..h.name.1 as usize]
    }

    pub fn claim(&self, h: &Held, words: &Words) -> Claim {
        Claim {
            address: self.address(h),
            pool: words.text(h.pool).to_string(),
            network: words.text(h.network).to_string(),
            attachment: h.attachment.as_ref().map(|(id, ifname)| Attachment {
                container_id: id.text(words),
                interface: words.text(*ifname).to_string(),
            }),
            pod: PodRef {
                namespace: words.text(h.namespace).to_string(),
                name: self.pod_name(h).to_string(),
                uid: h.uid.text(words),
                owner_kind: h.owner_kind.map(|w| words.text(w).to_string()),
                owner_name: h.owner_name.map(|w| words.text(w).to_string()),
            },
            node: words.text(h.node).to_string(),
            updated_at: h.updated_at,
        }
    }

    /// The addresses held, and their pools.
    pub fn taken<'a>(&'a self, words: &'a Words) -> impl Iterator<Item = Taken> + 'a {
        self.claims.iter().map(|h| Taken {
            address: self.address(h),
            pool: words.shared(h.pool).clone(),
        })
    }

    /// Whether `h` (one of this block's) holds what `c` says, without expanding it.
    pub fn matches(&self, h: &Held, c: &Claim, words: &Words) -> bool {
        let word = |w: Word, s: &str| words.text(w) == s;
        let maybe = |w: Option<Word>, s: Option<&str>| match (w, s) {
            (None, None) => true,
            (Some(w), Some(s)) => word(w, s),
            _ => false,
        };
        let attachment = match (&h.attachment, &c.attachment) {
            (None, None) => true,
            (Some((id, ifname)), Some(a)) => {
                id.is(&a.container_id, words) && word(*ifname, &a.interface)
            }
            _ => false,
        };
        self.address(h) == c.address
            && word(h.pool, &c.pool)
            && word(h.network, &c.network)
            && attachment
            && word(h.namespace, &c.pod.namespace)
            && self.pod_name(h) == c.pod.name
            && h.uid.is(&c.pod.uid, words)
            && maybe(h.owner_kind, c.pod.owner_kind.as_deref())
            && maybe(h.owner_name, c.pod.owner_name.as_deref())
            && word(h.node, &c.node)
            && h.updated_at == c.updated_at
    }

    /// The index keys of one of this block's claims: its attachment's and its pod's.
    pub fn keys(&self, h: &Held, words: &Words) -> (Option<u64>, u64) {
        let attachment = h
            .attachment
            .as_ref()
            .map(|(id, ifname)| key(&(id.text(words).as_str(), words.text(*ifname))));
        let pod = pod_key(words.text(h.namespace), self.pod_name(h));
        (attachment, pod)
    }

    /// Every word this block's claims use.
    pub fn words(&self) -> impl Iterator<Item = Word> + '_ {
        self.claims.iter().flat_map(Held::words)
    }

    pub fn expand(&self, name: &str, words: &Words) -> Block {
        Block {
            name: name.to_string(),
            cidr: self.cidr,
            node: self.node.clone(),
            version: self.version.clone(),
            kept: self.kept.clone(),
            claims: self
                .claims
                .iter()
                .map(|h| (self.address(h), self.claim(h, words)))
                .collect(),
            released: self.released.clone(),
        }
    }
}

/// An index key: a hash (lookups check the claims they find, so a collision costs a look, never
/// a wrong answer). std's SipHash with fixed keys: the same in every process of one build.
pub(super) fn key(value: &impl std::hash::Hash) -> u64 {
    use std::hash::Hasher;
    let mut h = std::collections::hash_map::DefaultHasher::new();
    value.hash(&mut h);
    h.finish()
}

pub(super) fn attachment_key(a: &Attachment) -> u64 {
    key(&(a.container_id.as_str(), a.interface.as_str()))
}

pub(super) fn pod_key(namespace: &str, name: &str) -> u64 {
    key(&(namespace, name))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(address: &str, pod: &str, container_id: &str, uid: &str) -> Claim {
        Claim {
            address: address.parse().unwrap(),
            pool: "p".into(),
            network: "n".into(),
            attachment: Some(Attachment {
                container_id: container_id.into(),
                interface: "eth0".into(),
            }),
            pod: PodRef {
                namespace: "ns".into(),
                name: pod.into(),
                uid: uid.into(),
                owner_kind: Some("StatefulSet".into()),
                owner_name: Some("web".into()),
            },
            node: "node-a".into(),
            updated_at: 7,
        }
    }

    fn block(cidr: &str, claims: &[Claim]) -> Block {
        let mut b = Block::empty("b".into(), cidr.parse().unwrap(), None);
        for c in claims {
            b.claims.insert(c.address, c.clone());
        }
        b
    }

    #[test]
    fn ids_read_back_exactly_whatever_their_form() {
        let mut words = Words::default();
        for s in [
            "0f3c9a7d1e2b0f3c9a7d1e2b0f3c9a7d1e2b0f3c9a7d1e2b0f3c9a7d1e2b0f3c",
            "6f1c2d3e-0000-4000-8000-000000000001",
            "6F1C2D3E-0000-4000-8000-000000000001",
            "0F3C9A7D1E2B0F3C9A7D1E2B0F3C9A7D1E2B0F3C9A7D1E2B0F3C9A7D1E2B0F3C",
            "c1",
            "",
            "6f1c2d3e-0000-4000-8000-00000000000",
            "6f1c2d3e00000-4000-8000-00000000000-",
            "zz1c2d3e-0000-4000-8000-000000000001",
        ] {
            let id = Id::new(s, &mut words);
            assert_eq!(id.text(&words), s);
            assert!(id.is(s, &words));
        }
        assert!(matches!(
            Id::new("6f1c2d3e-0000-4000-8000-000000000001", &mut words),
            Id::Uuid(_)
        ));
        assert!(matches!(Id::new(&"ab".repeat(32), &mut words), Id::Hex(_)));
        assert!(matches!(Id::new(&"AB".repeat(32), &mut words), Id::Text(_)));
        let hex = Id::new(&"ab".repeat(32), &mut words);
        assert!(!hex.is(&"AB".repeat(32), &words) && !hex.is(&"ab".repeat(31), &words));
    }

    #[test]
    fn a_block_reads_back_as_it_was_kept() {
        let mut words = Words::default();
        let web0 = claim(
            "10.0.0.65",
            "web-0",
            &"ab".repeat(32),
            "6f1c2d3e-0000-4000-8000-000000000001",
        );
        let detached = Claim {
            attachment: None,
            pod: PodRef {
                owner_kind: None,
                owner_name: None,
                ..web0.pod.clone()
            },
            ..claim(
                "10.0.0.127",
                "a-much-longer-pod-name-7d9f8c6b5-x2x4z",
                "c1",
                "u",
            )
        };
        let b = block("10.0.0.64/26", &[web0.clone(), detached.clone()]);
        let stored = Stored::new(b.clone(), &mut words);
        assert_eq!(stored.expand("b", &words), b);
        let held: Vec<(IpAddr, Claim)> = stored
            .iter()
            .map(|(a, h)| (a, stored.claim(h, &words)))
            .collect();
        assert_eq!(
            held,
            [
                (web0.address, web0.clone()),
                (detached.address, detached.clone())
            ]
        );
        let h = stored.get(web0.address).unwrap();
        assert!(stored.matches(h, &web0, &words));
        assert!(!stored.matches(h, &detached, &words));
        for changed in [
            Claim {
                updated_at: 8,
                ..web0.clone()
            },
            Claim {
                node: "node-b".into(),
                ..web0.clone()
            },
            claim("10.0.0.65", "web-1", &"ab".repeat(32), &web0.pod.uid),
            claim("10.0.0.65", "web-0", &"cd".repeat(32), &web0.pod.uid),
        ] {
            assert!(!stored.matches(h, &changed, &words), "{changed:?}");
        }
        assert_eq!(
            stored.keys(h, &words),
            (
                Some(attachment_key(web0.attachment.as_ref().unwrap())),
                pod_key("ns", "web-0")
            )
        );
        assert!(stored.get("10.0.0.66".parse().unwrap()).is_none());
        assert!(stored.get("10.0.0.1".parse().unwrap()).is_none());
        assert!(stored.get("fd00::41".parse().unwrap()).is_none());
    }

    #[test]
    fn a_claim_outside_its_block_is_not_kept() {
        let mut words = Words::default();
        let inside = claim("10.0.0.1", "a", "c1", "u1");
        let outside = claim("10.0.0.64", "b", "c2", "u2");
        let stored = Stored::new(block("10.0.0.0/26", &[inside, outside]), &mut words);
        assert_eq!(stored.len(), 1);
    }

    #[test]
    fn forgotten_words_are_not_kept_and_their_numbers_are_reused() {
        let mut words = Words::default();
        let a = words.word("team-a");
        let b = words.word("team-b");
        assert_eq!(words.word("team-a"), a);
        words.keep_only(&HashSet::from([b]));
        assert_eq!(words.len(), 1);
        assert_eq!(words.text(b), "team-b");
        let c = words.word("team-c");
        assert_eq!(c, a, "the forgotten number is given again");
        assert_eq!(words.text(c), "team-c");
        assert_eq!(words.word("team-b"), b);
    }

    #[test]
    fn a_kept_claim_is_small() {
        assert!(size_of::<Held>() <= 120, "{}", size_of::<Held>());
    }
}
