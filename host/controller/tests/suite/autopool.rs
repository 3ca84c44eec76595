//! Subnet auto-pools end to end against a real kube-apiserver (upstream etcd and
//! kube-apiserver on 127.0.0.1, `allot_lab::LoopbackControlPlane`, with allot's CRDs): the
//! controller's watches, its passes and its writes, claims in the Kubernetes store's IPBlocks on
//! the same server. A Deployment scaled 2 → 5 → 1 and deleted, with claims on some of its
//! addresses; a second Deployment from the same Subnet never overlapping it; the default policy
//! (the embedded component) choosing the pool the controller created.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use allot_controller::autopool::{AutoPoolArgs, AutoPools};
use allot_controller::lease::Leadership;
use allot_core::policy::{
    CniDefaults, Inventory, NamespaceInfo, Nic, NodeInfo, Owner, PodInfo, Policy, Request,
};
use allot_core::store::Store;
use allot_core::{AddrSet, IpFamily, Pool, Subnet};
use allot_k8s::openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use allot_k8s::{IPPool, Subnet as SubnetObject};
use allot_lab::LoopbackControlPlane;
use allot_policy::{Limits, PolicyEngine, PolicySource};
use allot_store::contract::{attachment, claim, pod};
use allot_store::{KubeConfig, KubeStore};
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams};
use serde_json::{Value, json};

const ALLOT: &str = "allot.dev/v1alpha1";

fn objects(plane: &LoopbackControlPlane, plural: &str) -> Vec<Value> {
    plane
        .list(ALLOT, plural)
        .unwrap_or_else(|e| panic!("listing {plural}: {e:#}"))
}

const SUBNET_ANNOTATION: &str = r#"{"ipv4":["subnet-a"]}"#;

fn deployment(name: &str, replicas: i64) -> Value {
    json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"namespace": "team-a", "name": name},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}}, "template": {
            "metadata": {"labels": {"app": name},
                         "annotations": {"ipam.allot.dev/subnet": SUBNET_ANNOTATION}},
            "spec": {"containers": [{"name": "app", "image": "app"}]}}},
    })
}

/// The auto pools on the server, by workload name: (pool name, addresses).
fn auto_pools(plane: &LoopbackControlPlane) -> Vec<(String, String, AddrSet)> {
    objects(plane, "ippools")
        .into_iter()
        .filter_map(|p| {
            let owner = p["metadata"]["labels"]["ipam.allot.dev/owner-application-name"]
                .as_str()?
                .to_string();
            let ips: Vec<String> = serde_json::from_value(p["spec"]["ips"].clone()).ok()?;
            Some((
                owner,
                p["metadata"]["name"].as_str()?.to_string(),
                AddrSet::parse_entries(IpFamily::V4, &ips).ok()?,
            ))
        })
        .collect()
}

fn pool_of(plane: &LoopbackControlPlane, owner: &str) -> Option<(String, AddrSet)> {
    auto_pools(plane)
        .into_iter()
        .find(|(o, _, _)| o == owner)
        .map(|(_, name, ips)| (name, ips))
}

fn eventually<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(t) = f() {
            return t;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn no_overlap(plane: &LoopbackControlPlane) {
    let pools = auto_pools(plane);
    for (i, (a, _, x)) in pools.iter().enumerate() {
        for (b, _, y) in &pools[i + 1..] {
            assert!(!x.overlaps(y), "{a} and {b} overlap: {x:?} {y:?}");
        }
    }
}

/// What the embedded default policy chooses for a pod of the `kind` named `owner`, from the
/// pools and Subnets on the server.
fn chosen_by_default_policy(
    plane: &LoopbackControlPlane,
    kind: &str,
    owner: &str,
) -> Option<String> {
    let pools: Vec<Pool> = objects(plane, "ippools")
        .into_iter()
        .map(|o| Pool::try_from(&serde_json::from_value::<IPPool>(o).unwrap()).unwrap())
        .collect();
    let subnets: Vec<Subnet> = objects(plane, "subnets")
        .into_iter()
        .map(|o| Subnet::try_from(&serde_json::from_value::<SubnetObject>(o).unwrap()).unwrap())
        .collect();
    let inventory = Arc::new(Inventory::build(1, &pools, &subnets, &[]));
    let request = Request {
        pod: PodInfo {
            namespace: "team-a".into(),
            name: format!("{owner}-5d8f-x2x7q"),
            uid: "uid-pod".into(),
            annotations: [(
                "ipam.allot.dev/subnet".to_string(),
                SUBNET_ANNOTATION.to_string(),
            )]
            .into(),
            owner: Some(Owner {
                kind: kind.into(),
                name: owner.into(),
            }),
            ..PodInfo::default()
        },
        namespace: NamespaceInfo {
            name: "team-a".into(),
            ..NamespaceInfo::default()
        },
        node: NodeInfo {
            name: "node-1".into(),
            ..NodeInfo::default()
        },
        nics: vec![Nic {
            interface: "eth0".into(),
            multus_name: String::new(),
        }],
        cni_defaults: CniDefaults::default(),
        free_counts: inventory.pools.iter().map(|p| p.total_count).collect(),
    };
    let engine = PolicyEngine::new(Limits::default(), None).unwrap();
    let policy = engine.load(&PolicySource::embedded_default()).unwrap();
    let decision = policy.decide(&inventory, &request).unwrap();
    let family = decision.nics[0].families.first()?;
    let index = *family.order.first()?;
    Some(inventory.pools[index as usize].name.clone())
}

/// The auto-pool controller against `server` (leading; passes, discovery and the first-list
/// limit of a few seconds), its claims in the server's IPBlocks; stopped by [`Controller::stop`].
struct Controller {
    runtime: tokio::runtime::Runtime,
    store: Arc<dyn Store>,
    client: kube::Client,
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<()>,
}

impl Controller {
    fn start(server: &LoopbackControlPlane) -> Controller {
        let store: Arc<dyn Store> = Arc::new(
            KubeStore::connect(&KubeConfig {
                kubeconfig: Some(server.kubeconfig().to_path_buf()),
                ..KubeConfig::default()
            })
            .unwrap(),
        );
        let runtime = tokio::runtime::Runtime::new().unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let client = runtime
            .block_on(allot_lab::kube_client(server.kubeconfig()))
            .unwrap();
        let task = {
            let _guard = runtime.enter();
            let auto_pools = AutoPools {
                client: client.clone(),
                store: store.clone(),
                leadership: Leadership::always(),
                args: AutoPoolArgs {
                    enabled: true,
                    resync_seconds: 1,
                    discovery_seconds: 1,
                    first_list_seconds: 3,
                },
                instance: "controller-0".into(),
            };
            runtime.spawn(auto_pools.run(async {
                let _ = stopped.await;
            }))
        };
        Controller {
            runtime,
            store,
            client,
            stop,
            task,
        }
    }

    fn stop(self) {
        let _ = self.stop.send(());
        self.runtime.block_on(self.task).unwrap();
    }
}

#[test]
fn a_deployment_scaled_up_down_and_deleted_with_a_second_one_beside_it() {
    let Some(server) = LoopbackControlPlane::for_test(
        "a_deployment_scaled_up_down_and_deleted_with_a_second_one_beside_it",
        Default::default(),
    ) else {
        return;
    };
    server.apply_crds(&allot_k8s::crds()).unwrap();
    server.create_namespace("team-a", json!({})).unwrap();
    server
        .create(
            "subnets",
            json!({"apiVersion": "allot.dev/v1alpha1", "kind": "Subnet",
               "metadata": {"name": "subnet-a"},
               "spec": {"subnet": "10.20.0.0/24", "ips": ["10.20.0.10-10.20.0.40"],
                        "excludeIPs": ["10.20.0.20"], "gateway": "10.20.0.1"}}),
        )
        .unwrap();
    // A pool made by hand inside the Subnet: never carved from.
    server
        .create(
            "ippools",
            json!({"apiVersion": "allot.dev/v1alpha1", "kind": "IPPool",
               "metadata": {"name": "manual"},
               "spec": {"subnet": "10.20.0.0/24", "ips": ["10.20.0.10-10.20.0.12"]}}),
        )
        .unwrap();
    server.create("deployments", deployment("web", 2)).unwrap();
    server.create("deployments", deployment("api", 3)).unwrap();

    let controller = Controller::start(&server);

    // 2 replicas + 1, 3 replicas + 1.
    let (web_pool, web) = eventually("web's pool", || {
        pool_of(&server, "web").filter(|(_, ips)| ips.len() == 3)
    });
    eventually("api's pool", || {
        pool_of(&server, "api").filter(|(_, ips)| ips.len() == 4)
    });
    no_overlap(&server);
    let manual = AddrSet::parse_entries(IpFamily::V4, &["10.20.0.10-10.20.0.12"]).unwrap();
    for (_, _, ips) in auto_pools(&server) {
        assert!(!ips.overlaps(&manual));
        assert!(!ips.contains("10.20.0.20".parse().unwrap()), "excluded");
    }
    assert_eq!(
        chosen_by_default_policy(&server, "Deployment", "web").as_deref(),
        Some(web_pool.as_str())
    );

    // Two of web's addresses are claimed by its pods.
    let claimed: Vec<IpAddr> = web.iter().take(2).collect();
    let claims: Vec<_> = claimed
        .iter()
        .enumerate()
        .map(|(n, a)| {
            claim(
                &a.to_string(),
                &web_pool,
                Some(&attachment(&format!("c{n}"), "eth0")),
                &pod("team-a", &format!("web-{n}"), &format!("u{n}")),
                1,
            )
        })
        .collect();
    controller.store.claim(&claims).unwrap();

    // Scaled to 5: 6 addresses, keeping the 3 it had.
    scale(&server, 5);
    let grown = eventually("web grown to 6", || {
        pool_of(&server, "web").and_then(|(_, ips)| (ips.len() == 6).then_some(ips))
    });
    assert!(web.is_subset(&grown));
    no_overlap(&server);

    // Scaled to 1: 2 addresses, exactly the claimed ones.
    scale(&server, 1);
    let shrunk = eventually("web shrunk to 2", || {
        pool_of(&server, "web").and_then(|(_, ips)| (ips.len() == 2).then_some(ips))
    });
    let expected: BTreeSet<IpAddr> = claimed.iter().copied().collect();
    assert_eq!(shrunk.iter().collect::<BTreeSet<_>>(), expected);

    // Scaled to 0 it still keeps what is claimed.
    scale(&server, 0);
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(pool_of(&server, "web").unwrap().1.len(), 2);

    // Deleted: its pool waits for its pods' addresses to be released (the webhook would refuse
    // deleting a pool that holds addresses), then goes; api's stays.
    assert!(
        server
            .delete("apps/v1", "deployments", Some("team-a"), "web")
            .unwrap()
    );
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(pool_of(&server, "web").unwrap().1.len(), 2, "still held");
    for n in 0..claimed.len() {
        controller
            .store
            .release_attachment(&attachment(&format!("c{n}"), "eth0"))
            .unwrap();
    }
    eventually("web's pool deleted", || {
        pool_of(&server, "web").is_none().then_some(())
    });
    assert_eq!(pool_of(&server, "api").unwrap().1.len(), 4);
    assert!(
        objects(&server, "ippools")
            .iter()
            .any(|p| p["metadata"]["name"] == "manual")
    );

    controller.stop();
}

/// OpenKruise's CloneSet CRD at the pinned release (`scripts/fetch-peer-crds.sh`).
fn cloneset_crd() -> CustomResourceDefinition {
    let dir = std::env::var_os("ALLOT_PEER_CRDS")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| {
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/peer-crds")
        })
        .join("kruise");
    let file = dir.join("apps.kruise.io_clonesets.yaml");
    let text = std::fs::read_to_string(&file).unwrap_or_else(|e| {
        panic!(
            "{}: {e}; run scripts/setup.sh (scripts/fetch-peer-crds.sh)",
            file.display()
        )
    });
    serde_yaml::from_str(&text).unwrap()
}

/// A CloneSet (OpenKruise's CRD, registered in the real API server) whose pod template names a
/// Subnet gets an auto pool sized by its scale subresource; scaled through that subresource, as
/// `kubectl scale` does, the pool follows; deleted, the pool goes. A pool of a kind the server
/// does not serve (nothing follows it) stays.
#[test]
fn a_cloneset_gets_an_auto_pool_sized_through_its_scale_subresource() {
    let Some(server) = LoopbackControlPlane::for_test(
        "a_cloneset_gets_an_auto_pool_sized_through_its_scale_subresource",
        Default::default(),
    ) else {
        return;
    };
    server.apply_crds(&allot_k8s::crds()).unwrap();
    server.apply_crds(&[cloneset_crd()]).unwrap();
    server.create_namespace("team-a", json!({})).unwrap();
    server
        .create(
            "subnets",
            json!({"apiVersion": "allot.dev/v1alpha1", "kind": "Subnet",
               "metadata": {"name": "subnet-a"},
               "spec": {"subnet": "10.20.0.0/24", "ips": ["10.20.0.10-10.20.0.40"],
                        "gateway": "10.20.0.1"}}),
        )
        .unwrap();
    // An auto pool left by a workload kind this server does not serve.
    server
        .create(
            "ippools",
            json!({"apiVersion": "allot.dev/v1alpha1", "kind": "IPPool",
               "metadata": {"name": "auto-rollout-team-a-old-v4-subnet-a", "labels": {
                   "app.kubernetes.io/managed-by": "allot-controller",
                   "ipam.allot.dev/owner-subnet": "subnet-a",
                   "ipam.allot.dev/owner-application-kind": "Rollout",
                   "ipam.allot.dev/owner-application-namespace": "team-a",
                   "ipam.allot.dev/owner-application-name": "old"}},
               "spec": {"subnet": "10.20.0.0/24", "ips": ["10.20.0.39-10.20.0.40"]}}),
        )
        .unwrap();
    server
        .create(
            "clonesets",
            json!({
                "apiVersion": "apps.kruise.io/v1alpha1", "kind": "CloneSet",
                "metadata": {"namespace": "team-a", "name": "web"},
                "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "web"}}, "template": {
                    "metadata": {"labels": {"app": "web"},
                                 "annotations": {"ipam.allot.dev/subnet": SUBNET_ANNOTATION}},
                    "spec": {"containers": [{"name": "app", "image": "app"}]}}},
            }),
        )
        .unwrap();

    let controller = Controller::start(&server);

    // 2 replicas + 1, chosen by the default policy for the CloneSet's pods.
    let (pool, _) = eventually("web's pool", || {
        pool_of(&server, "web").filter(|(_, ips)| ips.len() == 3)
    });
    let pool_object = objects(&server, "ippools")
        .into_iter()
        .find(|p| p["metadata"]["name"] == pool.as_str())
        .unwrap();
    assert_eq!(
        pool_object["metadata"]["labels"]["ipam.allot.dev/owner-application-kind"],
        "CloneSet"
    );
    assert_eq!(
        chosen_by_default_policy(&server, "CloneSet", "web").as_deref(),
        Some(pool.as_str())
    );

    // Scaled through its scale subresource, as `kubectl scale` does.
    let clonesets: Api<DynamicObject> = Api::namespaced_with(
        controller.client.clone(),
        "team-a",
        &ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("apps.kruise.io", "v1alpha1", "CloneSet"),
            "clonesets",
        ),
    );
    controller
        .runtime
        .block_on(clonesets.patch_scale(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 6}})),
        ))
        .unwrap();
    eventually("web grown to 7", || {
        pool_of(&server, "web").filter(|(_, ips)| ips.len() == 7)
    });
    no_overlap(&server);

    // Deleted: its pool goes; the pool of the kind nothing serves stays.
    assert!(
        server
            .delete(
                "apps.kruise.io/v1alpha1",
                "clonesets",
                Some("team-a"),
                "web"
            )
            .unwrap()
    );
    eventually("web's pool deleted", || {
        pool_of(&server, "web").is_none().then_some(())
    });
    assert!(pool_of(&server, "old").is_some());

    controller.stop();
}

/// A kind with a scale subresource whose objects cannot be listed (its conversion webhook is
/// unreachable, so a list of its preferred version fails) is given up after
/// `--auto-pool-first-list-seconds`: a Deployment's auto pool is carved meanwhile instead of
/// waiting forever for that kind's first list.
#[test]
fn a_scalable_kind_that_cannot_be_listed_does_not_hold_the_other_workloads() {
    let Some(server) = LoopbackControlPlane::for_test(
        "a_scalable_kind_that_cannot_be_listed_does_not_hold_the_other_workloads",
        Default::default(),
    ) else {
        return;
    };
    server.apply_crds(&allot_k8s::crds()).unwrap();
    let version = |name: &str, storage: bool| {
        json!({"name": name, "served": true, "storage": storage,
               "subresources": {"scale": {"specReplicasPath": ".spec.replicas",
                                          "statusReplicasPath": ".status.replicas"}},
               "schema": {"openAPIV3Schema": {"type": "object",
                                              "x-kubernetes-preserve-unknown-fields": true}}})
    };
    let crd: CustomResourceDefinition = serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "gadgets.broken.example.com"},
        "spec": {"group": "broken.example.com", "scope": "Namespaced",
                 "names": {"plural": "gadgets", "singular": "gadget", "kind": "Gadget"},
                 "versions": [version("v1", true), version("v2", false)],
                 "conversion": {"strategy": "Webhook", "webhook": {
                     "conversionReviewVersions": ["v1"],
                     "clientConfig": {"url": "https://127.0.0.1:9/convert"}}}},
    }))
    .unwrap();
    server.apply_crds(&[crd]).unwrap();
    server.create_namespace("team-a", json!({})).unwrap();
    // Stored as v1; listing v2 (the preferred version) needs the unreachable webhook.
    server
        .create(
            "gadgets",
            json!({"apiVersion": "broken.example.com/v1", "kind": "Gadget",
                   "metadata": {"namespace": "team-a", "name": "g"}, "spec": {"replicas": 1}}),
        )
        .unwrap();
    server
        .create(
            "subnets",
            json!({"apiVersion": "allot.dev/v1alpha1", "kind": "Subnet",
               "metadata": {"name": "subnet-a"},
               "spec": {"subnet": "10.20.0.0/24", "ips": ["10.20.0.10-10.20.0.40"],
                        "gateway": "10.20.0.1"}}),
        )
        .unwrap();
    server.create("deployments", deployment("web", 2)).unwrap();

    let controller = Controller::start(&server);

    eventually("web's pool, with the broken kind given up", || {
        pool_of(&server, "web").filter(|(_, ips)| ips.len() == 3)
    });
    let failed_lists = allot_lab::audit::read(server.logs())
        .unwrap()
        .into_iter()
        .filter(|r| r.resource == "broken.example.com/gadgets" && r.verb == "list")
        .filter(|r| r.code >= 500)
        .count();
    assert!(
        failed_lists > 0,
        "the broken kind was followed (and its lists failed) before it was given up"
    );

    controller.stop();
}

/// Deployment web scaled to `replicas`, as `kubectl scale` does.
fn scale(plane: &LoopbackControlPlane, replicas: i64) {
    plane
        .edit("apps/v1", "deployments", Some("team-a"), "web", |d| {
            d["spec"]["replicas"] = json!(replicas)
        })
        .unwrap();
}

/// examples/kubernetes/subnet-auto-pools.yaml asks for what its comments say, with the
/// Subnets of the examples.
#[test]
fn the_example_workloads_get_the_pools_their_comments_describe() {
    use allot_controller::autopool::Snapshot;
    use allot_core::autopool::Action;
    use allot_index::{
        IndexResource, PoolObject, ReservedObject, ScalableKind, ScaleRead, SubnetObject,
        WorkloadIndex,
    };
    use allot_k8s::openapi::api::apps::v1::{DaemonSet, Deployment, ReplicaSet, StatefulSet};
    use allot_k8s::openapi::api::batch::v1::{CronJob, Job};
    use kube::api::DynamicObject;
    use serde::Deserialize;

    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/kubernetes");
    let mut docs = Vec::new();
    for file in ["pools.yaml", "subnet-auto-pools.yaml"] {
        let text = std::fs::read_to_string(dir.join(file)).unwrap();
        for doc in serde_yaml::Deserializer::from_str(&text) {
            docs.push(serde_json::to_value(serde_yaml::Value::deserialize(doc).unwrap()).unwrap());
        }
    }
    let of = |kind: &'static str| docs.iter().filter(move |d| d["kind"] == kind).cloned();
    let dynamic = |d: Value| serde_json::from_value::<DynamicObject>(d).unwrap();
    let mut i = WorkloadIndex::new();
    i.reset(
        of("Deployment")
            .map(|d| serde_json::from_value::<Deployment>(d).unwrap())
            .collect(),
    );
    i.reset(
        of("StatefulSet")
            .map(|d| serde_json::from_value::<StatefulSet>(d).unwrap())
            .collect(),
    );
    i.reset(
        of("CronJob")
            .map(|d| serde_json::from_value::<CronJob>(d).unwrap())
            .collect(),
    );
    i.reset(Vec::<ReplicaSet>::new());
    i.reset(Vec::<Job>::new());
    i.reset(Vec::<DaemonSet>::new());
    // A CloneSet's count comes from its scale subresource; Kruise's maps it to spec.replicas.
    let clonesets = ScalableKind {
        group: "apps.kruise.io".into(),
        version: "v1alpha1".into(),
        kind: "CloneSet".into(),
        plural: "clonesets".into(),
    };
    i.follow(clonesets.clone());
    i.reset_scalable(
        &clonesets,
        of("CloneSet")
            .map(|d| {
                let replicas = d["spec"]["replicas"].as_u64().unwrap();
                (dynamic(d), ScaleRead::Read(replicas))
            })
            .collect(),
    );
    i.reset(of("IPPool").map(|d| PoolObject(dynamic(d))).collect());
    i.reset(of("Subnet").map(|d| SubnetObject(dynamic(d))).collect());
    i.reset(
        of("ReservedIP")
            .map(|d| ReservedObject(dynamic(d)))
            .collect(),
    );
    let mut created: Vec<(String, String, Vec<String>)> = Snapshot::of(&i)
        .dry_run()
        .into_iter()
        .map(|a| match a {
            Action::Create {
                app, labels, spec, ..
            } => (
                app.name,
                labels["ipam.allot.dev/owner-subnet"].clone(),
                spec.ips,
            ),
            other => panic!("{other:?}"),
        })
        .collect();
    created.sort();
    let size = |ips: &[String], family| AddrSet::parse_entries(family, ips).unwrap().len();
    let sizes: Vec<(&str, &str, u64)> = created
        .iter()
        .map(|(app, subnet, ips)| {
            let family = if subnet.ends_with("v6") {
                IpFamily::V6
            } else {
                IpFamily::V4
            };
            (app.as_str(), subnet.as_str(), size(ips, family))
        })
        .collect();
    assert_eq!(
        sizes,
        [
            ("cart", "apps-v4", 5),
            ("db", "apps-v4", 6),
            ("report", "apps-v4", 4),
            ("web", "apps-v4", 5),
            ("web", "apps-v6", 5),
        ]
    );
    let web_v4 = created
        .iter()
        .find(|c| c.0 == "web" && c.1 == "apps-v4")
        .unwrap();
    assert_eq!(web_v4.2, ["10.50.1.9-10.50.1.13"], "the example's comment");
}
