//! The key layout under the configured prefix, and the JSON of a claim.
//!
//! ```text
//! PREFIX/claims/ADDRESS                           the claim (JSON below): the unit of truth
//! PREFIX/index/attachment/CONTAINER/IFACE/ADDRESS ""   claims of one attachment
//! PREFIX/index/pod/NAMESPACE/NAME/ADDRESS         ""   claims of one pod
//! PREFIX/index/detached/ADDRESS                   ""   kept StatefulSet addresses
//! PREFIX/released/ADDRESS                         unix seconds of the release (cool-down)
//! PREFIX/cursors/POOL                             the address the pool handed out last
//! PREFIX/last-claim-change                        ""   rewritten by every write of claims
//! ```
//!
//! Every write that touches a claim writes its index keys in the same transaction, so the
//! indexes are exact at every revision. Segments are the text as given, with `%` and `/`
//! percent-encoded so that a name can never reach into another key's range.
//!
//! `last-claim-change` exists for its `mod_revision`: the revision of the latest write of any
//! claim. One read of it tells an agent how far its watch must have come to know every claim
//! change up to now, whatever else (pools, other applications) moved etcd's revision since.

use std::net::IpAddr;

use allot_core::store::{Attachment, Claim, PodRef};
use serde::{Deserialize, Serialize};

/// The keys of one allot installation (one prefix).
#[derive(Clone, Debug)]
pub struct Keys {
    prefix: String,
}

impl Keys {
    /// `prefix` is used as given, without a trailing `/` (`/allot` gives `/allot/claims/…`).
    pub fn new(prefix: &str) -> Keys {
        Keys {
            prefix: prefix.trim_end_matches('/').to_string(),
        }
    }

    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    pub fn claims(&self) -> String {
        format!("{}/claims/", self.prefix)
    }

    pub fn claim(&self, address: IpAddr) -> String {
        format!("{}/claims/{address}", self.prefix)
    }

    pub fn by_attachment(&self, a: &Attachment) -> String {
        format!(
            "{}/index/attachment/{}/{}/",
            self.prefix,
            segment(&a.container_id),
            segment(&a.interface)
        )
    }

    pub fn by_pod(&self, namespace: &str, name: &str) -> String {
        format!(
            "{}/index/pod/{}/{}/",
            self.prefix,
            segment(namespace),
            segment(name)
        )
    }

    pub fn detached(&self) -> String {
        format!("{}/index/detached/", self.prefix)
    }

    pub fn released(&self) -> String {
        format!("{}/released/", self.prefix)
    }

    pub fn last_claim_change(&self) -> String {
        format!("{}/last-claim-change", self.prefix)
    }

    pub fn cursors(&self) -> String {
        format!("{}/cursors/", self.prefix)
    }

    pub fn cursor(&self, pool: &str) -> String {
        format!("{}/cursors/{}", self.prefix, segment(pool))
    }

    /// The address at the end of a key (`…/ADDRESS`), if it is one in canonical form.
    pub fn address_of(key: &[u8]) -> Option<IpAddr> {
        let key = std::str::from_utf8(key).ok()?;
        let (_, last) = key.rsplit_once('/')?;
        let address: IpAddr = last.parse().ok()?;
        (address.to_string() == last).then_some(address)
    }

    /// The name at the end of a key, decoded.
    pub fn name_of(key: &[u8]) -> Option<String> {
        let key = std::str::from_utf8(key).ok()?;
        let (_, last) = key.rsplit_once('/')?;
        unsegment(last)
    }
}

/// The end of the range of keys starting with `prefix` (etcd's `--prefix`).
pub fn range_end(prefix: &str) -> Vec<u8> {
    let mut end = prefix.as_bytes().to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

pub(super) fn segment(s: &str) -> String {
    s.replace('%', "%25").replace('/', "%2F")
}

fn unsegment(s: &str) -> Option<String> {
    let decoded = s.replace("%2F", "/").replace("%25", "%");
    (segment(&decoded) == s).then_some(decoded)
}

/// A claim as stored under `PREFIX/claims/ADDRESS`: what `etcdctl get` shows.
///
/// Fields this build does not know are ignored, not refused: an allot rolled back after a newer
/// one wrote claims with more fields must still read them (a rewrite then drops what it does not
/// know, which every field added so far tolerates: a claim without `node` is judged by nobody's
/// CNI GC).
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct StoredClaim {
    address: IpAddr,
    pool: String,
    network: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    attachment: Option<StoredAttachment>,
    pod: StoredPod,
    /// The node that made the claim (absent in claims written before it was recorded).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    node: String,
    updated_at: u64,
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct StoredAttachment {
    container_id: String,
    interface: String,
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct StoredPod {
    namespace: String,
    name: String,
    uid: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    owner_kind: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    owner_name: Option<String>,
}

pub fn encode(c: &Claim) -> String {
    let stored = StoredClaim {
        address: c.address,
        pool: c.pool.clone(),
        network: c.network.clone(),
        attachment: c.attachment.as_ref().map(|a| StoredAttachment {
            container_id: a.container_id.clone(),
            interface: a.interface.clone(),
        }),
        pod: StoredPod {
            namespace: c.pod.namespace.clone(),
            name: c.pod.name.clone(),
            uid: c.pod.uid.clone(),
            owner_kind: c.pod.owner_kind.clone(),
            owner_name: c.pod.owner_name.clone(),
        },
        node: c.node.clone(),
        updated_at: c.updated_at,
    };
    serde_json::to_string(&stored).expect("a claim serialises")
}

/// Why a claim key's value is not a claim; the message names the key and says what is wrong.
#[derive(Debug)]
pub enum DecodeError {
    /// The value is not a stored claim.
    Json {
        key: String,
        source: serde_json::Error,
    },
    /// The value's address is not the one its key names.
    WrongAddress { key: String, address: IpAddr },
}

impl std::fmt::Display for DecodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DecodeError::Json { key, source } => {
                write!(f, "claim {key:?} does not decode: {source}")
            }
            DecodeError::WrongAddress { key, address } => write!(
                f,
                "claim {key:?} holds address {address}, which is not the canonical address of its key"
            ),
        }
    }
}

impl std::error::Error for DecodeError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            DecodeError::Json { source, .. } => Some(source),
            DecodeError::WrongAddress { .. } => None,
        }
    }
}

/// Decodes the value of a claim key; the error names the key and says what is wrong.
pub fn decode(key: &[u8], value: &[u8]) -> Result<Claim, DecodeError> {
    let key_text = || String::from_utf8_lossy(key).into_owned();
    let stored: StoredClaim =
        serde_json::from_slice(value).map_err(|source| DecodeError::Json {
            key: key_text(),
            source,
        })?;
    match Keys::address_of(key) {
        Some(a) if a == stored.address => {}
        _ => {
            return Err(DecodeError::WrongAddress {
                key: key_text(),
                address: stored.address,
            });
        }
    }
    Ok(Claim {
        address: stored.address,
        pool: stored.pool,
        network: stored.network,
        attachment: stored.attachment.map(|a| Attachment {
            container_id: a.container_id,
            interface: a.interface,
        }),
        pod: PodRef {
            namespace: stored.pod.namespace,
            name: stored.pod.name,
            uid: stored.pod.uid,
            owner_kind: stored.pod.owner_kind,
            owner_name: stored.pod.owner_name,
        },
        node: stored.node,
        updated_at: stored.updated_at,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_cannot_reach_into_other_keys() {
        let keys = Keys::new("/allot/");
        let a = Attachment {
            container_id: "a/b%2F".into(),
            interface: "eth0".into(),
        };
        assert_eq!(
            keys.by_attachment(&a),
            "/allot/index/attachment/a%2Fb%252F/eth0/"
        );
        assert_eq!(keys.cursor("p/q"), "/allot/cursors/p%2Fq");
        assert_eq!(
            Keys::name_of(b"/allot/cursors/p%2Fq%25").as_deref(),
            Some("p/q%")
        );
        assert_eq!(Keys::name_of(b"/allot/cursors/p%2fq"), None);
    }

    #[test]
    fn addresses_must_be_canonical() {
        assert_eq!(
            Keys::address_of(b"/allot/claims/10.0.0.7"),
            Some("10.0.0.7".parse().unwrap())
        );
        assert_eq!(Keys::address_of(b"/allot/claims/2001:DB8::1"), None);
        assert_eq!(Keys::address_of(b"/allot/claims/010.0.0.7"), None);
    }

    #[test]
    fn range_ends() {
        assert_eq!(range_end("/a/"), b"/a0".to_vec());
        assert_eq!(range_end("a\u{7f}"), b"a\x80".to_vec());
    }

    #[test]
    fn a_claim_round_trips_and_a_mismatched_key_is_an_error() {
        let c = Claim {
            address: "fd00::7".parse().unwrap(),
            pool: "v6".into(),
            network: "net".into(),
            attachment: None,
            pod: PodRef {
                namespace: "ns".into(),
                name: "web-0".into(),
                uid: "u".into(),
                owner_kind: Some("StatefulSet".into()),
                owner_name: Some("web".into()),
            },
            node: "node-a".into(),
            updated_at: 7,
        };
        let json = encode(&c);
        assert_eq!(
            decode(b"/allot/claims/fd00::7", json.as_bytes()).unwrap(),
            c
        );
        let err = decode(b"/allot/claims/fd00::8", json.as_bytes())
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("not the canonical address of its key"),
            "{err}"
        );
        let err = decode(b"/allot/claims/fd00::7", b"{").unwrap_err();
        assert!(std::error::Error::source(&err).is_some());
        assert!(err.to_string().contains("does not decode"), "{err}");
    }

    #[test]
    fn claims_of_older_and_newer_allots_decode() {
        // Written before claims named their node: no node, which no node's CNI GC judges.
        let older = br#"{"address":"10.0.0.7","pool":"p","network":"n","pod":{"namespace":"ns","name":"a","uid":"u"},"updatedAt":5}"#;
        let claim = decode(b"/allot/claims/10.0.0.7", older).unwrap();
        assert_eq!(claim.node, "");
        assert!(!encode(&claim).contains("node"));
        // Written by a later allot with a field this one does not know: read, not refused, so
        // that rolling back to this version keeps the agents serving.
        let newer = br#"{"address":"10.0.0.7","pool":"p","network":"n","pod":{"namespace":"ns","name":"a","uid":"u","zone":"z"},"node":"n1","generation":3,"updatedAt":5}"#;
        let claim = decode(b"/allot/claims/10.0.0.7", newer).unwrap();
        assert_eq!((claim.node.as_str(), claim.updated_at), ("n1", 5));
    }
}
