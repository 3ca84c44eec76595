//! Cluster mode against the in-memory API server (`allot-test-apiserver`): what the agent
//! watches, and the owners it reads instead (a pod's ReplicaSet at its first ADD, a StatefulSet
//! at its pod's DEL), counted request by request.

use std::sync::Arc;
use std::time::{Duration, Instant};

use allot_agent::cluster::{self, Cluster, EndpointWriter, STATEFULSET_READ_TIMEOUT};
use allot_agent::inventory::Source;
use allot_agent::node::Node;
use allot_api as api;
use allot_core::block::{BlockScope, region_of};
use allot_core::config::{InForce, reconcile};
use allot_core::store::{Attachment, Claim, MemoryStore, PodRef, Store, system_clock};
use allot_index::{IndexResource, SharedIndex};
use allot_k8s::openapi::api::core::v1::{Namespace, Node as K8sNode, Pod};
use allot_store::{KubeConfig, KubeStore};
use allot_test_apiserver::ApiServer;
use serde_json::{Value, json};

use crate::node::{POOLS, add_request, addresses, bare_node, del_request};

const NODE: &str = "node-a";

/// The API server's pods, namespaces, nodes and the index fed with them as the watches would.
struct Api {
    server: ApiServer,
    index: Arc<SharedIndex>,
}

impl Api {
    fn new() -> Api {
        let api = Api {
            server: ApiServer::new(),
            index: SharedIndex::new(NODE),
        };
        let ns: Namespace =
            serde_json::from_value(json!({"metadata": {"name": "default"}})).unwrap();
        let node: K8sNode = serde_json::from_value(json!({"metadata": {"name": NODE}})).unwrap();
        api.index.update(|i| {
            i.apply(ns);
            i.apply(node);
        });
        api
    }

    /// Stores `object` in the API server; returns its UID.
    fn insert(&self, plural: &str, object: Value) -> String {
        self.server.insert(plural, object)["metadata"]["uid"]
            .as_str()
            .unwrap()
            .to_string()
    }

    /// Pod `name` of this node, controlled by `owner` (kind, name, UID), as the pod watch
    /// delivers it.
    fn pod(&self, name: &str, owner: (&str, &str, &str)) {
        let (kind, owner, uid) = owner;
        let pod: Pod = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"namespace": "default", "name": name, "uid": format!("uid-{name}"),
                         "ownerReferences": [{"apiVersion": "apps/v1", "kind": kind,
                                              "name": owner, "uid": uid, "controller": true}]},
            "spec": {"nodeName": NODE, "containers": []},
        }))
        .unwrap();
        self.index.update(|i| i.apply(pod));
    }

    fn pod_gone(&self, name: &str) {
        let pod: Pod = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"namespace": "default", "name": name, "uid": format!("uid-{name}")},
        }))
        .unwrap();
        self.index.update(|i| i.delete(pod));
    }

    /// Cluster mode over this API server, on the current runtime; an ADD would wait
    /// `pod_wait` for what the watches bring.
    fn cluster(&self, pod_wait: Duration) -> Cluster {
        let client = self.server.client();
        let runtime = tokio::runtime::Handle::current();
        Cluster {
            index: self.index.clone(),
            client: client.clone(),
            pod_wait,
            endpoints: EndpointWriter::new(client, NODE, runtime.clone()),
            runtime,
            blocks: Arc::new(self.blocks()),
            scoped: Default::default(),
        }
    }

    /// A claim store of this node on this API server's IPBlocks, following every block.
    fn blocks(&self) -> KubeStore {
        self.store(NODE, BlockScope::All)
    }

    /// A claim store of `node` on this API server's IPBlocks, following those of `scope`.
    fn store(&self, node: &str, scope: BlockScope) -> KubeStore {
        let server = self.server.clone();
        let config = KubeConfig {
            node: Some(node.into()),
            scope,
            ..KubeConfig::default()
        };
        KubeStore::open_with(&config, system_clock(), move || async move {
            Ok(server.client())
        })
        .expect("a store on the test API server")
    }

    fn gets(&self, plural: &str) -> u64 {
        self.server.requests("get", plural)
    }
}

fn statefulset(replicas: i64) -> Value {
    json!({"apiVersion": "apps/v1", "kind": "StatefulSet",
           "metadata": {"namespace": "default", "name": "db"},
           "spec": {"replicas": replicas, "serviceName": "db", "selector": {},
                    "template": {"spec": {"containers": []}}}})
}

/// The agent's watches: this node's pods, namespaces, this node, the pool objects. No
/// ReplicaSet, Job or StatefulSet of the cluster is listed or watched (at 1,000 nodes those
/// were 3,000 watches of objects a node mostly never needs).
#[tokio::test(flavor = "multi_thread")]
async fn the_agent_lists_and_watches_no_workload() {
    let api = Api::new();
    let index = SharedIndex::new(NODE);
    cluster::watch(&index, &api.server.client());
    index
        .wait_for(Duration::from_secs(10), |i| {
            i.unsynced().is_empty().then_some(())
        })
        .await
        .unwrap_or_else(|_| panic!("unsynced: {:?}", index.read().unsynced()));
    for plural in [
        "pods",
        "namespaces",
        "nodes",
        "ippools",
        "subnets",
        "reservedips",
    ] {
        assert!(
            api.server.requests("list", plural) > 0,
            "no list of {plural}"
        );
    }
    for plural in [
        "replicasets",
        "jobs",
        "statefulsets",
        "deployments",
        "cronjobs",
    ] {
        for verb in ["list", "watch", "get"] {
            assert_eq!(api.server.requests(verb, plural), 0, "{verb} {plural}");
        }
    }
}

/// A Deployment's pod: its ReplicaSet is read by one metadata GET at the first ADD, at once
/// (no wait for a watch that does not exist), and kept for the next pod of it; it goes with the
/// last pod of the node naming it, and is read again for a later one.
#[tokio::test(flavor = "multi_thread")]
async fn a_deployments_pod_resolves_to_the_deployment_by_one_replicaset_get() {
    let api = Api::new();
    let rs = api.insert(
        "replicasets",
        json!({"apiVersion": "apps/v1", "kind": "ReplicaSet",
               "metadata": {"namespace": "default", "name": "web-5d8f",
                 "ownerReferences": [{"apiVersion": "apps/v1", "kind": "Deployment",
                                      "name": "web", "uid": "d", "controller": true}]},
               "spec": {"selector": {}}}),
    );
    api.pod("web-5d8f-a", ("ReplicaSet", "web-5d8f", &rs));
    api.pod("web-5d8f-b", ("ReplicaSet", "web-5d8f", &rs));
    // A minute's wait for the watches: an owner read must not wait for it.
    let cluster = api.cluster(Duration::from_secs(60));
    let started = Instant::now();
    let r = cluster
        .request("default", "web-5d8f-a", "uid-web-5d8f-a", "eth0")
        .await
        .unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    let owner = r.pod.owner.unwrap();
    assert_eq!(
        (owner.kind.as_str(), owner.name.as_str()),
        ("Deployment", "web")
    );
    assert_eq!(api.gets("replicasets"), 1);
    assert_eq!(api.gets("pods"), 0, "the pod came from the watch");

    let r = cluster
        .request("default", "web-5d8f-b", "uid-web-5d8f-b", "eth0")
        .await
        .unwrap();
    assert_eq!(r.pod.owner.unwrap().name, "web");
    assert_eq!(api.gets("replicasets"), 1, "read once for both pods");

    api.pod_gone("web-5d8f-a");
    assert_eq!(api.index.read().cached_owners(), 1);
    api.pod_gone("web-5d8f-b");
    assert_eq!(api.index.read().cached_owners(), 0, "no pod names it");
    api.pod("web-5d8f-c", ("ReplicaSet", "web-5d8f", &rs));
    let r = cluster
        .request("default", "web-5d8f-c", "uid-web-5d8f-c", "eth0")
        .await
        .unwrap();
    assert_eq!(r.pod.owner.unwrap().name, "web");
    assert_eq!(api.gets("replicasets"), 2);
}

/// A Job's pod resolves to its CronJob the same way; a ReplicaSet the API no longer has is the
/// pod's owner itself, read once per ADD.
#[tokio::test(flavor = "multi_thread")]
async fn a_jobs_pod_resolves_to_its_cronjob_and_a_vanished_replicaset_owns_its_pod() {
    let api = Api::new();
    let job = api.insert(
        "jobs",
        json!({"apiVersion": "batch/v1", "kind": "Job",
               "metadata": {"namespace": "default", "name": "backup-2891",
                 "ownerReferences": [{"apiVersion": "batch/v1", "kind": "CronJob",
                                      "name": "backup", "uid": "c", "controller": true}]},
               "spec": {"template": {"spec": {"containers": []}}}}),
    );
    api.pod("backup-2891-x", ("Job", "backup-2891", &job));
    api.pod("orphan", ("ReplicaSet", "gone-rs", "r"));
    let cluster = api.cluster(Duration::from_secs(60));
    let r = cluster
        .request("default", "backup-2891-x", "uid-backup-2891-x", "eth0")
        .await
        .unwrap();
    let owner = r.pod.owner.unwrap();
    assert_eq!(
        (owner.kind.as_str(), owner.name.as_str()),
        ("CronJob", "backup")
    );
    assert_eq!(api.gets("jobs"), 1);
    let r = cluster
        .request("default", "orphan", "uid-orphan", "eth0")
        .await
        .unwrap();
    let owner = r.pod.owner.unwrap();
    assert_eq!(
        (owner.kind.as_str(), owner.name.as_str()),
        ("ReplicaSet", "gone-rs")
    );
    assert_eq!(api.gets("replicasets"), 1);
}

/// A node in cluster mode over `api`, with the pools of [`POOLS`].
struct ClusterNode {
    node: Arc<Node>,
    store: Arc<dyn Store>,
    _pools: tempfile::TempDir,
    _journal: tempfile::TempDir,
}

impl ClusterNode {
    fn new(api: &Api) -> ClusterNode {
        let pools = tempfile::tempdir().unwrap();
        std::fs::write(pools.path().join("pools.yaml"), POOLS).unwrap();
        let journal = tempfile::tempdir().unwrap();
        let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
        let node = Arc::new(
            bare_node(&store, journal.path()).with_cluster(api.cluster(Duration::from_secs(1))),
        );
        node.reload(&Source::Dir(pools.path().to_path_buf()));
        assert!(node.ready(), "{:?}", node.status());
        ClusterNode {
            node,
            store,
            _pools: pools,
            _journal: journal,
        }
    }

    /// ADD of `pod` in sandbox `container`; its addresses.
    async fn add(&self, container: &str, pod: &str) -> Vec<std::net::IpAddr> {
        let identity = api::PodIdentity {
            namespace: "default".into(),
            name: pod.into(),
            uid: format!("uid-{pod}"),
            owner_kind: None,
            owner_name: None,
        };
        addresses(
            &self
                .node
                .add(add_request(container, identity))
                .await
                .unwrap(),
        )
    }

    /// DEL of sandbox `container`, the plugin not saying the replica count (as in a cluster).
    async fn del(&self, container: &str) {
        self.node.del(del_request(container)).await.unwrap();
    }

    /// Whether any attachment holds `addresses` (a StatefulSet's kept claims hold none).
    fn held(&self, addresses: &[std::net::IpAddr]) -> bool {
        let claims = self.store.all().unwrap();
        addresses.iter().all(|a| {
            claims
                .iter()
                .any(|c| c.address == *a && c.attachment.is_some())
        })
    }

    fn kept(&self, addresses: &[std::net::IpAddr]) -> bool {
        let claims = self.store.all().unwrap();
        addresses.iter().all(|a| {
            claims
                .iter()
                .any(|c| c.address == *a && c.attachment.is_none())
        })
    }

    fn released(&self, addresses: &[std::net::IpAddr]) -> bool {
        let claims = self.store.all().unwrap();
        !claims.iter().any(|c| addresses.contains(&c.address))
    }
}

/// A StatefulSet pod's DEL reads the replica count at that moment: kept while its ordinal is
/// below it, released once the set was scaled below it (a moment before the DEL), and released
/// once the StatefulSet is gone. One GET per DEL; nothing is read at the ADD.
#[tokio::test(flavor = "multi_thread")]
async fn a_statefulset_pods_del_reads_the_replica_count_fresh() {
    let api = Api::new();
    let sts = api.insert("statefulsets", statefulset(3));
    api.pod("db-2", ("StatefulSet", "db", &sts));
    let node = ClusterNode::new(&api);

    let first = node.add("sandbox-1", "db-2").await;
    assert!(node.held(&first));
    assert_eq!(api.gets("statefulsets"), 0, "an ADD reads no StatefulSet");
    node.del("sandbox-1").await;
    assert!(node.kept(&first), "db-2 is below 3 replicas: kept");
    assert_eq!(api.gets("statefulsets"), 1);

    // Scaled to 2 while the pod was away: its next DEL releases.
    assert_eq!(node.add("sandbox-2", "db-2").await, first);
    api.server.edit("statefulsets", statefulset(2));
    node.del("sandbox-2").await;
    assert!(node.released(&first), "db-2 is past 2 replicas: released");
    assert_eq!(api.gets("statefulsets"), 2);

    // The StatefulSet deleted: released too.
    let again = node.add("sandbox-3", "db-2").await;
    assert!(
        api.server
            .remove("apps/v1", "statefulsets", Some("default"), "db")
    );
    node.del("sandbox-3").await;
    assert!(node.released(&again), "the StatefulSet is gone: released");
}

/// When the StatefulSet cannot be read (refused, or slower than
/// [`STATEFULSET_READ_TIMEOUT`]), the replica count is unknown and the address kept, as when
/// the pod is only restarting; the DEL still answers.
#[tokio::test(flavor = "multi_thread")]
async fn a_statefulset_pods_address_is_kept_when_its_statefulset_cannot_be_read() {
    let api = Api::new();
    let sts = api.insert("statefulsets", statefulset(0));
    api.pod("db-0", ("StatefulSet", "db", &sts));
    let node = ClusterNode::new(&api);

    let first = node.add("sandbox-1", "db-0").await;
    api.server.forbid("get", "statefulsets");
    node.del("sandbox-1").await;
    assert!(node.kept(&first), "refused: kept");

    api.server.clear_faults();
    assert_eq!(node.add("sandbox-2", "db-0").await, first);
    api.server
        .delay("get", "statefulsets", STATEFULSET_READ_TIMEOUT * 10);
    let started = Instant::now();
    node.del("sandbox-2").await;
    assert!(
        started.elapsed() < STATEFULSET_READ_TIMEOUT * 3,
        "{:?}",
        started.elapsed()
    );
    assert!(node.kept(&first), "too slow: kept");

    // Read in time, 0 replicas: released.
    api.server.clear_faults();
    assert_eq!(node.add("sandbox-3", "db-0").await, first);
    node.del("sandbox-3").await;
    assert!(node.released(&first));
}

/// The pools of the in-memory API server: one every node may use, one for nodes of rack b.
fn rack_pools(api: &Api) {
    api.insert(
        "ippools",
        json!({"apiVersion": "allot.dev/v1alpha1", "kind": "IPPool",
               "metadata": {"name": "everywhere"},
               "spec": {"subnet": "198.51.100.0/24", "ips": ["198.51.100.10-198.51.100.20"]}}),
    );
    api.insert(
        "ippools",
        json!({"apiVersion": "allot.dev/v1alpha1", "kind": "IPPool",
               "metadata": {"name": "rack-b"},
               "spec": {"subnet": "203.0.113.0/24", "ips": ["203.0.113.10-203.0.113.20"],
                        "nodeAffinity": {"matchLabels": {"rack": "b"}}}}),
    );
}

fn in_force(index: &SharedIndex) -> InForce {
    let (_, observation) = index.read().observation().expect("the pools are listed");
    reconcile(&InForce::default(), &observation, &|_| false).in_force
}

/// The agent lists and follows the IPBlocks of the pools its node may use, by their region
/// label, not every block of the cluster (at 1,000 nodes, every claim write went to every
/// agent); a change of its node's labels that lets it use another pool brings that pool's
/// blocks at the next tick.
#[tokio::test(flavor = "multi_thread")]
async fn the_agent_follows_only_the_ipblocks_of_its_nodes_pools() {
    let api = Api::new();
    api.insert(
        "nodes",
        json!({"apiVersion": "v1", "kind": "Node",
               "metadata": {"name": NODE, "labels": {"rack": "a"}}}),
    );
    rack_pools(&api);
    // Another node's claims, one in each pool.
    let other = tokio::task::block_in_place(|| api.store("node-b", BlockScope::All));
    for address in ["198.51.100.10", "203.0.113.10"] {
        let claim = Claim {
            address: address.parse().unwrap(),
            pool: "p".into(),
            network: "net".into(),
            attachment: Some(Attachment {
                container_id: format!("c-{address}"),
                interface: "eth0".into(),
            }),
            pod: PodRef {
                namespace: "default".into(),
                name: format!("web-{address}"),
                uid: "u".into(),
                ..PodRef::default()
            },
            node: "node-b".into(),
            updated_at: 1,
        };
        tokio::task::block_in_place(|| other.claim(&[claim])).unwrap();
    }

    let index = SharedIndex::new(NODE);
    cluster::watch(&index, &api.server.client());
    let scope = cluster::first_scope(&index).await;
    let everywhere = region_of("198.51.100.0".parse().unwrap());
    assert_eq!(scope, BlockScope::Regions([everywhere.clone()].into()));
    let blocks = Arc::new(tokio::task::block_in_place(|| api.store(NODE, scope)));
    let held = |b: &KubeStore| -> Vec<String> {
        b.all()
            .unwrap()
            .iter()
            .map(|c| c.address.to_string())
            .collect()
    };
    assert_eq!(held(&blocks), ["198.51.100.10"]);
    assert_eq!(blocks.stats().regions, Some(1));

    // The node moves to rack b: the tick after its watch delivers that follows rack-b's blocks.
    let client = api.server.client();
    let runtime = tokio::runtime::Handle::current();
    let cluster = Cluster {
        index: index.clone(),
        client: client.clone(),
        pod_wait: Duration::from_secs(1),
        endpoints: EndpointWriter::new(client, NODE, runtime.clone()),
        runtime,
        blocks: blocks.clone(),
        scoped: Default::default(),
    };
    api.server.edit(
        "nodes",
        json!({"apiVersion": "v1", "kind": "Node",
               "metadata": {"name": NODE, "labels": {"rack": "b"}}}),
    );
    index
        .wait_for(Duration::from_secs(10), |i| {
            (i.node_labels()?.get("rack")? == "b").then_some(())
        })
        .await
        .expect("the node's new labels");
    cluster.follow_blocks(&in_force(&index));
    let deadline = Instant::now() + Duration::from_secs(10);
    while held(&blocks).len() < 2 {
        assert!(
            Instant::now() < deadline,
            "rack-b's blocks not followed: {:?}",
            held(&blocks)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(blocks.stats().regions, Some(2));
}
