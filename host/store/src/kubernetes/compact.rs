//! Claims as the mirror keeps them: small. An agent mirrors every claim of the cluster (150,000
//! of them in a large one), so a claim's repeated words (pool, network, namespace, interface,
//! owner) are shared, and container IDs (64 hex digits) and pod UIDs (UUIDs) are kept as the
//! bytes they spell. About 440 bytes a claim with the indexes, against 1,350 as plain `Claim`s
//! (`cargo bench -p allot-store --bench kube_scale`).

use std::collections::HashSet;
use std::net::IpAddr;
use std::sync::Arc;

use allot_core::store::{Attachment, Claim, PodRef};

/// Shares equal strings.
#[derive(Default)]
pub(super) struct Interner(HashSet<Arc<str>>);

impl Interner {
    pub fn get(&mut self, s: &str) -> Arc<str> {
        if let Some(a) = self.0.get(s) {
            return a.clone();
        }
        let a: Arc<str> = Arc::from(s);
        self.0.insert(a.clone());
        a
    }

    /// Forgets strings no claim uses any more.
    pub fn prune(&mut self) {
        self.0.retain(|a| Arc::strong_count(a) > 1);
    }
}

/// An identifier, as the bytes it spells when it is 64 lowercase hex digits (a container ID)
/// or a lowercase UUID, else as text.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(super) enum Id {
    Hex([u8; 32]),
    Uuid([u8; 16]),
    Text(Box<str>),
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

impl Id {
    pub fn new(s: &str) -> Id {
        if let Some(b) = hex_bytes::<32>(s) {
            return Id::Hex(b);
        }
        let parts: Vec<&str> = s.split('-').collect();
        if parts.iter().map(|p| p.len()).eq([8, 4, 4, 4, 12])
            && let Some(b) = hex_bytes::<16>(&parts.concat())
        {
            return Id::Uuid(b);
        }
        Id::Text(s.into())
    }

    pub fn text(&self) -> String {
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
            Id::Text(t) => t.to_string(),
        }
    }
}

/// One claim in the mirror (its address is the key it is kept under).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Held {
    pool: Arc<str>,
    network: Arc<str>,
    /// Container ID and interface.
    attachment: Option<(Id, Arc<str>)>,
    namespace: Arc<str>,
    pod: Box<str>,
    uid: Id,
    owner_kind: Option<Arc<str>>,
    owner_name: Option<Arc<str>>,
    node: Arc<str>,
    updated_at: u64,
}

impl Held {
    pub fn new(c: &Claim, words: &mut Interner) -> Held {
        Held {
            pool: words.get(&c.pool),
            network: words.get(&c.network),
            attachment: c
                .attachment
                .as_ref()
                .map(|a| (Id::new(&a.container_id), words.get(&a.interface))),
            namespace: words.get(&c.pod.namespace),
            pod: c.pod.name.as_str().into(),
            uid: Id::new(&c.pod.uid),
            owner_kind: c.pod.owner_kind.as_deref().map(|k| words.get(k)),
            owner_name: c.pod.owner_name.as_deref().map(|n| words.get(n)),
            node: words.get(&c.node),
            updated_at: c.updated_at,
        }
    }

    pub fn claim(&self, address: IpAddr) -> Claim {
        Claim {
            address,
            pool: self.pool.to_string(),
            network: self.network.to_string(),
            attachment: self.attachment.as_ref().map(|(id, ifname)| Attachment {
                container_id: id.text(),
                interface: ifname.to_string(),
            }),
            pod: PodRef {
                namespace: self.namespace.to_string(),
                name: self.pod.to_string(),
                uid: self.uid.text(),
                owner_kind: self.owner_kind.as_deref().map(str::to_string),
                owner_name: self.owner_name.as_deref().map(str::to_string),
            },
            node: self.node.to_string(),
            updated_at: self.updated_at,
        }
    }

    pub fn pool(&self) -> &str {
        &self.pool
    }

    pub fn updated_at(&self) -> u64 {
        self.updated_at
    }

    /// The index keys of this claim: its attachment's and its pod's.
    pub fn attachment_key(&self) -> Option<u64> {
        self.attachment
            .as_ref()
            .map(|(id, ifname)| key(&(id.text().as_str(), &**ifname)))
    }

    pub fn pod_key(&self) -> u64 {
        key(&(&*self.namespace, &*self.pod))
    }
}

/// An index key: a hash (lookups check the claims they find, so a collision costs a look, never
/// a wrong answer).
pub(super) fn key(value: &impl std::hash::Hash) -> u64 {
    allot_core::engine::seed_of(value)
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

    #[test]
    fn ids_read_back_exactly_whatever_their_form() {
        for s in [
            "0f3c9a7d1e2b0f3c9a7d1e2b0f3c9a7d1e2b0f3c9a7d1e2b0f3c9a7d1e2b0f3c",
            "6f1c2d3e-0000-4000-8000-000000000001",
            "6F1C2D3E-0000-4000-8000-000000000001",
            "0F3C9A7D1E2B0F3C9A7D1E2B0F3C9A7D1E2B0F3C9A7D1E2B0F3C9A7D1E2B0F3C",
            "c1",
            "",
            "6f1c2d3e-0000-4000-8000-00000000000",
            "zz1c2d3e-0000-4000-8000-000000000001",
        ] {
            assert_eq!(Id::new(s).text(), s);
        }
        assert!(matches!(
            Id::new("6f1c2d3e-0000-4000-8000-000000000001"),
            Id::Uuid(_)
        ));
        assert!(matches!(Id::new(&"ab".repeat(32)), Id::Hex(_)));
        assert!(matches!(Id::new(&"AB".repeat(32)), Id::Text(_)));
    }

    #[test]
    fn a_claim_reads_back_as_it_was_kept() {
        let mut words = Interner::default();
        let c = Claim {
            address: "10.0.0.1".parse().unwrap(),
            pool: "p".into(),
            network: "n".into(),
            attachment: Some(Attachment {
                container_id: "ab".repeat(32),
                interface: "eth0".into(),
            }),
            pod: PodRef {
                namespace: "ns".into(),
                name: "web-0".into(),
                uid: "6f1c2d3e-0000-4000-8000-000000000001".into(),
                owner_kind: Some("StatefulSet".into()),
                owner_name: Some("web".into()),
            },
            node: "node-a".into(),
            updated_at: 7,
        };
        let held = Held::new(&c, &mut words);
        assert_eq!(held.claim(c.address), c);
        assert_eq!(
            held.attachment_key(),
            Some(attachment_key(c.attachment.as_ref().unwrap()))
        );
        assert_eq!(held.pod_key(), pod_key("ns", "web-0"));
        let detached = Claim {
            attachment: None,
            ..c.clone()
        };
        assert_eq!(Held::new(&detached, &mut words).claim(c.address), detached);
    }
}
