//! The IPBlocks a store follows (issue 40: an agent's load independent of the cluster's size):
//! an agent lists and watches the blocks of its node's pools by their region label, keeps the
//! blocks of its own claims, and follows every block while some block carries no region yet.
//! On `tests/apiserver`, whose request counts say what was listed and watched with which
//! selector; the same store against a real kube-apiserver is `kubernetes_contract.rs`.

use std::collections::BTreeSet;
use std::time::Duration;

use allot_core::block::{BlockScope, REGION_LABEL, region_of};
use allot_core::store::{Claim, Store};
use allot_store::KubeStore;
use allot_store::contract::{attachment, claim, ip, pod};
use allot_test_apiserver::ApiServer;

use crate::{eventually, on_test_apiserver};

const T0: u64 = 1_700_000_000;

fn open(server: &ApiServer, node: &str, scope: BlockScope) -> KubeStore {
    on_test_apiserver(server, node, scope)
}

/// A claim node-b made (the contract's claims record node-a).
fn node_b(address: &str) -> Claim {
    let a = attachment("c1", "eth0");
    Claim {
        node: "node-b".into(),
        ..claim(address, "p", Some(&a), &pod("ns", "web", "u1"), T0)
    }
}

fn regions(addresses: &[&str]) -> BlockScope {
    BlockScope::Regions(addresses.iter().map(|a| region_of(ip(a))).collect())
}

fn addresses(store: &KubeStore) -> BTreeSet<String> {
    store
        .all()
        .unwrap()
        .iter()
        .map(|c| c.address.to_string())
        .collect()
}

/// Another node (the writer) claims one address in each of three regions; a store scoped to
/// two of them holds their claims only, and follows their changes; scoped to the third, it
/// lists again and drops the others.
#[test]
fn a_scoped_store_lists_and_follows_only_its_regions_blocks() {
    let server = ApiServer::new();
    let writer = open(&server, "node-b", BlockScope::All);
    for address in ["198.51.100.1", "198.51.112.1", "203.0.113.1"] {
        writer.claim(&[node_b(address)]).unwrap();
    }
    // Every block the store wrote carries its region.
    for block in server.objects("ipblocks") {
        let cidr = block["spec"]["cidr"].as_str().unwrap();
        let first = cidr.split('/').next().unwrap();
        assert_eq!(
            block["metadata"]["labels"][REGION_LABEL],
            region_of(ip(first))
        );
    }

    let node = open(&server, "node-a", regions(&["198.51.100.0", "203.0.113.0"]));
    assert_eq!(
        addresses(&node),
        BTreeSet::from(["198.51.100.1".into(), "203.0.113.1".into()])
    );
    assert_eq!(node.stats().regions, Some(2));
    // A change in a followed region arrives; one elsewhere does not.
    writer.claim(&[node_b("203.0.113.2")]).unwrap();
    writer.claim(&[node_b("198.51.112.2")]).unwrap();
    eventually("the claim in a followed region", || {
        addresses(&node).contains("203.0.113.2").then_some(())
    });
    std::thread::sleep(Duration::from_millis(200));
    assert!(!addresses(&node).contains("198.51.112.2"));

    let lists = server.requests("list", "ipblocks");
    node.scope_to(regions(&["198.51.112.0"]));
    eventually("the new scope's blocks, and no others", || {
        (addresses(&node) == BTreeSet::from(["198.51.112.1".into(), "198.51.112.2".into()]))
            .then_some(())
    });
    assert!(server.requests("list", "ipblocks") > lists, "listed again");
    // The same scope again lists nothing.
    let lists = server.requests("list", "ipblocks");
    node.scope_to(regions(&["198.51.112.0"]));
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(server.requests("list", "ipblocks"), lists);
}

/// The blocks of a node's own claims stay followed when its pools no longer cover them (a pool
/// edited away from the node): the DEL of its pod still finds what to release.
#[test]
fn a_store_keeps_following_the_blocks_of_its_nodes_claims() {
    let server = ApiServer::new();
    let node = open(&server, "node-a", regions(&["198.51.100.0"]));
    let a = attachment("c1", "eth0");
    node.claim(&[claim(
        "198.51.100.1",
        "p",
        Some(&a),
        &pod("ns", "web", "u1"),
        T0,
    )])
    .unwrap();
    node.scope_to(regions(&["203.0.113.0"]));
    assert_eq!(node.stats().regions, Some(2), "its claim's region kept");
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(node.release_attachment(&a).unwrap().len(), 1);
    assert!(
        server.objects("ipblocks")[0]["spec"]["claims"]
            .as_object()
            .is_none_or(|c| c.is_empty())
    );
}

/// A block an older allot wrote carries no region: until none is left, a scoped store follows
/// every block (none is missed); the controller's labelling ends that, and the next scope
/// lists by region.
#[test]
fn an_unlabelled_block_is_followed_until_the_controller_labels_it() {
    let server = ApiServer::new();
    let writer = open(&server, "node-b", BlockScope::All);
    writer.claim(&[node_b("203.0.113.1")]).unwrap();
    let mut old = server.objects("ipblocks").remove(0);
    old["metadata"]["labels"]
        .as_object_mut()
        .unwrap()
        .remove(REGION_LABEL);
    server.edit("ipblocks", old);

    let node = open(&server, "node-a", regions(&["198.51.100.0"]));
    assert_eq!(
        addresses(&node),
        BTreeSet::from(["203.0.113.1".into()]),
        "every block while one is unlabelled"
    );
    assert_eq!(writer.label_regions().unwrap(), 1);
    assert_eq!(writer.label_regions().unwrap(), 0, "none left");
    assert_eq!(
        server.objects("ipblocks")[0]["metadata"]["labels"][REGION_LABEL],
        region_of(ip("203.0.113.1"))
    );
    assert_eq!(
        server.objects("ipblocks")[0]["spec"]["claims"]["203.0.113.1"]["pod"],
        "web",
        "the claim untouched"
    );
    node.scope_to(regions(&["198.51.100.0", "192.0.2.0"]));
    eventually("the scoped list", || {
        addresses(&node).is_empty().then_some(())
    });
}
