//! `KubeStore` on a real kube-apiserver (upstream etcd and kube-apiserver on 127.0.0.1,
//! `allot_lab::LoopbackControlPlane`) with allot's CRDs: the shared store contract, every
//! check in one test on one API server, each check on an emptied IPBlock space (a control
//! plane takes seconds to start, a check milliseconds); then what only the Kubernetes store
//! promises, likewise. What needs faults a real server cannot produce on demand is in
//! `kubernetes_faults.rs`.

use allot_core::store::{ChangeKind, Changes, Store, StoreError, system_clock};
use allot_lab::LoopbackControlPlane;
use allot_store::contract::{Sequence, attachment, claim, ip, pod};
use allot_store::{KubeConfig, KubeStore};
use serde_json::{Value, json};

use crate::eventually;

const T0: u64 = 1_700_000_000;
const API_VERSION: &str = "allot.dev/v1alpha1";

/// etcd and kube-apiserver with allot's CRDs Established; None when the lab's tests are
/// skipped here (`ALLOT_LAB_SKIP`).
fn start(test: &str) -> Option<LoopbackControlPlane> {
    let plane = LoopbackControlPlane::for_test(test, Default::default())?;
    plane
        .apply_crds(&allot_k8s::crds())
        .expect("allot's CRDs applied");
    Some(plane)
}

/// A store's configuration on the API server (as the admin), once no IPBlock is left.
fn emptied(plane: &LoopbackControlPlane) -> KubeConfig {
    plane
        .delete_all(API_VERSION, "ipblocks")
        .expect("every IPBlock deleted");
    KubeConfig {
        kubeconfig: Some(plane.kubeconfig().to_path_buf()),
        node: Some("node-a".into()),
        ..KubeConfig::default()
    }
}

fn open(config: &KubeConfig) -> KubeStore {
    KubeStore::connect(config).expect("open a store on the API server")
}

mod contract {
    allot_store::store_contract_tests! {
        in_sequence: every_contract_check_on_a_real_api_server,
        setup: || super::start("every_contract_check_on_a_real_api_server"),
        location: super::emptied,
        open: super::open,
    }
}

// ---------------------------------------------------------------------------------------------
// What only the Kubernetes store promises: batches across blocks, hand-edited blocks, emptied
// blocks.

fn blocks(plane: &LoopbackControlPlane) -> Vec<Value> {
    plane
        .list(API_VERSION, "ipblocks")
        .expect("IPBlocks listed")
}

#[test]
fn kubernetes_only_checks_on_a_real_api_server() {
    let Some(plane) = start("kubernetes_only_checks_on_a_real_api_server") else {
        return;
    };
    let mut run = Sequence::new("kubernetes_only_checks_on_a_real_api_server");
    run.check(
        "a_batch_across_blocks_is_rolled_back_when_a_later_block_refuses",
        || a_batch_across_blocks_is_rolled_back_when_a_later_block_refuses(&plane),
    );
    run.check(
        "a_claim_written_into_the_wrong_block_by_hand_is_ignored",
        || a_claim_written_into_the_wrong_block_by_hand_is_ignored(&plane),
    );
    run.check(
        "emptied_blocks_are_deleted_and_a_later_claim_creates_them_again",
        || emptied_blocks_are_deleted_and_a_later_claim_creates_them_again(&plane),
    );
    run.check(
        "concurrent_claims_of_one_block_are_written_together_and_a_refusal_spoils_none",
        || concurrent_claims_of_one_block_are_written_together_and_a_refusal_spoils_none(&plane),
    );
    run.finish();
}

/// 48 ADDs of one node claiming 48 addresses of one block at once, and 4 more claiming an
/// address another node holds: the 48 all land, in far fewer writes than calls and none lost to
/// each other (each write carries the claims that queued while the one before it was on its
/// way), and only the 4 are refused.
fn concurrent_claims_of_one_block_are_written_together_and_a_refusal_spoils_none(
    plane: &LoopbackControlPlane,
) {
    let config = emptied(plane);
    let other_node = open(&KubeConfig {
        node: Some("node-b".into()),
        ..config.clone()
    });
    other_node
        .claim(&[claim(
            "10.0.0.60",
            "p",
            Some(&attachment("theirs", "eth0")),
            &pod("ns", "theirs", "ut"),
            T0,
        )])
        .unwrap();
    let store = open(&config);
    eventually("this node sees the other node's claim", || {
        (store.all().unwrap().len() == 1).then_some(())
    });
    let before = store.stats();
    let start = std::sync::Barrier::new(52);
    let answers: Vec<(String, Result<(), StoreError>)> = std::thread::scope(|s| {
        let threads: Vec<_> = (0..52)
            .map(|i| {
                let (store, start) = (&store, &start);
                s.spawn(move || {
                    let address = if i < 48 {
                        format!("10.0.0.{i}")
                    } else {
                        "10.0.0.60".to_string()
                    };
                    let me = attachment(&format!("c{i}"), "eth0");
                    let c = claim(
                        &address,
                        "p",
                        Some(&me),
                        &pod("ns", &format!("p{i}"), "u"),
                        T0,
                    );
                    start.wait();
                    (address, store.claim(&[c]))
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).collect()
    });
    for (address, answer) in &answers {
        match address.as_str() {
            "10.0.0.60" => assert_eq!(answer, &Err(StoreError::Conflict(ip(address)))),
            _ => assert_eq!(answer, &Ok(()), "{address}"),
        }
    }
    let after = store.stats();
    let requests = after.requests - before.requests;
    assert_eq!(
        after.conflicts, before.conflicts,
        "no write lost to this node's own"
    );
    assert!(requests <= 24, "{requests} API requests for 52 calls");
    let block = blocks(plane)
        .into_iter()
        .find(|o| o["metadata"]["name"] == "v4-10-0-0-0-26")
        .expect("the block");
    let claims = block["spec"]["claims"].as_object().unwrap();
    assert_eq!(claims.len(), 49, "{block}");
    assert_eq!(claims["10.0.0.60"]["containerId"], "theirs");
}

/// A dual-stack batch is two blocks; when the second refuses, the first is rolled back, so the
/// batch is still all or nothing once the call returns.
fn a_batch_across_blocks_is_rolled_back_when_a_later_block_refuses(plane: &LoopbackControlPlane) {
    let config = emptied(plane);
    let store = open(&config);
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
    let v4 = blocks(plane)
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
fn a_claim_written_into_the_wrong_block_by_hand_is_ignored(plane: &LoopbackControlPlane) {
    let config = emptied(plane);
    plane
        .create(
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
        )
        .expect("the hand-written block stored");
    let store = open(&config);
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

/// An emptied block goes once its releases are older than asked, while a block with a claim
/// stays whatever the age; another node's mirror drops the deleted block too, and the next
/// claim in its range creates it again.
fn emptied_blocks_are_deleted_and_a_later_claim_creates_them_again(plane: &LoopbackControlPlane) {
    let config = emptied(plane);
    let (controller, node) = (open(&config), open(&config));
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
    assert_eq!(blocks(plane).len(), 2);
    // Past it: the emptied block goes, the claimed one stays.
    assert_eq!(controller.remove_emptied(now + 1, 100).unwrap(), 1);
    let names: Vec<String> = blocks(plane)
        .iter()
        .map(|o| o["metadata"]["name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(names, ["v4-10-0-1-0-26"]);
    eventually("the node's mirror drops the deleted block", || {
        (node.stats().blocks == 1).then_some(())
    });
    node.claim(&[claim("10.0.0.6", "p", Some(&a), &pod("ns", "a", "ua"), T0)])
        .unwrap();
    assert_eq!(blocks(plane).len(), 2);
    eventually("the controller sees the new claim", || {
        (controller.all().unwrap().len() == 2).then_some(())
    });
}
