//! Cluster mode end to end: the real `allot` plugin, called by Debian's bridge plugin inside a
//! network namespace, asks an agent running with `--kubernetes` against a real kube-apiserver
//! (upstream etcd and kube-apiserver on 127.0.0.1, with allot's CRDs): the agent's watches,
//! GETs, IPBlock compare-and-swap writes, Endpoint writes, Policy status and Events all go
//! through kube-rs's client, the API server's authentication, validation and storage. What the
//! tests set up are real API objects: namespaces, nodes, pods bound to a node, workloads,
//! pools. The one test that needs a watch held back is in `kubernetes_faults.rs`.

use std::path::PathBuf;
use std::time::Duration;

use allot_e2e::kube::{ALLOT, KubeApi, pool, two_pools};
use allot_e2e::*;
use serde_json::{Value, json};

const NODE: &str = "node-e2e";

/// A real API server with namespace `default` (labelled `team: blue`), node [`NODE`] and
/// the given pools.
struct Cluster {
    api: KubeApi,
}

impl Cluster {
    fn new(test: &str, pools: &[Value]) -> Option<Cluster> {
        let api = KubeApi::start(test)?;
        api.namespace("default", json!({"team": "blue"}));
        api.node(NODE, json!({"topology.kubernetes.io/zone": "z1"}), false);
        for pool in pools {
            api.create("ippools", pool.clone());
        }
        Some(Cluster { api })
    }

    /// The kubeconfig of node `node`'s agent: a user of its own, so that the audit log tells
    /// its requests apart.
    fn agent_kubeconfig(&self, node: &str) -> PathBuf {
        self.api.kubeconfig_of(&agent_user(node))
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
        let owner = owner.map(|(kind, name)| (kind, name, "owner-uid"));
        self.add_pod_owned(node, att, annotations, owner);
    }

    /// [`Cluster::add_pod_on`] naming the controller `owner` by kind, name and UID (that of
    /// the object in the API, as a controller's pods name it).
    fn add_pod_owned(
        &self,
        node: &str,
        att: &mut Attachment,
        annotations: Value,
        owner: Option<(&str, &str, &str)>,
    ) {
        let mut pod = json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"namespace": att.namespace, "name": att.name,
                         "labels": {"app": "web"}, "annotations": annotations},
            "spec": {"nodeName": node, "containers": [{"name": "c", "image": "pause"}]},
        });
        if let Some((kind, name, uid)) = owner {
            pod["metadata"]["ownerReferences"] = json!([{"apiVersion": "apps/v1", "kind": kind,
                "name": name, "uid": uid, "controller": true}]);
        }
        let stored = self.api.create("pods", pod);
        att.uid = stored["metadata"]["uid"]
            .as_str()
            .expect("a UID")
            .to_string();
    }

    /// allot's object `name` of `plural` in namespace `default` (or cluster-scoped).
    fn object(&self, plural: &str, name: &str) -> Option<Value> {
        let namespace = (plural == "endpoints").then_some("default");
        self.api.object(ALLOT, plural, namespace, name)
    }

    fn blocks(&self) -> Vec<Value> {
        self.api.objects(ALLOT, "ipblocks")
    }
}

fn agent_user(node: &str) -> String {
    format!("allot-agent:{node}")
}

fn lab(test: &str, cluster: &Cluster, flags: &[(&str, &str)]) -> Option<Lab> {
    Lab::on_cluster(test, &cluster.agent_kubeconfig(NODE), NODE, flags)
}

/// The pod's annotation (which the plugin never sees) picks the pool, its ReplicaSet (read by
/// one metadata GET: the agent watches no ReplicaSet) resolves to its Deployment, the Endpoint
/// records it all, and DEL undoes it.
#[test]
fn a_pod_is_served_from_what_the_cluster_says_about_it() {
    let test = "a_pod_is_served_from_what_the_cluster_says_about_it";
    let Some(cluster) = Cluster::new(test, &two_pools()) else {
        return;
    };
    let Some(lab) = lab(test, &cluster, &[]) else {
        return;
    };
    let rs = cluster.api.create(
        "replicasets",
        json!({"apiVersion": "apps/v1", "kind": "ReplicaSet",
               "metadata": {"namespace": "default", "name": "web-5d8f",
                 "ownerReferences": [{"apiVersion": "apps/v1", "kind": "Deployment", "name": "web",
                                      "uid": "d", "controller": true}]},
               "spec": {"replicas": 0, "selector": {"matchLabels": {"app": "web"}},
                        "template": {"metadata": {"labels": {"app": "web"}},
                                     "spec": {"containers": [{"name": "c", "image": "pause"}]}}}}),
    );
    let rs_uid = rs["metadata"]["uid"].as_str().expect("a UID");
    let mut att = Attachment::new("web-5d8f-x2x");
    cluster.add_pod_owned(
        NODE,
        &mut att,
        json!({"ipam.allot.dev/ippool": "{\"ipv4\": [\"annotated\"]}"}),
        Some(("ReplicaSet", "web-5d8f", rs_uid)),
    );
    // The network's own default is `plain`; the pod's annotation wins.
    let conf = lab.bridge_conf(&["plain"], &[]);
    let add = lab.bridge_add(&att, &conf);
    let ip = add.ip();
    assert!(
        in_range(addr_of(&ip), "10.97.1.10", "10.97.1.19"),
        "{ip} is not from the annotated pool:\n{add}"
    );
    assert_eq!(att.addrs(), vec![ip.clone()]);

    lab.eventually("the pod's Endpoint", Duration::from_secs(10), || {
        cluster.object("endpoints", &att.name).is_some()
    });
    let endpoint = cluster.object("endpoints", &att.name).unwrap();
    assert_eq!(endpoint["spec"]["uid"], att.uid.as_str());
    assert_eq!(endpoint["spec"]["node"], NODE);
    assert_eq!(
        endpoint["spec"]["owner"],
        json!({"kind": "Deployment", "name": "web"})
    );
    assert_eq!(endpoint["spec"]["interfaces"][0]["ifname"], "eth0");
    assert_eq!(endpoint["spec"]["interfaces"][0]["ipv4"], ip.as_str());
    assert_eq!(
        endpoint["spec"]["interfaces"][0]["pools"],
        json!(["annotated"])
    );
    let owners = &endpoint["metadata"]["ownerReferences"];
    assert_eq!(owners[0]["kind"], "Pod");
    assert_eq!(owners[0]["uid"], att.uid.as_str());

    // The claim is in an IPBlock of the pool, with the resolved owner.
    let address = addr_of(&ip).to_string();
    let claim = cluster
        .blocks()
        .into_iter()
        .find_map(|b| b["spec"]["claims"].get(&address).cloned())
        .expect("the claim is in an IPBlock");
    assert_eq!(claim["pool"], "annotated");
    assert_eq!(claim["ownerKind"], "Deployment");
    assert_eq!(claim["pod"], att.name.as_str());
    // Found in the watch cache: no per-ADD read of the pod, its namespace or node; the
    // ReplicaSet read once, and no workload listed or watched.
    for resource in ["/pods", "/namespaces", "/nodes"] {
        let gets = cluster.api.requests(&agent_user(NODE), "get", resource);
        assert!(gets.is_empty(), "GET {resource}: {gets:?}");
    }
    let gets = cluster
        .api
        .requests(&agent_user(NODE), "get", "apps/replicasets");
    assert_eq!(gets.len(), 1, "GET apps/replicasets: {gets:?}");
    for resource in ["apps/replicasets", "apps/statefulsets", "batch/jobs"] {
        for verb in ["list", "watch"] {
            let seen = cluster.api.requests(&agent_user(NODE), verb, resource);
            assert!(seen.is_empty(), "{verb} {resource}: {seen:?}");
        }
    }

    lab.cni("bridge", "DEL", &att, &conf).expect_ok();
    lab.eventually(
        "the Endpoint goes with the DEL",
        Duration::from_secs(10),
        || cluster.object("endpoints", &att.name).is_none(),
    );
    let (_, free) = lab.agent.pool_counts("annotated");
    assert_eq!(free, 10, "the address is free again");
    assert!(
        cluster
            .blocks()
            .iter()
            .all(|b| b["spec"]["claims"].get(&address).is_none()),
        "the claim is gone from its IPBlock"
    );
}

/// `kubectl apply` of a pool and a Deployment naming it: the first pods' ADDs come a moment
/// after the pool, well before the agent's periodic reload (here a minute away). The ADD finds
/// the pool the watch delivered; it does not fail with "IPPool … does not exist".
#[test]
fn a_pool_created_a_moment_before_its_pod_serves_the_pods_add() {
    let test = "a_pool_created_a_moment_before_its_pod_serves_the_pods_add";
    let Some(cluster) = Cluster::new(test, &two_pools()) else {
        return;
    };
    let Some(lab) = lab(test, &cluster, &[("--reload-interval-ms", "60000")]) else {
        return;
    };
    cluster.api.create(
        "ippools",
        pool(
            "late",
            "10.97.3.0/24",
            "10.97.3.1",
            "10.97.3.10-10.97.3.19",
            false,
        ),
    );
    // Time for the watch to deliver it (the same order of time a pod takes to be scheduled
    // and get a sandbox), far less than the reload interval.
    std::thread::sleep(Duration::from_secs(1));
    let mut att = Attachment::new("late-1");
    cluster.add_pod(
        &mut att,
        json!({"ipam.allot.dev/ippool": "{\"ipv4\": [\"late\"]}"}),
        None,
    );
    let conf = lab.bridge_conf(&["plain"], &[]);
    let add = lab.bridge_add(&att, &conf);
    let ip = add.ip();
    assert!(
        in_range(addr_of(&ip), "10.97.3.10", "10.97.3.19"),
        "{ip} is not from the new pool:\n{add}"
    );
    lab.cni("bridge", "DEL", &att, &conf).expect_ok();
}

/// A pod the API does not know, the watch's or the API's: the ADD fails with try-again (after
/// one bounded wait and one read), nothing is claimed.
#[test]
fn a_pod_the_api_does_not_know_fails_the_add_with_try_again() {
    let test = "a_pod_the_api_does_not_know_fails_the_add_with_try_again";
    let Some(cluster) = Cluster::new(test, &two_pools()) else {
        return;
    };
    let Some(lab) = lab(test, &cluster, &[("--pod-wait-ms", "200")]) else {
        return;
    };
    let conf = lab.bridge_conf(&["plain"], &[]);
    let ghost = Attachment::new("ghost");
    let out = lab.cni("bridge", "ADD", &ghost, &conf);
    assert!(!out.success(), "{out}");
    assert_eq!(out.code(), Some(11), "{out}");
    assert!(out.msg().contains("ghost"), "{out}");
    let (_, free) = lab.agent.pool_counts("plain");
    assert_eq!(free, 10, "nothing is claimed");
    let gets = cluster.api.requests(&agent_user(NODE), "get", "/pods");
    assert_eq!(gets.len(), 1, "read from the API once: {gets:?}");
    assert_eq!(gets[0].name, "ghost");
    assert_eq!(gets[0].code, 404);
}

/// A malformed Multus annotation is the pod's error, said as such.
#[test]
fn a_malformed_networks_annotation_fails_the_add_with_the_reason() {
    let test = "a_malformed_networks_annotation_fails_the_add_with_the_reason";
    let Some(cluster) = Cluster::new(test, &two_pools()) else {
        return;
    };
    let Some(lab) = lab(test, &cluster, &[]) else {
        return;
    };
    let mut att = Attachment::new("bad-nets");
    cluster.add_pod(
        &mut att,
        json!({"k8s.v1.cni.cncf.io/networks": "[{\"interface\": \"net1\"}"}),
        None,
    );
    let out = lab.cni("bridge", "ADD", &att, &lab.bridge_conf(&["plain"], &[]));
    assert!(!out.success(), "{out}");
    assert!(out.msg().contains("k8s.v1.cni.cncf.io/networks"), "{out}");
    assert_eq!(lab.agent.pool_counts("plain").1, 10);
}

/// The Policy object decides which component serves: a good one is swapped in and named in
/// the status; one with the wrong digest is refused, the good one keeps serving, and the
/// status and an Event say why.
#[test]
fn the_agent_follows_the_policy_object_and_refuses_a_bad_component() {
    let test = "the_agent_follows_the_policy_object_and_refuses_a_bad_component";
    let wasm = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../target/wasm-policies/wasm32-wasip2/release/zone_aware.wasm");
    assert!(
        wasm.exists(),
        "{} is missing: build the test policies with `make policies`",
        wasm.display()
    );
    let digest = sha256_of(&wasm);
    let Some(cluster) = Cluster::new(test, &two_pools()) else {
        return;
    };
    let Some(lab) = lab(test, &cluster, &[]) else {
        return;
    };
    let policy = |sha: &str| {
        json!({"apiVersion": "allot.dev/v1alpha1", "kind": "Policy",
               "metadata": {"name": "default"},
               "spec": {"source": {"file": wasm.to_str().unwrap()}, "sha256": sha,
                        "onFailure": "fail"}})
    };
    cluster.api.create("policies", policy(&digest));
    lab.eventually(
        "the Policy's status names the served digest",
        Duration::from_secs(30),
        || {
            cluster
                .object("policies", "default")
                .is_some_and(|p| p["status"]["servingDigest"] == digest.as_str())
        },
    );

    // Pods are still served (the zone-aware example falls back to the default order).
    let mut att = Attachment::new("after-swap");
    cluster.add_pod(&mut att, json!({}), None);
    let conf = lab.bridge_conf(&["plain"], &[]);
    lab.bridge_add(&att, &conf);

    let wrong = format!("sha256:{}", "0".repeat(64));
    cluster.api.edit(ALLOT, "policies", None, "default", |p| {
        p["spec"]["sha256"] = json!(wrong)
    });
    lab.eventually("the refusal in the status", Duration::from_secs(30), || {
        cluster.object("policies", "default").is_some_and(|p| {
            p["status"]["refusedReason"]
                .as_str()
                .is_some_and(|r| r.contains(&wrong[7..]))
        })
    });
    let status = cluster.object("policies", "default").unwrap()["status"].clone();
    assert_eq!(status["servingDigest"], digest.as_str(), "{status}");
    // The Event is written after the status, and a real API server may show the status first.
    lab.eventually("a PolicyRefused Event", Duration::from_secs(30), || {
        cluster
            .api
            .objects("events.k8s.io/v1", "events")
            .iter()
            .any(|e| e["reason"] == "PolicyRefused" && e["regarding"]["name"] == "default")
    });
    let mut other = Attachment::new("after-refusal");
    cluster.add_pod(&mut other, json!({}), None);
    lab.bridge_add(&other, &conf);
}

/// A StatefulSet pod deleted and recreated on another node before the first node's DEL ran
/// (Spiderpool's issue 1187): the new pod gets the same address and no duplicate exists; the
/// first node's late DEL takes nothing away from it.
#[test]
fn a_statefulset_pod_recreated_on_another_node_keeps_its_address() {
    const NODE_B: &str = "node-e2e-b";
    let test = "a_statefulset_pod_recreated_on_another_node_keeps_its_address";
    let Some(cluster) = Cluster::new(test, &two_pools()) else {
        return;
    };
    cluster.api.node(NODE_B, json!({}), false);
    cluster.api.create(
        "statefulsets",
        json!({"apiVersion": "apps/v1", "kind": "StatefulSet",
               "metadata": {"namespace": "default", "name": "web"},
               "spec": {"replicas": 3, "serviceName": "web",
                        "selector": {"matchLabels": {"app": "web"}},
                        "template": {"metadata": {"labels": {"app": "web"}},
                                     "spec": {"containers": [{"name": "c", "image": "pause"}]}}}}),
    );
    let Some(lab) = lab(test, &cluster, &[]) else {
        return;
    };
    let node_b = Agent::start_on_cluster(&cluster.agent_kubeconfig(NODE_B), NODE_B, &[]);
    let owner = Some(("StatefulSet", "web"));
    let mut old = Attachment::new("web-0");
    cluster.add_pod(&mut old, json!({}), owner);
    let conf_a = lab.bridge_conf(&["plain"], &[]);
    let ip = lab.bridge_add(&old, &conf_a).ip();

    // Node B has seen the claim (a pod is recreated seconds later, its watch lags by
    // milliseconds); the pod object is deleted and created again, on node B.
    lab.eventually("node B sees web-0's claim", Duration::from_secs(10), || {
        node_b.pool_counts("plain").1 == 9
    });
    assert!(cluster.api.remove("v1", "pods", Some("default"), "web-0"));
    let mut new = Attachment::new("web-0");
    cluster.add_pod_on(NODE_B, &mut new, json!({}), owner);
    let conf_b = lab.bridge_conf_via(&node_b.socket(), &["plain"], &[]);
    let add = lab.bridge_add(&new, &conf_b);
    assert_eq!(add.ip(), ip, "web-0 got another address on node B:\n{add}");

    // Node A's DEL of the old sandbox comes late.
    lab.cni("bridge", "DEL", &old, &conf_a).expect_ok();
    let address = addr_of(&ip).to_string();
    let holders: Vec<Value> = cluster
        .blocks()
        .into_iter()
        .filter_map(|b| b["spec"]["claims"].get(&address).cloned())
        .collect();
    assert_eq!(holders.len(), 1, "{holders:?}");
    assert_eq!(holders[0]["containerId"], new.container_id.as_str());
    lab.eventually(
        "both nodes see one address held",
        Duration::from_secs(10),
        || lab.agent.pool_counts("plain").1 == 9 && node_b.pool_counts("plain").1 == 9,
    );
}

/// Two nodes' agents in cluster mode share the cluster's IPBlocks. Node A's runtime lists only
/// node A's attachments: its GC releases node A's leak and never node B's pod's address.
#[test]
fn gc_on_one_node_never_releases_another_nodes_claims_in_cluster_mode() {
    const NODE_B: &str = "node-e2e-b";
    let test = "gc_on_one_node_never_releases_another_nodes_claims_in_cluster_mode";
    let Some(cluster) = Cluster::new(test, &two_pools()) else {
        return;
    };
    cluster.api.node(NODE_B, json!({}), false);
    let Some(lab) = lab(test, &cluster, &[]) else {
        return;
    };
    let node_b = Agent::start_on_cluster(&cluster.agent_kubeconfig(NODE_B), NODE_B, &[]);
    let (mut on_a, mut gone) = (Attachment::new("on-a"), Attachment::new("gone"));
    let mut on_b = Attachment::new("on-b");
    cluster.add_pod(&mut on_a, json!({}), None);
    cluster.add_pod(&mut gone, json!({}), None);
    cluster.add_pod_on(NODE_B, &mut on_b, json!({}), None);
    let conf_a = lab.bridge_conf(&["plain"], &[]);
    let conf_b = lab.bridge_conf_via(&node_b.socket(), &["plain"], &[]);
    lab.bridge_add(&on_a, &conf_a);
    lab.bridge_add(&gone, &conf_a);
    let b_ip = addr_of(&lab.bridge_add(&on_b, &conf_b).ip()).to_string();

    let mut gc = conf_a.clone();
    gc["cniVersion"] = json!("1.1.0");
    gc["cni.dev/valid-attachments"] = json!([on_a.gc_entry()]);
    for _ in 0..2 {
        lab.call("allot", "GC", &gc.to_string())
            .run(Some(&lab.host))
            .expect_ok();
    }
    let held: Vec<String> = cluster
        .blocks()
        .into_iter()
        .flat_map(|b| {
            b["spec"]["claims"]
                .as_object()
                .map(|c| c.keys().cloned().collect::<Vec<_>>())
                .unwrap_or_default()
        })
        .collect();
    assert_eq!(held.len(), 2, "on-a and on-b keep theirs: {held:?}");
    assert!(held.contains(&b_ip), "node B's pod keeps {b_ip}: {held:?}");
}

/// `sha256:` and the hex digest of a file, as a Policy spells it.
fn sha256_of(path: &std::path::Path) -> String {
    let out = std::process::Command::new("sha256sum")
        .arg(path)
        .output()
        .expect("sha256sum");
    let text = String::from_utf8(out.stdout).unwrap();
    format!(
        "sha256:{}",
        text.split_whitespace().next().expect("a digest")
    )
}

/// A pod with two NICs whose second NIC's pool has no address left, retried 50 times by the
/// runtime as containerd retries a sandbox (each try a new sandbox: eth0's ADD succeeds, net1's
/// fails, Multus and the runtime DEL both): at every try the pod holds exactly one address, on
/// eth0, the same one each time, and nothing once torn down; the pool never drains. Spiderpool
/// #4295 and #2901 (each retry took another address for the first NIC until its pool ran dry).
/// No Multus runs here (its module is not served by the Go module proxy): the test calls the
/// delegates as Multus does, Debian's bridge plugin with allot as IPAM, CNI_IFNAME net1.
#[test]
fn a_second_nic_without_addresses_retried_50_times_holds_one_first_nic_address() {
    let test = "a_second_nic_without_addresses_retried_50_times_holds_one_first_nic_address";
    let mut pools = two_pools();
    pools.push(allot_e2e::kube::pool(
        "tiny",
        "10.97.2.0/24",
        "10.97.2.1",
        "10.97.2.10-10.97.2.10",
        false,
    ));
    let Some(cluster) = Cluster::new(test, &pools) else {
        return;
    };
    let Some(lab) = lab(test, &cluster, &[]) else {
        return;
    };
    let first = lab.bridge_conf(&["plain"], &[]);
    let mut second = lab.bridge_conf(&["tiny"], &[]);
    second["name"] = json!("second");
    // Its subnet on the same bridge: the bridge keeps the first network's gateway address.
    second["isGateway"] = json!(false);
    // Another pod holds the second network's only address.
    let mut holder = Attachment::new("holder");
    cluster.add_pod(&mut holder, json!({}), None);
    lab.bridge_add(&holder.with_ifname("net1"), &second);

    let mut pod = Attachment::new("two-nics");
    cluster.add_pod(&mut pod, json!({}), None);
    let held_by_pod = || -> Vec<(String, String)> {
        let mut out = Vec::new();
        for block in cluster.blocks() {
            for (address, claim) in block["spec"]["claims"].as_object().into_iter().flatten() {
                if claim["uid"] == pod.uid.as_str() {
                    out.push((
                        address.clone(),
                        claim["interface"].as_str().unwrap_or("").into(),
                    ));
                }
            }
        }
        out
    };
    let mut addresses = std::collections::BTreeSet::new();
    for attempt in 1..=50 {
        // A new sandbox of the same pod.
        let mut sandbox = Attachment::new("two-nics");
        sandbox.uid = pod.uid.clone();
        let eth0 = lab.bridge_add(&sandbox, &first).ip();
        let net1 = sandbox.with_ifname("net1");
        let failed = lab.cni("bridge", "ADD", &net1, &second);
        assert!(
            !failed.success(),
            "try {attempt}: net1 got an address:\n{failed}"
        );
        assert_eq!(
            held_by_pod(),
            vec![(addr_of(&eth0).to_string(), "eth0".to_string())],
            "try {attempt}: the pod holds its eth0 address and nothing else"
        );
        addresses.insert(eth0);
        lab.cni("bridge", "DEL", &net1, &second).expect_ok();
        lab.cni("bridge", "DEL", &sandbox, &first).expect_ok();
        assert_eq!(
            held_by_pod(),
            vec![],
            "try {attempt}: torn down, the pod holds nothing"
        );
    }
    assert_eq!(addresses.len(), 1, "eth0 got {addresses:?} over 50 tries");
    lab.eventually("plain counts nothing held", Duration::from_secs(10), || {
        lab.agent.pool_counts("plain").1 == 10
    });
}
