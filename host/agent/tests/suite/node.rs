//! The agent's request path in process: a node over the memory store with the embedded default
//! policy and pools from a standalone directory, its verbs called as the HTTP server calls them
//! (no socket, no root, no namespaces). The end-to-end tests (`tests/e2e`) run the same verbs
//! through the real plugin.

use std::net::IpAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use allot_agent::engine::{AgentEngine, STANDALONE_CLUSTER};
use allot_agent::inventory::Source;
use allot_agent::journal::Journal;
use allot_agent::node::{Node, NodeError};
use allot_agent::server;
use allot_api::{self as api, codes};
use allot_core::policy::{CniDefaults, NamespaceInfo, NodeInfo, PodInfo};
use allot_core::store::{
    Attachment, Changes, Claim, MemoryStore, PodRef, Reattach, Snapshot, Store, StoreError,
    system_clock,
};
use allot_engine::{AddRequest, Engine, EngineConfig};
use allot_policy::{Limits, PolicyEngine, PolicyRegistry, PolicySource};

pub(crate) const POOLS: &str = r#"
apiVersion: allot.dev/v1alpha1
kind: IPPool
metadata: {name: v4}
spec:
  subnet: 192.0.2.0/24
  ips: ["192.0.2.10-192.0.2.12"]
  gateway: 192.0.2.1
---
apiVersion: allot.dev/v1alpha1
kind: IPPool
metadata: {name: v6}
spec:
  subnet: 2001:db8:a110::/64
  ips: ["2001:db8:a110::10-2001:db8:a110::1f"]
  gateway: 2001:db8:a110::1
"#;

/// A node and what it lives in: its pools' directory and its journal.
struct Fixture {
    node: Arc<Node>,
    store: Arc<dyn Store>,
    pools: tempfile::TempDir,
    journal: tempfile::TempDir,
}

impl Fixture {
    fn new() -> Fixture {
        let pools = tempfile::tempdir().unwrap();
        std::fs::write(pools.path().join("pools.yaml"), POOLS).unwrap();
        let journal = tempfile::tempdir().unwrap();
        let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
        let node = node_on(&store, journal.path());
        let fixture = Fixture {
            node,
            store,
            pools,
            journal,
        };
        fixture.reload();
        assert!(fixture.node.ready(), "{:?}", fixture.node.status());
        fixture
    }

    fn reload(&self) {
        self.node
            .reload(&Source::Dir(self.pools.path().to_path_buf()));
    }

    /// Another agent process of this node: the same store, pools and journal.
    fn another_agent(&self) -> Arc<Node> {
        let node = node_on(&self.store, self.journal());
        node.reload(&Source::Dir(self.pools.path().to_path_buf()));
        assert!(node.ready(), "{:?}", node.status());
        node
    }

    fn journal(&self) -> &Path {
        self.journal.path()
    }

    /// Who holds `address` (container ID), if anyone; `-` for a claim no attachment holds.
    fn holder(&self, address: IpAddr) -> Option<String> {
        self.store
            .all()
            .unwrap()
            .into_iter()
            .find(|c| c.address == address)
            .map(|c| c.attachment.map_or("-".into(), |a| a.container_id))
    }
}

/// An agent of node `node-a` on `store`, remembering DELs in `journal`, its pools not loaded.
fn node_on(store: &Arc<dyn Store>, journal: &Path) -> Arc<Node> {
    Arc::new(bare_node(store, journal))
}

/// [`node_on`], before it is shared (for `Node::with_cluster`).
pub(crate) fn bare_node(store: &Arc<dyn Store>, journal: &Path) -> Node {
    let policies = PolicyEngine::new(Limits::default(), None).unwrap();
    let default = Arc::new(policies.load(&PolicySource::embedded_default()).unwrap());
    let registry = Arc::new(PolicyRegistry::new(default));
    let config = EngineConfig {
        // Released addresses are handed out again at once: the tests look at who holds what.
        cooldown: 0,
        ..EngineConfig::default()
    };
    let engine: Arc<AgentEngine> = Arc::new(
        Engine::with_config(
            store.clone(),
            registry.for_cluster(STANDALONE_CLUSTER),
            config,
            system_clock(),
        )
        .on_node("node-a"),
    );
    Node::new("node-a", engine, registry, Journal::new(journal))
}

fn pod(name: &str) -> api::PodIdentity {
    api::PodIdentity {
        namespace: "default".into(),
        name: name.into(),
        uid: format!("uid-{name}"),
        owner_kind: None,
        owner_name: None,
    }
}

pub(crate) fn add_request(container: &str, pod: api::PodIdentity) -> api::AddRequest {
    api::AddRequest {
        container_id: container.into(),
        if_name: "eth0".into(),
        netns: String::new(),
        network: "demo".into(),
        default_ipv4_pools: vec!["v4".into()],
        default_ipv6_pools: vec!["v6".into()],
        multus_name: String::new(),
        pod,
        probe: None,
        parent: None,
    }
}

pub(crate) fn del_request(container: &str) -> api::DelRequest {
    api::DelRequest {
        attachment: id(container),
        owner_replicas: None,
        issued_at: None,
        monotonic_deadline_ms: None,
    }
}

fn id(container: &str) -> api::AttachmentId {
    api::AttachmentId {
        container_id: container.into(),
        if_name: "eth0".into(),
    }
}

pub(crate) fn addresses(result: &api::IpamResult) -> Vec<IpAddr> {
    result
        .ips
        .iter()
        .map(|ip| ip.address.split('/').next().unwrap().parse().unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn add_retried_add_and_del() {
    let f = Fixture::new();
    let first = f.node.add(add_request("c1", pod("web"))).await.unwrap();
    let held = addresses(&first);
    assert_eq!(held.len(), 2, "one address per family: {first:?}");
    assert_eq!(first.ips[0].gateway.as_deref(), Some("192.0.2.1"));
    // The runtime retries an ADD it got no answer to: the same addresses, nothing more claimed.
    let again = f.node.add(add_request("c1", pod("web"))).await.unwrap();
    assert_eq!(addresses(&again), held);
    assert_eq!(f.store.all().unwrap().len(), 2);
    assert_eq!(
        addresses(&f.node.check(id("c1")).await.unwrap()),
        held,
        "CHECK sees what the ADD holds"
    );

    f.node.del(del_request("c1")).await.unwrap();
    assert!(f.store.all().unwrap().is_empty());
    // DEL again (the runtime retries DELs too): fine, nothing to release.
    f.node.del(del_request("c1")).await.unwrap();
    let e = f.node.check(id("c1")).await.unwrap_err();
    assert_eq!(e.code(), codes::UNKNOWN_CONTAINER, "{e}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_full_pool_fails_the_add_with_the_policys_trace() {
    let f = Fixture::new();
    for i in 0..3 {
        f.node
            .add(add_request(&format!("c{i}"), pod(&format!("p{i}"))))
            .await
            .unwrap();
    }
    let e = f.node.add(add_request("c3", pod("p3"))).await.unwrap_err();
    assert_eq!(e.code(), codes::NO_POOL_FITS, "{e}");
    assert!(
        e.details().contains("v4"),
        "the trace names the pool: {}",
        e.details()
    );
    assert!(
        f.store.all().unwrap().len() == 6,
        "the failed dual-stack ADD claimed nothing, not even its IPv6 address"
    );
    assert!(
        f.node
            .metrics_text()
            .contains("allot_errors_total{reason=\"no-pool-fits\"} 1"),
        "counted"
    );
}

/// A DEL the plugin remembered while the agent was away is served by the replay at start.
#[tokio::test(flavor = "multi_thread")]
async fn the_journal_is_replayed() {
    let f = Fixture::new();
    let held = addresses(&f.node.add(add_request("c1", pod("web"))).await.unwrap());
    api::journal::record(f.journal(), &del_request("c1")).unwrap();
    let replayed = {
        let node = f.node.clone();
        tokio::task::spawn_blocking(move || node.replay_journal())
            .await
            .unwrap()
    };
    assert_eq!(replayed, 1);
    assert!(held.iter().all(|a| f.holder(*a).is_none()), "released");
    assert_eq!(
        std::fs::read_dir(f.journal()).unwrap().count(),
        0,
        "entry gone"
    );
}

/// `podman restart` reuses the container ID: a DEL remembered before a re-ADD of the same
/// attachment is settled first, so the re-added container holds exactly its new addresses and
/// no later replay takes them.
#[tokio::test(flavor = "multi_thread")]
async fn a_readd_settles_the_del_remembered_before_it() {
    let f = Fixture::new();
    let first = addresses(&f.node.add(add_request("c1", pod("web"))).await.unwrap());
    api::journal::record(f.journal(), &del_request("c1")).unwrap();
    let second = addresses(&f.node.add(add_request("c1", pod("web"))).await.unwrap());
    assert_eq!(
        std::fs::read_dir(f.journal()).unwrap().count(),
        0,
        "settled"
    );
    assert_eq!(
        f.store.all().unwrap().len(),
        2,
        "only the re-ADD's claims: {first:?}"
    );
    let node = f.node.clone();
    assert_eq!(
        tokio::task::spawn_blocking(move || node.replay_journal())
            .await
            .unwrap(),
        0
    );
    for a in second {
        assert_eq!(f.holder(a).as_deref(), Some("c1"), "{a} still held");
    }
}

/// The plugin gives up on a DEL after its timeout, journals it and answers success, and a
/// runtime that reuses container IDs adds the container again. The DEL it sent may still wait
/// here, behind the attachment's lock (slow work of the same container holds it), and the
/// re-ADD may get the lock first: the DEL then must not release what the re-ADD holds. The
/// test makes that happen: the re-ADD is served (as `Node::add` serves it: the journal entry
/// settled, then the ADD) under the lock the DEL waits for, after the DEL's deadline.
#[tokio::test(flavor = "multi_thread")]
async fn a_del_past_its_deadline_never_releases_what_a_readd_holds() {
    let f = Fixture::new();
    let first = addresses(&f.node.add(add_request("c1", pod("web"))).await.unwrap());
    let attachment = Attachment {
        container_id: "c1".into(),
        interface: "eth0".into(),
    };
    let (locked, is_locked) = std::sync::mpsc::channel();
    let (readd, do_readd) = std::sync::mpsc::channel::<()>();
    let slow = {
        let (node, attachment) = (f.node.clone(), attachment.clone());
        std::thread::spawn(move || {
            let lock = node.engine().serialize(&attachment);
            locked.send(()).unwrap();
            do_readd.recv().unwrap();
            node.settle(&lock).unwrap();
            node.engine()
                .add_serialized(&lock, &readd_request(attachment))
                .unwrap()
        })
    };
    is_locked.recv().unwrap();
    let timeout = Duration::from_millis(200);
    let del = tokio::spawn({
        let node = f.node.clone();
        async move {
            node.del(api::DelRequest {
                monotonic_deadline_ms: Some(api::deadline::after(timeout)),
                ..del_request("c1")
            })
            .await
        }
    });
    // The plugin gives up and journals the DEL, as its timeout makes it.
    tokio::time::sleep(timeout + Duration::from_millis(50)).await;
    api::journal::record(
        f.journal(),
        &api::DelRequest {
            issued_at: Some(1),
            ..del_request("c1")
        },
    )
    .unwrap();
    readd.send(()).unwrap();
    let again: Vec<IpAddr> = tokio::task::spawn_blocking(move || slow.join().unwrap())
        .await
        .unwrap()
        .allocations
        .iter()
        .map(|a| a.address)
        .collect();
    assert!(
        !api::journal::path_of(f.journal(), &id("c1")).exists(),
        "the re-ADD settled the journaled DEL (the first ADD's {first:?}) first"
    );

    let late = del.await.unwrap();
    for a in &again {
        assert_eq!(
            f.holder(*a).as_deref(),
            Some("c1"),
            "{a}, which the re-ADD got, is still held (the late DEL answered {late:?})"
        );
    }
    assert_eq!(f.store.all().unwrap().len(), again.len());
    let e = late.unwrap_err();
    assert_eq!(e.code(), codes::PAST_DEADLINE, "{e}");
    assert!(
        f.node
            .metrics_text()
            .contains("allot_errors_total{reason=\"del-past-deadline\"} 1"),
        "counted"
    );
    // A DEL in time is served as before.
    f.node
        .del(api::DelRequest {
            monotonic_deadline_ms: Some(api::deadline::after(Duration::from_secs(15))),
            ..del_request("c1")
        })
        .await
        .unwrap();
    assert!(f.store.all().unwrap().is_empty());
}

/// The engine's ADD of `attachment` for pod `web`, as `add_request` asks it of the node.
fn readd_request(attachment: Attachment) -> AddRequest {
    AddRequest {
        attachment,
        network: "demo".into(),
        pod: PodInfo {
            namespace: "default".into(),
            name: "web".into(),
            uid: "uid-web".into(),
            ..PodInfo::default()
        },
        namespace: NamespaceInfo {
            name: "default".into(),
            ..NamespaceInfo::default()
        },
        node: NodeInfo {
            name: "node-a".into(),
            ..NodeInfo::default()
        },
        multus_name: String::new(),
        cni_defaults: CniDefaults {
            ipv4: vec!["v4".into()],
            ipv6: vec!["v6".into()],
        },
    }
}

/// Only the agent that owns the socket and the journal replays the journal: a second agent
/// process started on the node while the first serves is refused before it touches the store,
/// since the first orders each entry with its attachment's ADDs under locks of its own.
#[tokio::test(flavor = "multi_thread")]
async fn only_the_agent_owning_the_socket_and_journal_replays_it() {
    let f = Fixture::new();
    let run = tempfile::tempdir().unwrap();
    let socket = run.path().join("agent.sock");
    let serving = server::start(f.node.clone(), &socket).await.unwrap();
    let held = addresses(&f.node.add(add_request("c1", pod("web"))).await.unwrap());
    // A DEL of c1 the plugin gave up on: the serving agent settles it, in order with c1's ADDs.
    api::journal::record(
        f.journal(),
        &api::DelRequest {
            issued_at: Some(1),
            ..del_request("c1")
        },
    )
    .unwrap();
    let entry = api::journal::path_of(f.journal(), &id("c1"));

    for (on, says) in [
        (socket.clone(), "another allot-agent owns"),
        (run.path().join("other.sock"), "owns the DEL journal"),
    ] {
        let e = server::start(f.another_agent(), &on).await.unwrap_err();
        let e = format!("{e:#}");
        assert!(e.contains(says) && e.contains("--journal"), "{e}");
        assert!(entry.exists(), "not replayed by a second agent ({e})");
        for a in &held {
            assert_eq!(f.holder(*a).as_deref(), Some("c1"), "{a} still held ({e})");
        }
    }
    assert!(socket.exists(), "the serving agent's socket is left alone");

    // Once the first agent is gone, the next one owns both, and replays.
    drop(serving);
    let _next = server::start(f.another_agent(), &socket).await.unwrap();
    assert!(!entry.exists(), "replayed");
    assert!(held.iter().all(|a| f.holder(*a).is_none()), "released");
}

/// The plugin found an address in use on the pod's link: it is quarantined, and the ADD is
/// served again with another one.
#[tokio::test(flavor = "multi_thread")]
async fn quarantine_serves_the_add_again_with_other_addresses() {
    let f = Fixture::new();
    let add = add_request("c1", pod("web"));
    let first = addresses(&f.node.add(add.clone()).await.unwrap());
    let taken = first[0];
    let replaced = f
        .node
        .quarantine(api::QuarantineRequest {
            add: add.clone(),
            conflicts: vec![api::Conflict {
                address: taken.to_string(),
                mac: "02:00:00:00:00:01".into(),
                contested: false,
            }],
            replace: true,
        })
        .await
        .unwrap()
        .expect("a replacement");
    let now = addresses(&replaced);
    assert!(!now.contains(&taken), "{now:?}");
    assert_eq!(now[1], first[1], "the other family's address stays");
    assert_eq!(
        f.holder(taken).as_deref(),
        Some("-"),
        "quarantined, detached"
    );
    assert_eq!(f.holder(now[0]).as_deref(), Some("c1"));
    // A malformed request is refused as such, and changes nothing.
    let e = f
        .node
        .quarantine(api::QuarantineRequest {
            add,
            conflicts: vec![],
            replace: true,
        })
        .await
        .unwrap_err();
    assert!(matches!(e, NodeError::BadRequest(_)), "{e}");
    assert_eq!(e.code(), codes::DECODE_FAILURE);
}

/// A StatefulSet's pod keeps its addresses across DEL and gets them back in its next sandbox.
#[tokio::test(flavor = "multi_thread")]
async fn a_statefulset_pod_gets_its_addresses_back() {
    let f = Fixture::new();
    let db0 = api::PodIdentity {
        owner_kind: Some("StatefulSet".into()),
        owner_name: Some("db".into()),
        ..pod("db-0")
    };
    let first = addresses(
        &f.node
            .add(add_request("sandbox-1", db0.clone()))
            .await
            .unwrap(),
    );
    f.node
        .del(api::DelRequest {
            owner_replicas: Some(3),
            ..del_request("sandbox-1")
        })
        .await
        .unwrap();
    for a in &first {
        assert_eq!(f.holder(*a).as_deref(), Some("-"), "kept for db-0");
    }
    // Another pod meanwhile gets other addresses.
    let other = addresses(&f.node.add(add_request("c9", pod("web"))).await.unwrap());
    assert!(other.iter().all(|a| !first.contains(a)), "{other:?}");
    let back = addresses(&f.node.add(add_request("sandbox-2", db0)).await.unwrap());
    assert_eq!(back, first);
}

/// An invalid edit of the pools keeps the version in force: the status says what and why, and
/// nothing more becomes allocatable.
#[tokio::test(flavor = "multi_thread")]
async fn an_invalid_pool_edit_keeps_the_version_in_force() {
    let f = Fixture::new();
    std::fs::write(
        f.pools.path().join("pools.yaml"),
        POOLS.replace(
            "ips: [\"192.0.2.10-192.0.2.12\"]\n  gateway: 192.0.2.1",
            "ips: [\"192.0.2.10-192.0.2.250\"]\n  gateway: 198.51.100.1",
        ),
    )
    .unwrap();
    f.reload();
    let status = f.node.status();
    assert!(status.degraded, "{status:?}");
    assert!(
        status.message.contains("outside subnet"),
        "{}",
        status.message
    );
    let v4 = status.pools.iter().find(|p| p.name == "v4").unwrap();
    assert_eq!(v4.total, 3, "the previous version is in force");
    for i in 0..3 {
        f.node
            .add(add_request(&format!("c{i}"), pod(&format!("p{i}"))))
            .await
            .unwrap();
    }
    assert_eq!(
        f.node
            .add(add_request("c3", pod("p3")))
            .await
            .unwrap_err()
            .code(),
        codes::NO_POOL_FITS,
        "the invalid edit made no address allocatable"
    );
    // Fixed: in force, and no longer degraded.
    std::fs::write(
        f.pools.path().join("pools.yaml"),
        POOLS.replace("192.0.2.10-192.0.2.12", "192.0.2.10-192.0.2.13"),
    )
    .unwrap();
    f.reload();
    let status = f.node.status();
    assert!(!status.degraded, "{status:?}");
    f.node.add(add_request("c3", pod("p3"))).await.unwrap();
}

/// A memory store whose releases of an IPv4 and an IPv6 claim together, while `refusing`, land
/// for the IPv4 block alone and fail for the other with a refusal that is no unavailability (as
/// the Kubernetes store reports a dual-stack DEL one of whose two blocks refused).
struct HalfReleasing {
    inner: MemoryStore,
    refusing: std::sync::atomic::AtomicBool,
}

impl HalfReleasing {
    fn release_some(&self, held: Vec<Claim>) -> Result<Vec<Claim>, StoreError> {
        let refusing = self.refusing.load(std::sync::atomic::Ordering::SeqCst);
        let (v4, v6): (Vec<Claim>, Vec<Claim>) =
            held.into_iter().partition(|c| c.address.is_ipv4());
        if !refusing || v4.is_empty() || v6.is_empty() {
            return self.inner.release_unchanged(&[v4, v6].concat());
        }
        let done = self.inner.release_unchanged(&v4)?;
        Err(StoreError::Partial {
            done,
            rest: Box::new(StoreError::backend("updating the IPv6 block: 422 Invalid")),
        })
    }
}

impl Store for HalfReleasing {
    fn claim_batch(&self, f: &[Claim], r: &[Reattach]) -> Result<Vec<Claim>, StoreError> {
        self.inner.claim_batch(f, r)
    }
    fn release_attachment(&self, a: &Attachment) -> Result<Vec<Claim>, StoreError> {
        self.release_some(self.inner.claims_of(a)?)
    }
    fn release(&self, addr: IpAddr, a: Option<&Attachment>) -> Result<bool, StoreError> {
        self.inner.release(addr, a)
    }
    fn release_unchanged(&self, claims: &[Claim]) -> Result<Vec<Claim>, StoreError> {
        self.release_some(claims.to_vec())
    }
    fn detach(&self, a: &Attachment, now: u64) -> Result<Vec<Claim>, StoreError> {
        self.inner.detach(a, now)
    }
    fn quarantine(
        &self,
        addr: IpAddr,
        a: &Attachment,
        holder: &PodRef,
        now: u64,
    ) -> Result<Claim, StoreError> {
        self.inner.quarantine(addr, a, holder, now)
    }
    fn claims_of(&self, a: &Attachment) -> Result<Vec<Claim>, StoreError> {
        self.inner.claims_of(a)
    }
    fn claims_of_pod(&self, ns: &str, name: &str) -> Result<Vec<Claim>, StoreError> {
        self.inner.claims_of_pod(ns, name)
    }
    fn detached(&self) -> Result<Vec<Claim>, StoreError> {
        self.inner.detached()
    }
    fn all(&self) -> Result<Vec<Claim>, StoreError> {
        self.inner.all()
    }
    fn snapshot(&self, since: u64) -> Result<Snapshot, StoreError> {
        self.inner.snapshot(since)
    }
    fn changes_since(&self, revision: u64) -> Result<Changes, StoreError> {
        self.inner.changes_since(revision)
    }
}

/// A dual-stack DEL the store released in part (its IPv4 block written, its IPv6 block
/// refused, for whatever reason) is answered as done and journaled: the released IPv4 address
/// may be handed out at once, so the runtime must not go on counting the sandbox as its holder
/// (the 100,000-seed simulation found that). The journal's replay releases the rest.
#[tokio::test(flavor = "multi_thread")]
async fn a_del_released_in_part_is_answered_and_its_journal_finishes_it() {
    let pools = tempfile::tempdir().unwrap();
    std::fs::write(pools.path().join("pools.yaml"), POOLS).unwrap();
    let journal = tempfile::tempdir().unwrap();
    let half = Arc::new(HalfReleasing {
        inner: MemoryStore::new(),
        refusing: false.into(),
    });
    let store: Arc<dyn Store> = half.clone();
    let node = node_on(&store, journal.path());
    node.reload(&Source::Dir(pools.path().to_path_buf()));
    let held = addresses(&node.add(add_request("c1", pod("web"))).await.unwrap());
    assert_eq!(held.len(), 2);

    half.refusing
        .store(true, std::sync::atomic::Ordering::SeqCst);
    node.del(del_request("c1")).await.expect("answered");
    let left: Vec<IpAddr> = store.all().unwrap().iter().map(|c| c.address).collect();
    assert_eq!(left.len(), 1, "the IPv6 claim is left: {left:?}");
    assert!(left[0].is_ipv6());
    assert_eq!(std::fs::read_dir(journal.path()).unwrap().count(), 1);
    assert!(
        node.metrics_text()
            .contains("allot_errors_total{reason=\"del-journaled\"} 1")
    );

    half.refusing
        .store(false, std::sync::atomic::Ordering::SeqCst);
    let replayed = {
        let node = node.clone();
        tokio::task::spawn_blocking(move || node.replay_journal())
            .await
            .unwrap()
    };
    assert_eq!(replayed, 1);
    assert!(
        store.all().unwrap().is_empty(),
        "the replay released the rest"
    );
    assert_eq!(std::fs::read_dir(journal.path()).unwrap().count(), 0);
}
