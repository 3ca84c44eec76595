//! The backend-independent contract every [`Store`] must pass.
//!
//! Each check is a `pub fn` that panics (with a message saying which promise broke) when the
//! backend misbehaves. [`store_contract_tests!`](crate::store_contract_tests) expands to one
//! `#[test]` per check, so that a test run names the behaviour that failed:
//!
//! ```ignore
//! mod contract {
//!     use allot_store::SqliteStore;
//!     allot_store::store_contract_tests! {
//!         // A fresh, empty location for a store, and whatever must outlive the store.
//!         location: || tempfile::tempdir().unwrap(),
//!         // Opens a store at a location; may be called more than once per location (two
//!         // handles racing; reopening after a drop).
//!         open: |dir: &tempfile::TempDir| SqliteStore::open(dir.path().join("claims.db")).unwrap(),
//!     }
//! }
//! ```
//!
//! A location is whatever identifies one store's data: a temporary directory for SQLite, a key
//! prefix for etcd, a label or namespace scope for Kubernetes. A volatile (in-memory) backend
//! can use an `Arc` of its shared state as the location, which makes "reopen" trivially true.
//!
//! Checks taking a store want it empty. Checks taking a location and an `open` function open
//! several handles on it: they check that independent clients (threads, processes, agents)
//! race safely and that what was committed is still there after reopening.
//!
//! A backend whose store is costly to bring up (a real API server) runs every check in one
//! test instead, each on a fresh location made from one fixture, with each check's name
//! printed and its failure attributed ([`Sequence`]):
//!
//! ```ignore
//! mod contract {
//!     allot_store::store_contract_tests! {
//!         in_sequence: every_check_on_one_api_server,
//!         // Once per test process; None skips the test (after saying why).
//!         setup: super::start_api_server,
//!         // A fresh, empty location from the fixture, before each check.
//!         location: super::emptied,
//!         open: super::open,
//!     }
//! }
//! ```
//!
//! When adding a check, add its name to the macro's list as well.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::Barrier;
use std::thread;

use allot_core::store::{Attachment, Claim, PodRef, Reattach, Store, StoreError};

mod concurrency;
mod detached;
mod feed;
mod holders;
mod suite;
pub use concurrency::*;
pub use detached::*;
pub use feed::*;
pub use holders::*;
pub use suite::Sequence;

/// Threads in the concurrency checks.
pub const THREADS: usize = 16;

/// How long one handle may take to see another handle's writes: no time at all for SQLite and
/// etcd (their reads are consistent), the watch's delay for Kubernetes (its reads answer from a
/// watch-fed mirror; a handle's own writes are there when the call returns).
pub const SETTLE: std::time::Duration = std::time::Duration::from_secs(10);

/// Asks `f` until it answers `Ok`, for up to [`SETTLE`]; returns the last answer either way,
/// for the caller to assert on.
pub fn settled<T>(mut f: impl FnMut() -> Result<T, T>) -> T {
    let deadline = std::time::Instant::now() + SETTLE;
    loop {
        match f() {
            Ok(t) => return t,
            Err(t) if std::time::Instant::now() >= deadline => return t,
            Err(_) => thread::sleep(std::time::Duration::from_millis(5)),
        }
    }
}

const T0: u64 = 1_700_000_000;
/// The node the contract's claims are made on, and the one a StatefulSet pod comes back on.
const NODE: &str = "node-a";
const OTHER_NODE: &str = "node-b";

// ---------------------------------------------------------------------------------------------
// Builders.

/// Parses an address (test data: panics on a typo).
pub fn ip(s: &str) -> IpAddr {
    s.parse()
        .unwrap_or_else(|e| panic!("bad test address {s:?}: {e}"))
}

pub fn attachment(container_id: &str, interface: &str) -> Attachment {
    Attachment {
        container_id: container_id.to_string(),
        interface: interface.to_string(),
    }
}

pub fn pod(namespace: &str, name: &str, uid: &str) -> PodRef {
    PodRef {
        namespace: namespace.to_string(),
        name: name.to_string(),
        uid: uid.to_string(),
        owner_kind: None,
        owner_name: None,
    }
}

/// A pod of the StatefulSet `name` minus its ordinal.
pub fn stateful_pod(namespace: &str, name: &str, uid: &str) -> PodRef {
    let set = name.rsplit_once('-').map_or(name, |(set, _)| set);
    PodRef {
        owner_kind: Some("StatefulSet".to_string()),
        owner_name: Some(set.to_string()),
        ..pod(namespace, name, uid)
    }
}

pub fn claim(
    address: &str,
    pool: &str,
    attachment: Option<&Attachment>,
    pod: &PodRef,
    updated_at: u64,
) -> Claim {
    Claim {
        address: ip(address),
        pool: pool.to_string(),
        network: "net-a".to_string(),
        attachment: attachment.cloned(),
        pod: pod.clone(),
        node: NODE.into(),
        updated_at,
    }
}

/// Gives the detached claim of `address` back to `pod` on `attachment` (network `net-a`) of
/// [`OTHER_NODE`].
fn reattach(
    store: &dyn Store,
    address: IpAddr,
    pod: &PodRef,
    attachment: &Attachment,
    now: u64,
) -> Result<Claim, StoreError> {
    store.reattach(Reattach {
        address,
        pod: pod.clone(),
        attachment: attachment.clone(),
        network: "net-a".into(),
        node: OTHER_NODE.into(),
        now,
    })
}

fn sorted(mut claims: Vec<Claim>) -> Vec<Claim> {
    claims.sort_by_key(|c| c.address);
    claims
}

fn must<T>(what: &str, r: Result<T, StoreError>) -> T {
    r.unwrap_or_else(|e| panic!("{what}: unexpected error: {e}"))
}

fn all(store: &dyn Store) -> Vec<Claim> {
    sorted(must("all", store.all()))
}

/// The `i`th test address of a family: 10.`net`.x.y or fd00:`net`::i.
fn nth(net: u8, i: usize, v6: bool) -> IpAddr {
    if v6 {
        ip(&format!("fd00:{net:x}::{i:x}"))
    } else {
        ip(&format!("10.{net}.{}.{}", i / 256, i % 256))
    }
}

/// A claim on `address` by `attachment`, for pod `pod-<container_id>`.
fn claim_at(address: IpAddr, attachment: &Attachment) -> Claim {
    Claim {
        address,
        pool: "race".to_string(),
        network: "net-a".to_string(),
        attachment: Some(attachment.clone()),
        pod: pod(
            "race",
            &format!("pod-{}", attachment.container_id),
            &format!("uid-{}", attachment.container_id),
        ),
        node: NODE.into(),
        updated_at: T0,
    }
}

// ---------------------------------------------------------------------------------------------
// Checks on one store.

/// A claim is returned by `claims_of` of its attachment, with every field as written.
pub fn claim_then_claims_of(store: &dyn Store) {
    let eth0 = attachment("c1", "eth0");
    let p = pod("default", "web-1", "uid-1");
    let claims = vec![
        claim("10.0.0.2", "v4", Some(&eth0), &p, T0),
        claim("fd00::2", "v6", Some(&eth0), &p, T0),
    ];
    must("claim", store.claim(&claims));
    assert_eq!(
        sorted(must("claims_of", store.claims_of(&eth0))),
        claims,
        "claims_of returns what was claimed"
    );
    assert_eq!(
        must("claims_of", store.claims_of(&attachment("c2", "eth0"))),
        vec![],
        "another attachment holds nothing"
    );
    assert_eq!(all(store), claims);
}

/// Claiming nothing succeeds and writes nothing.
pub fn empty_batch_is_a_no_op(store: &dyn Store) {
    must("claim of an empty batch", store.claim(&[]));
    assert_eq!(all(store), vec![]);
}

/// A held address cannot be claimed again, by another attachment or by the holder, and the
/// holder's claim is left as it was.
pub fn claim_of_held_address_conflicts(store: &dyn Store) {
    let (a, b) = (attachment("c1", "eth0"), attachment("c2", "eth0"));
    let held = claim("10.0.0.5", "p", Some(&a), &pod("ns", "a", "uid-a"), T0);
    must("claim", store.claim(std::slice::from_ref(&held)));
    let theirs = claim("10.0.0.5", "q", Some(&b), &pod("ns", "b", "uid-b"), T0 + 1);
    assert_eq!(
        store.claim(&[theirs]),
        Err(StoreError::Conflict(ip("10.0.0.5")))
    );
    assert_eq!(
        store.claim(std::slice::from_ref(&held)),
        Err(StoreError::Conflict(ip("10.0.0.5"))),
        "even by the holder"
    );
    assert_eq!(all(store), vec![held]);
}

/// A batch with one conflicting address writes none of its claims, wherever the conflict is.
pub fn batch_is_all_or_nothing(store: &dyn Store) {
    let holder = attachment("holder", "eth0");
    let held = claim(
        "10.0.0.3",
        "p",
        Some(&holder),
        &pod("ns", "holder", "u0"),
        T0,
    );
    must("claim", store.claim(std::slice::from_ref(&held)));

    let late = attachment("late", "eth0");
    let p = pod("ns", "late", "u1");
    for batch in [
        vec![
            claim("10.0.0.1", "p", Some(&late), &p, T0),
            claim("10.0.0.3", "p", Some(&late), &p, T0),
        ],
        vec![
            claim("10.0.0.3", "p", Some(&late), &p, T0),
            claim("10.0.0.4", "p", Some(&late), &p, T0),
        ],
        vec![
            claim("10.0.0.1", "p", Some(&late), &p, T0),
            claim("fd00::1", "p6", Some(&late), &p, T0),
            claim("10.0.0.3", "p", Some(&late), &p, T0),
            claim("10.0.0.4", "p", Some(&late), &p, T0),
        ],
    ] {
        let addresses: Vec<String> = batch.iter().map(|c| c.address.to_string()).collect();
        assert_eq!(
            store.claim(&batch),
            Err(StoreError::Conflict(ip("10.0.0.3"))),
            "batch {addresses:?} conflicts on 10.0.0.3"
        );
        assert_eq!(
            must("claims_of", store.claims_of(&late)),
            vec![],
            "batch {addresses:?}: nothing written"
        );
        assert_eq!(
            all(store),
            vec![held.clone()],
            "batch {addresses:?}: nothing written"
        );
    }
    // The addresses that were not in conflict are still free.
    must(
        "claim",
        store.claim(&[
            claim("10.0.0.1", "p", Some(&late), &p, T0),
            claim("10.0.0.4", "p", Some(&late), &p, T0),
        ]),
    );
}

/// A batch naming one address twice conflicts on it and writes nothing.
pub fn batch_naming_one_address_twice_conflicts(store: &dyn Store) {
    let a = attachment("c1", "eth0");
    let p = pod("ns", "a", "u");
    let batch = [
        claim("10.0.0.1", "p", Some(&a), &p, T0),
        claim("10.0.0.2", "p", Some(&a), &p, T0),
        claim("10.0.0.1", "p", Some(&a), &p, T0),
    ];
    assert_eq!(
        store.claim(&batch),
        Err(StoreError::Conflict(ip("10.0.0.1")))
    );
    assert_eq!(all(store), vec![]);
}

/// Once released, an address can be claimed by anyone.
pub fn released_address_can_be_claimed_again(store: &dyn Store) {
    let (a, b) = (attachment("c1", "eth0"), attachment("c2", "eth0"));
    must(
        "claim",
        store.claim(&[claim("10.0.0.9", "p", Some(&a), &pod("ns", "a", "ua"), T0)]),
    );
    assert!(must("release", store.release(ip("10.0.0.9"), Some(&a))));
    let again = claim("10.0.0.9", "p", Some(&b), &pod("ns", "b", "ub"), T0 + 5);
    must(
        "claim after release",
        store.claim(std::slice::from_ref(&again)),
    );
    assert_eq!(all(store), vec![again]);

    let released = must("release_attachment", store.release_attachment(&b));
    assert_eq!(released.len(), 1);
    must(
        "claim after release_attachment",
        store.claim(&[claim("10.0.0.9", "p", Some(&a), &pod("ns", "a", "ua"), T0)]),
    );
}

/// `release_attachment` removes and returns exactly the claims of that attachment: not those
/// of another container, nor of another interface of the same container, nor detached ones.
pub fn release_attachment_releases_only_that_attachment(store: &dyn Store) {
    let eth0 = attachment("c1", "eth0");
    let net1 = attachment("c1", "net1");
    let other = attachment("c2", "eth0");
    let p = pod("ns", "a", "ua");
    let mine = vec![
        claim("10.0.0.1", "p", Some(&eth0), &p, T0),
        claim("fd00::1", "p6", Some(&eth0), &p, T0),
    ];
    let theirs = vec![
        claim("10.0.0.2", "p", Some(&net1), &p, T0),
        claim("10.0.0.3", "p", Some(&other), &pod("ns", "b", "ub"), T0),
    ];
    must("claim", store.claim(&mine));
    must("claim", store.claim(&theirs));

    assert_eq!(
        sorted(must("release_attachment", store.release_attachment(&eth0))),
        mine
    );
    assert_eq!(must("claims_of", store.claims_of(&eth0)), vec![]);
    assert_eq!(
        all(store),
        theirs,
        "other attachments' claims are untouched"
    );
}

/// Releasing an attachment twice, or one that never held anything, is `Ok(vec![])`.
pub fn release_attachment_is_idempotent(store: &dyn Store) {
    let a = attachment("c1", "eth0");
    assert_eq!(
        must(
            "release_attachment of nothing",
            store.release_attachment(&a)
        ),
        vec![]
    );
    must(
        "claim",
        store.claim(&[claim("10.0.0.1", "p", Some(&a), &pod("ns", "a", "u"), T0)]),
    );
    assert_eq!(
        must("release_attachment", store.release_attachment(&a)).len(),
        1
    );
    assert_eq!(
        must("second release_attachment", store.release_attachment(&a)),
        vec![]
    );
    assert_eq!(all(store), vec![]);
}

/// `release` succeeds only for the attachment holding the address.
pub fn release_only_by_the_holder(store: &dyn Store) {
    let holder = attachment("c1", "eth0");
    let held = claim("10.0.0.1", "p", Some(&holder), &pod("ns", "a", "u"), T0);
    must("claim", store.claim(std::slice::from_ref(&held)));

    for not_holder in [
        attachment("c2", "eth0"),
        attachment("c1", "net1"),
        attachment("c2", "net1"),
    ] {
        assert!(
            !must("release", store.release(ip("10.0.0.1"), Some(&not_holder))),
            "{not_holder} does not hold it"
        );
    }
    assert!(
        !must("release", store.release(ip("10.0.0.1"), None)),
        "it is not detached"
    );
    assert_eq!(all(store), vec![held], "the claim is intact");

    assert!(
        must("release", store.release(ip("10.0.0.1"), Some(&holder))),
        "the holder releases it"
    );
    assert!(
        !must("release", store.release(ip("10.0.0.1"), Some(&holder))),
        "only once"
    );
    assert_eq!(all(store), vec![]);
}

/// Releasing an address nobody holds is `Ok(false)`.
pub fn release_of_unclaimed_address_is_false(store: &dyn Store) {
    assert!(!must(
        "release",
        store.release(ip("10.0.0.1"), Some(&attachment("c1", "eth0")))
    ));
    assert!(!must("release", store.release(ip("fd00::1"), None)));
}

/// `all` lists attached and detached claims of every pool and family.
pub fn all_lists_everything(store: &dyn Store) {
    let (a, b, c) = (
        attachment("c1", "eth0"),
        attachment("c2", "net1"),
        attachment("c3", "eth0"),
    );
    let mut expected = vec![
        claim("10.0.0.1", "p", Some(&a), &pod("ns", "a", "ua"), T0),
        claim("10.0.0.2", "p", Some(&b), &pod("ns", "b", "ub"), T0),
        claim("192.168.7.1", "q", Some(&b), &pod("ns", "b", "ub"), T0),
        claim("fd00::1", "p6", Some(&a), &pod("ns", "a", "ua"), T0),
        claim(
            "2001:db8::1",
            "q6",
            Some(&c),
            &stateful_pod("db", "pg-0", "uc"),
            T0,
        ),
    ];
    for claim in &expected {
        must("claim", store.claim(std::slice::from_ref(claim)));
    }
    must("detach", store.detach(&c, T0 + 1));
    expected[4].attachment = None;
    expected[4].updated_at = T0 + 1;
    assert_eq!(all(store), sorted(expected));
}

/// IPv4 and IPv6 addresses are distinct keys, written in any textual form and read back equal;
/// an IPv4-mapped IPv6 address is not the IPv4 address.
pub fn ipv4_and_ipv6(store: &dyn Store) {
    let a = attachment("c1", "eth0");
    let p = pod("ns", "a", "u");
    let addresses = [
        "0.0.0.0",
        "10.0.0.1",
        "255.255.255.255",
        "::",
        "::1",
        "::ffff:10.0.0.1",
        "2001:db8::1",
        "2001:db8:0:0:1:0:0:1",
        "fd00:1:2:3:4:5:6:7",
        "fe80::1:2",
        "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
    ];
    let claims: Vec<Claim> = addresses
        .iter()
        .map(|s| claim(s, "p", Some(&a), &p, T0))
        .collect();
    must("claim", store.claim(&claims));
    assert_eq!(
        sorted(must("claims_of", store.claims_of(&a))),
        sorted(claims.clone())
    );

    // The same addresses spelled differently are the same keys.
    for spelled in [
        "2001:0db8:0000:0000:0000:0000:0000:0001",
        "2001:DB8::1",
        "FD00:1:2:3:4:5:6:7",
        "0:0:0:0:0:0:0:1",
    ] {
        let again = claim(spelled, "p", Some(&attachment("c2", "eth0")), &p, T0);
        assert_eq!(
            store.claim(std::slice::from_ref(&again)),
            Err(StoreError::Conflict(again.address)),
            "{spelled}"
        );
    }
    assert!(must(
        "release",
        store.release(ip("::ffff:10.0.0.1"), Some(&a))
    ));
    assert_eq!(
        must("claims_of", store.claims_of(&a))
            .iter()
            .filter(|c| c.address == ip("10.0.0.1"))
            .count(),
        1,
        "releasing ::ffff:10.0.0.1 leaves 10.0.0.1"
    );
}

/// Every field survives the round trip, including empty, quoted and non-ASCII strings, owners
/// present or absent, and times far in the future.
pub fn fields_round_trip(store: &dyn Store) {
    let odd = Attachment {
        container_id: "0123456789abcdef".repeat(4),
        interface: "net1'; DROP TABLE claims; --".to_string(),
    };
    let claims = vec![
        Claim {
            address: ip("10.9.9.9"),
            pool: "pööl \"quoted\" 'single'".to_string(),
            network: "net-a".to_string(),
            attachment: Some(odd.clone()),
            pod: PodRef {
                namespace: "名前空間".to_string(),
                name: "pod%_*?".to_string(),
                uid: "6f1c3e2a-6f1c-4a1b-9c8d-0123456789ab".to_string(),
                owner_kind: Some("ReplicaSet".to_string()),
                owner_name: Some(String::new()),
            },
            node: NODE.into(),
            updated_at: 0,
        },
        Claim {
            address: ip("fd00::9"),
            pool: String::new(),
            network: "net-a".to_string(),
            attachment: Some(odd.clone()),
            pod: PodRef::default(),
            node: NODE.into(),
            updated_at: 4_102_444_800, // 2100-01-01
        },
    ];
    must("claim", store.claim(&claims));
    assert_eq!(sorted(must("claims_of", store.claims_of(&odd))), claims);
    assert_eq!(
        must("detached_of", store.detached_of("名前空間", "pod%")),
        vec![],
        "no pattern matching"
    );
    assert_eq!(all(store), claims);
}
