//! `KubeStore` against the shared store contract, each check on an in-memory API server of its
//! own (no API server can be installed where CI runs: see `tests/apiserver`).

use allot_core::store::system_clock;
use allot_store::{KubeConfig, KubeStore};
use allot_test_apiserver::ApiServer;

fn open(server: &ApiServer) -> KubeStore {
    let server = server.clone();
    let config = KubeConfig {
        node: Some("node-a".into()),
        ..KubeConfig::default()
    };
    KubeStore::open_with(&config, system_clock(), move || async move {
        Ok(server.client())
    })
    .expect("open a store on the test API server")
}

mod contract {
    allot_store::store_contract_tests! {
        location: allot_test_apiserver::ApiServer::new,
        open: super::open,
    }
}

// ---------------------------------------------------------------------------------------------
// What only the Kubernetes store promises: batches across blocks, hand-edited blocks, watches
// that lost their history.

use std::time::{Duration, Instant};

use allot_core::store::{ChangeKind, Changes, Store, StoreError};
use allot_store::contract::{attachment, claim, ip, pod};
use serde_json::json;

const T0: u64 = 1_700_000_000;

fn eventually<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(t) = f() {
            return t;
        }
        assert!(Instant::now() < deadline, "{what}: not within 10 s");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A dual-stack batch is two blocks; when the second refuses, the first is rolled back, so the
/// batch is still all or nothing once the call returns.
#[test]
fn a_batch_across_blocks_is_rolled_back_when_a_later_block_refuses() {
    let server = ApiServer::new();
    let store = open(&server);
    let other = attachment("other", "eth0");
    store
        .claim(&[claim(
            "fd00::5",
            "v6",
            Some(&other),
            &pod("ns", "o", "uo"),
            T0,
        )])
        .unwrap();
    let start = store.snapshot(0).unwrap().revision;
    let me = attachment("me", "eth0");
    let p = pod("ns", "me", "um");
    assert_eq!(
        store.claim(&[
            claim("10.0.0.5", "v4", Some(&me), &p, T0),
            claim("fd00::5", "v6", Some(&me), &p, T0),
        ]),
        Err(StoreError::Conflict(ip("fd00::5")))
    );
    assert!(store.claims_of(&me).unwrap().is_empty());
    let v4 = server
        .objects("ipblocks")
        .into_iter()
        .find(|o| o["metadata"]["name"] == "v4-10-0-0-0-26")
        .expect("the IPv4 block was written, then rolled back");
    assert!(v4["spec"]["claims"].get("10.0.0.5").is_none(), "{v4}");
    // Others saw the address come and go; nobody holds it.
    let Changes::Since { changes, .. } = store.changes_since(start).unwrap() else {
        panic!("compacted")
    };
    let kinds: Vec<ChangeKind> = changes.iter().map(|c| c.kind).collect();
    assert_eq!(kinds, [ChangeKind::Claimed, ChangeKind::Released]);
    store
        .claim(&[claim(
            "10.0.0.5",
            "v4",
            Some(&other),
            &pod("ns", "o", "uo"),
            T0,
        )])
        .expect("the rolled-back address is free");
}

/// A hand edit that writes a claim into a block it does not belong to claims nothing: the
/// address's own block decides, and the misplaced entry is ignored (it frees nothing either).
/// A hand edit of `spec.cidr` frees nothing: the block's name says what it holds.
#[test]
fn a_claim_written_into_the_wrong_block_by_hand_is_ignored() {
    let server = ApiServer::new();
    server.insert(
        "ipblocks",
        json!({"apiVersion": "allot.dev/v1alpha1", "kind": "IPBlock",
               "metadata": {"name": "v4-10-0-0-0-26"},
               // A wrong cidr does not matter: the name says which addresses the block holds.
               "spec": {"cidr": "10.9.9.0/26", "claims": {
                   "10.0.0.1": {"pool": "p", "network": "n", "containerId": "c1", "interface": "eth0",
                                "namespace": "ns", "pod": "a", "uid": "u", "updatedAt": T0},
                   "10.0.9.9": {"pool": "p", "network": "n", "containerId": "c2", "interface": "eth0",
                                "namespace": "ns", "pod": "b", "uid": "u", "updatedAt": T0},
                   "not-an-address": {"pool": "p", "network": "n", "namespace": "ns", "pod": "c",
                                "uid": "u", "updatedAt": T0}}}}),
    );
    let store = open(&server);
    let held: Vec<_> = store
        .all()
        .unwrap()
        .into_iter()
        .map(|c| c.address)
        .collect();
    assert_eq!(held, [ip("10.0.0.1")]);
    assert_eq!(
        store.claim(&[claim(
            "10.0.0.1",
            "p",
            Some(&attachment("x", "eth0")),
            &pod("ns", "x", "u"),
            T0
        )]),
        Err(StoreError::Conflict(ip("10.0.0.1")))
    );
}

/// A watch whose history the API server forgot (`410 Gone` after a compaction) lists again;
/// what changed meanwhile reaches the feed, and the store keeps following.
#[test]
fn a_watch_that_lost_its_history_lists_again_and_keeps_following() {
    let server = ApiServer::new();
    let node = open(&server);
    let other = open(&server);
    let start = node.snapshot(0).unwrap().revision;
    server.delay("watch", "ipblocks", Duration::from_millis(300));
    server.close_watches();
    let a = attachment("c1", "eth0");
    other
        .claim(&[claim("10.0.0.1", "p", Some(&a), &pod("ns", "p", "u"), T0)])
        .unwrap();
    server.compact();
    server.clear_faults();
    let seen = eventually("the claim made while the watch was down", || {
        match node.changes_since(start).unwrap() {
            Changes::Since { changes, .. } if !changes.is_empty() => Some(changes),
            _ => None,
        }
    });
    assert_eq!(seen[0].address, ip("10.0.0.1"));
    assert!(
        server.requests("list", "ipblocks") >= 3,
        "listed again after 410"
    );
    other
        .claim(&[claim("10.0.0.2", "p", Some(&a), &pod("ns", "p", "u"), T0)])
        .unwrap();
    eventually("and the next claim through the new watch", || {
        (node.all().unwrap().len() == 2).then_some(())
    });
}

/// An emptied block goes once its releases are older than asked, while a block with a claim
/// stays whatever the age; another node's mirror drops the deleted block too, and the next
/// claim in its range creates it again.
#[test]
fn emptied_blocks_are_deleted_and_a_later_claim_creates_them_again() {
    let server = ApiServer::new();
    let (controller, node) = (open(&server), open(&server));
    let a = attachment("a", "eth0");
    let b = attachment("b", "eth0");
    node.claim(&[claim("10.0.0.5", "p", Some(&a), &pod("ns", "a", "ua"), T0)])
        .unwrap();
    node.claim(&[claim("10.0.1.5", "p", Some(&b), &pod("ns", "b", "ub"), T0)])
        .unwrap();
    node.release_attachment(&a).unwrap();
    eventually("the controller sees the release", || {
        (controller.all().unwrap().len() == 1).then_some(())
    });
    let now = system_clock()();
    // Still cooling down: nothing goes.
    assert_eq!(controller.remove_emptied(now - 3600, 100).unwrap(), 0);
    assert_eq!(server.objects("ipblocks").len(), 2);
    // Past it: the emptied block goes, the claimed one stays.
    assert_eq!(controller.remove_emptied(now + 1, 100).unwrap(), 1);
    let names: Vec<String> = server
        .objects("ipblocks")
        .iter()
        .map(|o| o["metadata"]["name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(names, ["v4-10-0-1-0-26"]);
    eventually("the node's mirror drops the deleted block", || {
        (node.stats().blocks == 1).then_some(())
    });
    node.claim(&[claim("10.0.0.6", "p", Some(&a), &pod("ns", "a", "ua"), T0)])
        .unwrap();
    assert_eq!(server.objects("ipblocks").len(), 2);
    eventually("the controller sees the new claim", || {
        (controller.all().unwrap().len() == 2).then_some(())
    });
}

/// A node whose mirror still holds the deleted block at its old version writes into it: the
/// API answers 404, the node reads again and creates the block with its claim.
#[test]
fn a_node_that_missed_the_delete_still_claims() {
    let server = ApiServer::new();
    let (controller, node) = (open(&server), open(&server));
    let a = attachment("a", "eth0");
    node.claim(&[claim("10.0.0.5", "p", Some(&a), &pod("ns", "a", "ua"), T0)])
        .unwrap();
    node.release_attachment(&a).unwrap();
    eventually("the controller sees the release", || {
        controller.all().unwrap().is_empty().then_some(())
    });
    // The node's watch is cut before it can see the delete.
    server.delay("watch", "ipblocks", Duration::from_secs(30));
    let watches = server.requests("watch", "ipblocks");
    server.close_watches();
    eventually("both stores watch again (and wait)", || {
        (server.requests("watch", "ipblocks") >= watches + 2).then_some(())
    });
    let now = system_clock()();
    assert_eq!(controller.remove_emptied(now + 1, 100).unwrap(), 1);
    assert!(server.objects("ipblocks").is_empty());
    assert_eq!(
        node.stats().blocks,
        1,
        "the node still holds the old version"
    );
    node.claim(&[claim("10.0.0.9", "p", Some(&a), &pod("ns", "a", "ua"), T0)])
        .unwrap();
    let blocks = server.objects("ipblocks");
    assert_eq!(blocks.len(), 1);
    assert_eq!(blocks[0]["spec"]["claims"]["10.0.0.9"]["pod"], "a");
    server.clear_faults();
}
