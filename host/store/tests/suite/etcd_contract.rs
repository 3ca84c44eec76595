//! `EtcdStore` against the shared store contract, each check on an etcd of its own (etcd's
//! revision is global, and the feed checks count revisions), plus what only etcd promises.

use allot_store::etcd::testing::EtcdServer;
use allot_store::{EtcdConfig, EtcdStore};

fn open(server: &EtcdServer) -> EtcdStore {
    EtcdStore::connect(&EtcdConfig::from_url(&server.url()).expect("url")).expect("connect")
}

mod contract {
    allot_store::store_contract_tests! {
        location: allot_store::etcd::testing::EtcdServer::start,
        open: super::open,
    }
}

// ---------------------------------------------------------------------------------------------
// What only etcd promises: partitions, compaction, lost connections.

use std::net::IpAddr;
use std::time::{Duration, Instant};

use allot_core::store::{ChangeKind, Changes, Claim, Store, StoreError};
use allot_store::contract::{attachment, claim, ip, pod};
use allot_store::etcd::testing::CutProxy;

const T0: u64 = 1_700_000_000;

fn through(proxy: &CutProxy) -> EtcdStore {
    EtcdStore::connect(&EtcdConfig::from_url(&proxy.url()).unwrap()).unwrap()
}

fn eventually<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(t) = f() {
            return t;
        }
        assert!(Instant::now() < deadline, "{what}: not within 20 s");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A node cut off from etcd while others claim and release and etcd compacts its history:
/// when it is back its watch cannot resume, and its readers are told to resync (a fresh
/// snapshot), after which the feed follows again.
#[test]
fn a_watch_that_lost_history_to_compaction_makes_readers_resync() {
    let etcd = EtcdServer::start();
    let proxy = CutProxy::start(etcd.client_addr());
    let node = through(&proxy);
    let other = open(&etcd);
    let p = pod("ns", "p", "u");
    let (a1, a2, a3) = (
        attachment("c1", "eth0"),
        attachment("c2", "eth0"),
        attachment("c3", "eth0"),
    );
    let start = node.snapshot(0).unwrap().revision;
    other
        .claim(&[claim("10.0.0.1", "p", Some(&a1), &p, T0)])
        .unwrap();
    let followed = eventually("the node follows a claim", || {
        match node.changes_since(start) {
            Ok(Changes::Since { changes, revision }) if !changes.is_empty() => Some(revision),
            _ => None,
        }
    });

    proxy.cut();
    other
        .claim(&[claim("10.0.0.2", "p", Some(&a2), &p, T0)])
        .unwrap();
    assert!(other.release(ip("10.0.0.1"), Some(&a1)).unwrap());
    etcd.compact();
    proxy.restore();

    eventually("the node's readers are told to resync", || {
        matches!(node.changes_since(followed), Ok(Changes::Compacted)).then_some(())
    });
    let snapshot = node.snapshot(0).unwrap();
    let held: Vec<IpAddr> = snapshot.claims.iter().map(|c| c.address).collect();
    assert_eq!(held, [ip("10.0.0.2")], "the snapshot is the truth");
    other
        .claim(&[claim("10.0.0.3", "p", Some(&a3), &p, T0)])
        .unwrap();
    let seen = eventually("the feed follows again", || {
        match node.changes_since(snapshot.revision) {
            Ok(Changes::Since { changes, .. }) if !changes.is_empty() => Some(changes),
            _ => None,
        }
    });
    assert_eq!(
        seen.iter().map(|c| (c.address, c.kind)).collect::<Vec<_>>(),
        [(ip("10.0.0.3"), ChangeKind::Claimed)]
    );
}

/// Writes that change no claim (pools applied, other applications' keys in the same etcd) move
/// etcd's revision without an event on the claims' watch: the feed still confirms the current
/// revision at once, instead of holding every reader until the next claim.
#[test]
fn revisions_that_change_no_claim_are_confirmed_at_once() {
    let etcd = EtcdServer::start();
    let node = open(&etcd);
    let other = open(&etcd);
    let p = pod("ns", "p", "u");
    let start = node.snapshot(0).unwrap().revision;
    other
        .claim(&[claim(
            "10.0.0.1",
            "p",
            Some(&attachment("c1", "eth0")),
            &p,
            T0,
        )])
        .unwrap();
    etcd.etcdctl(&["put", "/another-application/key", "v"]);
    etcd.etcdctl(&["put", "/allot/config/IPPool/unrelated", "{}"]);
    let now = node.snapshot(0).unwrap().revision;
    let Changes::Since { changes, revision } = node.changes_since(start).unwrap() else {
        panic!("nothing was compacted");
    };
    assert_eq!(
        changes.iter().map(|c| c.address).collect::<Vec<_>>(),
        [ip("10.0.0.1")]
    );
    assert_eq!(
        revision, now,
        "the feed reaches the current revision, not only the last claim's"
    );
    // Confirming a quiet revision skips nothing that comes after it.
    other
        .claim(&[claim(
            "10.0.0.2",
            "p",
            Some(&attachment("c2", "eth0")),
            &p,
            T0,
        )])
        .unwrap();
    let Changes::Since { changes, .. } = node.changes_since(now).unwrap() else {
        panic!("nothing was compacted");
    };
    assert_eq!(
        changes.iter().map(|c| c.address).collect::<Vec<_>>(),
        [ip("10.0.0.2")]
    );
}

/// Connections cut at random moments while a client claims dual-stack batches: every batch is
/// stored whole or not at all (whatever the client was told), a batch reported claimed is
/// stored, and every stored claim has its index keys.
#[test]
fn a_connection_lost_mid_batch_leaves_nothing_half_written() {
    let etcd = EtcdServer::start();
    let proxy = CutProxy::start(etcd.client_addr());
    let node = through(&proxy);
    let stop = std::sync::atomic::AtomicBool::new(false);
    let outcomes: Vec<(usize, Result<(), StoreError>)> = std::thread::scope(|s| {
        s.spawn(|| {
            let mut n: u64 = 7;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                n = n
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                std::thread::sleep(Duration::from_micros(500 + (n >> 33) % 4000));
                proxy.reset();
            }
        });
        let outcomes = (0..300)
            .map(|i| {
                let att = attachment(&format!("c{i}"), "eth0");
                let p = pod("ns", &format!("p{i}"), "u");
                let v4 = format!("10.1.{}.{}", i / 256, i % 256);
                let v6 = format!("fd00:1::{i:x}");
                let batch = [
                    claim(&v4, "v4", Some(&att), &p, T0),
                    claim(&v6, "v6", Some(&att), &p, T0),
                ];
                (i, node.claim(&batch))
            })
            .collect();
        stop.store(true, std::sync::atomic::Ordering::SeqCst);
        outcomes
    });
    let failed = outcomes.iter().filter(|(_, r)| r.is_err()).count();
    eprintln!("{failed} of 300 batches failed while connections were cut");
    assert!(
        outcomes
            .iter()
            .all(|(_, r)| matches!(r, Ok(()) | Err(StoreError::Unavailable { .. }))),
        "a lost connection is Unavailable: {:?}",
        outcomes.iter().find(|(_, r)| r.is_err())
    );

    let truth = open(&etcd);
    let all: Vec<Claim> = truth.all().unwrap();
    for (i, result) in &outcomes {
        let att = attachment(&format!("c{i}"), "eth0");
        let stored: Vec<&Claim> = all
            .iter()
            .filter(|c| c.attachment.as_ref() == Some(&att))
            .collect();
        assert!(
            stored.is_empty() || stored.len() == 2,
            "batch {i} is half written: {stored:?}"
        );
        if result.is_ok() {
            assert_eq!(
                stored.len(),
                2,
                "batch {i} was reported claimed but is not stored"
            );
        }
        let indexed = truth.claims_of(&att).unwrap();
        assert_eq!(
            indexed.len(),
            stored.len(),
            "batch {i}: index keys match claims"
        );
        let by_pod = truth.claims_of_pod("ns", &format!("p{i}")).unwrap();
        assert_eq!(by_pod.len(), stored.len(), "batch {i}: pod index matches");
    }
}

/// A production-like etcd: TLS only, client certificates required. With the CA and a client
/// certificate the store claims and follows; without the client certificate it fails clearly
/// and writes nothing.
#[test]
fn tls_with_client_certificates() {
    let etcd = EtcdServer::start_tls();
    let pki = etcd.pki().unwrap().clone();
    let url = format!("etcd://{}", etcd.endpoint());
    let config = EtcdConfig {
        ca: Some(pki.ca.clone()),
        cert: Some(pki.client_cert.clone()),
        key: Some(pki.client_key.clone()),
        ..EtcdConfig::from_url(&url).unwrap()
    };
    let store = EtcdStore::connect(&config).unwrap();
    let start = store.snapshot(0).unwrap().revision;
    let a = attachment("c1", "eth0");
    store
        .claim(&[claim("10.0.0.1", "p", Some(&a), &pod("ns", "p", "u"), T0)])
        .unwrap();
    match store.changes_since(start).unwrap() {
        Changes::Since { changes, .. } => assert_eq!(changes.len(), 1),
        Changes::Compacted => panic!("a young store is not compacted"),
    }

    let no_client_cert = EtcdConfig {
        cert: None,
        key: None,
        ..config.clone()
    };
    let refused = EtcdStore::connect(&no_client_cert)
        .and_then(|s| s.claim(&[claim("10.0.0.2", "p", Some(&a), &pod("ns", "p", "u"), T0)]));
    assert!(refused.is_err(), "etcd requires a client certificate");
    let plain = EtcdStore::connect(&EtcdConfig::from_url(&url).unwrap()).and_then(|s| s.all());
    assert!(plain.is_err(), "plain text to a TLS etcd fails");
    assert_eq!(store.all().unwrap().len(), 1, "nothing else was written");
}
