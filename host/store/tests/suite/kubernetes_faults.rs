//! What the Kubernetes store does when the API server misbehaves in ways a real one cannot be
//! made to on demand: each check here runs on `tests/apiserver`, an in-memory API server with
//! injected faults, and says which fault and why. Everything else runs on a real
//! kube-apiserver (`kubernetes_contract.rs`).

use std::time::Duration;

use allot_core::block::BlockScope;
use allot_core::store::{Changes, Store, system_clock};
use allot_store::KubeStore;
use allot_store::contract::{attachment, claim, ip, pod};
use allot_test_apiserver::ApiServer;

use crate::{eventually, on_test_apiserver};

const T0: u64 = 1_700_000_000;

fn open(server: &ApiServer) -> KubeStore {
    on_test_apiserver(server, "node-a", BlockScope::All)
}

/// A watch whose history the API server forgot (`410 Gone` after a compaction) lists again;
/// what changed meanwhile reaches the feed, and the store keeps following.
///
/// Faults: the store's watch cut and held back while another store writes, then the history
/// compacted (`close_watches`, `delay`, `compact`). A real API server keeps a store's watch
/// open and serves it from its watch cache; it cannot be told to drop one client's watch and
/// forget the versions in between.
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

/// A node whose mirror still holds the deleted block at its old version writes into it: the
/// API answers 404, the node reads again and creates the block with its claim.
///
/// Fault: the node's watch cut and held back while another store deletes the block
/// (`close_watches`, `delay`). A real API server delivers the delete to every watch within
/// milliseconds; it cannot be told to hold it back from one.
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
