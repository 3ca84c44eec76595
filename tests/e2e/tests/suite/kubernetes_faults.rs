//! Cluster mode end to end, where the API server must misbehave in a way a real one cannot be
//! made to on demand: the test runs on `tests/apiserver`, allot's in-memory API server served
//! over loopback HTTP, and says which fault and why. Everything else runs on a real
//! kube-apiserver (`kubernetes.rs`).

use std::path::PathBuf;
use std::time::Duration;

use allot_e2e::kube::two_pools;
use allot_e2e::*;
use allot_test_apiserver::{ApiServer, Loopback};
use serde_json::{Value, json};

const NODE: &str = "node-e2e";

/// An API server on a loopback port with a kubeconfig file for it, running on its own runtime.
struct Cluster {
    server: ApiServer,
    kubeconfig: PathBuf,
    _api: Loopback,
}

impl Cluster {
    /// A cluster with namespace `default`, node [`NODE`] and the given pools.
    fn new(pools: &[Value]) -> Cluster {
        let api = ApiServer::on_loopback();
        let (server, kubeconfig) = (api.server.clone(), api.kubeconfig.clone());
        server.insert(
            "namespaces",
            json!({"apiVersion": "v1", "kind": "Namespace",
                   "metadata": {"name": "default", "labels": {"team": "blue"}}}),
        );
        server.insert(
            "nodes",
            json!({"apiVersion": "v1", "kind": "Node",
                   "metadata": {"name": NODE, "labels": {"topology.kubernetes.io/zone": "z1"}}}),
        );
        for pool in pools {
            server.insert("ippools", pool.clone());
        }
        Cluster {
            server,
            kubeconfig,
            _api: api,
        }
    }

    /// Adds the pod of `att` on [`NODE`], with `annotations` and the controller `owner`; `att`
    /// takes the UID the API server gave the pod, as the runtime passes it.
    fn add_pod(&self, att: &mut Attachment, annotations: Value, owner: Option<(&str, &str)>) {
        self.add_pod_on(NODE, att, annotations, owner);
    }

    fn add_pod_on(
        &self,
        node: &str,
        att: &mut Attachment,
        annotations: Value,
        owner: Option<(&str, &str)>,
    ) {
        let mut pod = json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"namespace": att.namespace, "name": att.name, "uid": att.uid,
                         "labels": {"app": "web"}, "annotations": annotations},
            "spec": {"nodeName": node, "containers": [{"name": "c", "image": "pause"}]},
        });
        if let Some((kind, name)) = owner {
            pod["metadata"]["ownerReferences"] = json!([{"apiVersion": "apps/v1", "kind": kind,
                "name": name, "uid": "owner-uid", "controller": true}]);
        }
        let stored = self.server.insert("pods", pod);
        att.uid = stored["metadata"]["uid"]
            .as_str()
            .expect("a UID")
            .to_string();
    }

    fn object(&self, plural: &str, name: &str) -> Option<Value> {
        self.server
            .objects(plural)
            .into_iter()
            .find(|o| o["metadata"]["name"] == name)
    }
}

fn lab(test: &str, cluster: &Cluster, flags: &[(&str, &str)]) -> Option<Lab> {
    Lab::on_cluster(test, &cluster.kubeconfig, NODE, flags)
}

/// A pod the watch has not delivered (the runtime was faster) is read from the API once, after
/// a bounded wait; its ReplicaSet, unknown to the API, stands as its owner.
///
/// Fault: the agent's watch of pods cut and held back (`close_watches`, `delay`), so that the
/// pod exists but the watch has not delivered it. A real API server delivers a new pod to
/// every watch within milliseconds, sooner than any ADD; it cannot be told to hold one back.
#[test]
fn a_pod_not_yet_in_the_cache_is_read_from_the_api_once() {
    let cluster = Cluster::new(&two_pools());
    let Some(lab) = lab(
        "a_pod_not_yet_in_the_cache_is_read_from_the_api_once",
        &cluster,
        &[("--pod-wait-ms", "200")],
    ) else {
        return;
    };
    // Once the agent watches pods, its watch delivers nothing more.
    lab.eventually("the agent watches pods", Duration::from_secs(10), || {
        cluster.server.requests("watch", "pods") > 0
    });
    cluster
        .server
        .delay("watch", "pods", Duration::from_secs(3600));
    cluster.server.close_watches();
    let mut att = Attachment::new("late");
    cluster.add_pod(&mut att, json!({}), Some(("ReplicaSet", "late-rs")));
    let conf = lab.bridge_conf(&["plain"], &[]);
    let ip = lab.bridge_add(&att, &conf).ip();
    assert!(in_range(addr_of(&ip), "10.97.0.10", "10.97.0.19"), "{ip}");
    for plural in ["pods", "replicasets"] {
        assert_eq!(
            cluster.server.requests("get", plural),
            1,
            "GET {plural}; agent log:\n{}",
            lab.agent.log()
        );
    }
    lab.eventually("the Endpoint", Duration::from_secs(10), || {
        cluster
            .object("endpoints", "late")
            .is_some_and(|e| e["spec"]["owner"] == json!({"kind": "ReplicaSet", "name": "late-rs"}))
    });

    // A pod the API does not know either: the ADD fails with try-again, nothing is claimed.
    let ghost = Attachment::new("ghost");
    let out = lab.cni("bridge", "ADD", &ghost, &conf);
    assert!(!out.success(), "{out}");
    assert_eq!(out.code(), Some(11), "{out}");
    assert!(out.msg().contains("ghost"), "{out}");
    let (_, free) = lab.agent.pool_counts("plain");
    assert_eq!(free, 9, "only `late` holds an address");
}
