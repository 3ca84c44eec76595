//! Allocation against a real kube-apiserver (upstream etcd and kube-apiserver on 127.0.0.1,
//! with allot's CRDs): the record first, then the IPAMAllocation and the ConfigMap;
//! deprecated pools; a grown range; release and sync. Allocators racing, lost
//! compare-and-swaps, a failed write and a lowered prefix length run on the in-memory API
//! server (allot-test-apiserver), each saying which fault it needs.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::time::Duration;

use allot_controller::fleet::{
    CONFIG_MAP, FleetApiError, FleetCluster, Refusal, allocate, check_pool_edit, release, sync,
};
use allot_core::fleet::{Allocation, FleetError};
use allot_k8s::openapi::api::core::v1::ConfigMap;
use allot_k8s::{AllocationState, IPAMAllocation, IPAMPool};
use allot_lab::LoopbackControlPlane;
use allot_test_apiserver::ApiServer;
use kube::api::PostParams;
use kube::{Api, Client};
use serde_json::{Value, json};

fn pool_object(name: &str, datacenters: Value) -> Value {
    json!({
        "apiVersion": "allot.dev/v1alpha1",
        "kind": "IPAMPool",
        "metadata": {"name": name},
        "spec": {"datacenters": datacenters},
    })
}

/// A real API server with allot's CRDs, the clusters' namespaces created as needed.
struct Server {
    plane: LoopbackControlPlane,
}

/// The user the allocator's requests are made as.
const USER: &str = "allot-fleet";

impl Server {
    /// One for test `test` with namespaces `namespaces` (the clusters'); None when the lab's
    /// tests are skipped here (`ALLOT_LAB_SKIP`).
    fn start(test: &str, namespaces: &[&str]) -> Option<Server> {
        let plane = LoopbackControlPlane::for_test(test, Default::default())?;
        plane.apply_crds(&allot_k8s::crds()).unwrap();
        for ns in namespaces {
            plane.create_namespace(ns, json!({})).unwrap();
        }
        Some(Server { plane })
    }

    /// Creates `object` of `plural` as an administrator would, then its status when it has one
    /// (a record written before).
    fn insert(&self, plural: &str, object: Value) -> Value {
        let stored = self.plane.create(plural, object.clone()).unwrap();
        match object.get("status") {
            Some(status) => {
                let mut stored = stored;
                stored["status"] = status.clone();
                self.plane.replace_status(plural, stored).unwrap()
            }
            None => stored,
        }
    }

    /// A client as [`USER`], on the caller's runtime.
    async fn client(&self) -> Client {
        let kubeconfig = self
            .plane
            .user_kubeconfig(USER, &["system:masters"])
            .unwrap();
        allot_lab::kube_client(&kubeconfig).await.unwrap()
    }

    /// [`USER`]'s requests of `verb` on `plural`, the objects and their status.
    fn requests(&self, verb: &str, plural: &str) -> u64 {
        let resource = format!("allot.dev/{plural}");
        let status = format!("{resource}/status");
        self.plane
            .requests_of(USER)
            .unwrap()
            .iter()
            .filter(|r| r.verb == verb && (r.resource == resource || r.resource == status))
            .count() as u64
    }
}

fn cluster(namespace: &str, dc: &str) -> FleetCluster {
    FleetCluster {
        namespace: namespace.to_string(),
        name: namespace.to_string(),
        datacenter: dc.to_string(),
        pools: None,
    }
}

fn held(a: &IPAMAllocation) -> Allocation {
    a.spec.allocation().unwrap().expect("an allocation")
}

async fn pool(client: &Client, name: &str) -> IPAMPool {
    Api::<IPAMPool>::all(client.clone())
        .get(name)
        .await
        .unwrap()
}

/// Edits a pool's spec as an administrator would (kubectl edit).
async fn edit(client: &Client, name: &str, change: impl FnOnce(&mut IPAMPool)) {
    let api = Api::<IPAMPool>::all(client.clone());
    let mut p = api.get(name).await.unwrap();
    change(&mut p);
    api.replace(name, &PostParams::default(), &p).await.unwrap();
}

async fn config_map(client: &Client, ns: &str) -> BTreeMap<String, String> {
    Api::<ConfigMap>::namespaced(client.clone(), ns)
        .get(CONFIG_MAP)
        .await
        .unwrap()
        .data
        .unwrap_or_default()
}

fn refusal(e: FleetApiError) -> Refusal {
    match e {
        FleetApiError::Refused(r) => r,
        other => panic!("expected a refusal, got {other}"),
    }
}

#[tokio::test]
async fn the_record_is_written_first_then_the_allocation_and_the_configmap() {
    let Some(server) = Server::start(
        "the_record_is_written_first_then_the_allocation_and_the_configmap",
        &["cluster-xyz"],
    ) else {
        return;
    };
    server.insert(
        "ipampools",
        pool_object(
            "metallb",
            json!({"hamburg": {"type": "range", "poolCidr": "192.168.1.0/24",
                "allocationRange": 10, "excludeRanges": ["192.168.1.1-192.168.1.20"]}}),
        ),
    );
    let client = server.client().await;
    let a = allocate(&client, "metallb", &cluster("cluster-xyz", "hamburg"))
        .await
        .unwrap();
    assert_eq!(a.spec.addresses, ["192.168.1.21-192.168.1.30"]);
    assert_eq!(a.metadata.namespace.as_deref(), Some("cluster-xyz"));
    let status = a.status.clone().unwrap();
    assert_eq!(status.state, Some(AllocationState::Allocated));
    assert_eq!(status.record_version, Some(1));

    let p = pool(&client, "metallb").await;
    let record = p.status.unwrap();
    assert_eq!(record.allocations["cluster-xyz"], a.spec);
    assert_eq!(record.clusters, Some(1));
    assert_eq!(
        config_map(&client, "cluster-xyz").await["metallb"],
        "192.168.1.21-192.168.1.30"
    );

    // Asked again, the cluster keeps it and nothing is rewritten.
    let writes = server.requests("update", "ipampools");
    let again = allocate(&client, "metallb", &cluster("cluster-xyz", "hamburg"))
        .await
        .unwrap();
    assert_eq!(again.spec, a.spec);
    assert_eq!(server.requests("update", "ipampools"), writes);
}

/// Fault: every record write slowed down (`delay`), so that allocators read the version
/// another is replacing and lose compare-and-swaps, which the test asserts happened; a real
/// API server answers as fast as it can and may never let them interleave so.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_allocators_never_hand_out_overlapping_ranges() {
    const CLUSTERS: usize = 60;
    const ALLOCATORS: usize = 4;
    let server = ApiServer::new();
    server.insert(
        "ipampools",
        pool_object(
            "metallb",
            json!({"hamburg": {"type": "range", "poolCidr": "10.0.0.0/23",
                "allocationRange": 7, "excludeRanges": ["10.0.0.50-10.0.0.60"],
                "excludePrefixes": ["10.0.1.0/28"]}}),
        ),
    );
    // Every record write takes a moment before it lands, so that other allocators read the
    // version it replaces meanwhile, and lose their compare-and-swap.
    server.delay("update", "ipampools", Duration::from_millis(2));
    let clusters: Vec<FleetCluster> = (0..CLUSTERS)
        .map(|i| cluster(&format!("cluster-{i:02}"), "hamburg"))
        .collect();
    let mut tasks = Vec::new();
    for n in 0..ALLOCATORS {
        let client = server.client();
        let mut order = clusters.clone();
        // Each allocator walks the clusters from its own starting point.
        order.rotate_left(n * CLUSTERS / ALLOCATORS);
        if n % 2 == 1 {
            order.reverse();
        }
        tasks.push(tokio::spawn(async move {
            let mut got = Vec::new();
            for c in &order {
                let a = allocate(&client, "metallb", c).await.unwrap();
                got.push((c.namespace.clone(), held(&a)));
            }
            got
        }));
    }
    let mut answers: BTreeMap<String, HashSet<Allocation>> = BTreeMap::new();
    for task in tasks {
        for (ns, a) in task.await.unwrap() {
            answers.entry(ns).or_default().insert(a);
        }
    }
    server.clear_faults();
    // Every cluster served, and every allocator told it the same thing.
    assert_eq!(answers.len(), CLUSTERS);
    for (ns, seen) in &answers {
        assert_eq!(seen.len(), 1, "{ns} was told {seen:?}");
    }
    // No address handed out twice, none excluded.
    let mut addresses = BTreeSet::new();
    for a in answers.values().flatten() {
        assert_eq!(a.len(), 7);
        for run in a.addresses() {
            let (first, last) = run.split_once('-').unwrap();
            let (first, last): (std::net::Ipv4Addr, std::net::Ipv4Addr) =
                (first.parse().unwrap(), last.parse().unwrap());
            for n in u32::from(first)..=u32::from(last) {
                let ip = std::net::Ipv4Addr::from(n);
                assert!(addresses.insert(ip), "{ip} handed out twice");
                assert!(
                    !(50..=60).contains(&ip.octets()[3]) || ip.octets()[2] != 0,
                    "{ip}"
                );
                assert!(ip.octets()[2] != 1 || ip.octets()[3] > 15, "{ip} excluded");
            }
        }
    }
    // The record, the IPAMAllocations and the answers agree.
    let client = server.client();
    let record = pool(&client, "metallb").await.status.unwrap();
    assert_eq!(record.allocations.len(), CLUSTERS);
    for object in server.objects("ipamallocations") {
        let object: IPAMAllocation = serde_json::from_value(object).unwrap();
        let ns = object.metadata.namespace.clone().unwrap();
        assert_eq!(record.allocations[&ns], object.spec);
        assert_eq!(answers[&ns].iter().next(), Some(&held(&object)));
    }
    // The race was real: some compare-and-swaps were lost and retried.
    let writes = server.requests("update", "ipampools");
    assert!(
        writes > CLUSTERS as u64,
        "{writes} record writes for {CLUSTERS} clusters: no allocator ever lost a race"
    );
    assert_eq!(record.record_version, CLUSTERS as u64);
}

/// Fault: record writes answered 409 Conflict (`fail`), three times and then every time; a
/// real API server answers 409 only when another writer came first.
#[tokio::test]
async fn a_lost_compare_and_swap_reads_the_pool_again() {
    let server = ApiServer::new();
    server.insert(
        "ipampools",
        pool_object(
            "lb",
            json!({"dc1": {"type": "range", "poolCidr": "10.0.0.0/24", "allocationRange": 4}}),
        ),
    );
    let client = server.client();
    server.fail("update", "ipampools", 3, 409, "Conflict");
    let gets = server.requests("get", "ipampools");
    let a = allocate(&client, "lb", &cluster("cluster-a", "dc1"))
        .await
        .unwrap();
    assert_eq!(a.spec.addresses, ["10.0.0.1-10.0.0.4"]);
    assert_eq!(server.requests("update", "ipampools"), 4);
    assert_eq!(
        server.requests("get", "ipampools") - gets,
        4,
        "a fresh read per attempt"
    );

    server.fail("update", "ipampools", 1000, 409, "Conflict");
    let e = allocate(&client, "lb", &cluster("cluster-b", "dc1"))
        .await
        .unwrap_err();
    server.clear_faults();
    assert!(
        e.to_string()
            .contains("IPAMPool lb: 16 record writes in a row lost to other writers; try again"),
        "{e}"
    );
    // Nothing was recorded for cluster-b, and no IPAMAllocation claims addresses for it.
    let record = pool(&client, "lb").await.status.unwrap();
    assert!(!record.allocations.contains_key("cluster-b"));
    assert!(
        server
            .objects("ipamallocations")
            .iter()
            .all(|o| o["metadata"]["namespace"] != "cluster-b")
    );
}

#[tokio::test]
async fn a_deprecated_pool_keeps_its_clusters_and_serves_no_new_one() {
    let Some(server) = Server::start(
        "a_deprecated_pool_keeps_its_clusters_and_serves_no_new_one",
        &["cluster-a", "cluster-b"],
    ) else {
        return;
    };
    server.insert(
        "ipampools",
        pool_object(
            "lb",
            json!({"dc1": {"type": "range", "poolCidr": "10.0.0.0/24", "allocationRange": 4}}),
        ),
    );
    let client = server.client().await;
    let a = allocate(&client, "lb", &cluster("cluster-a", "dc1"))
        .await
        .unwrap();
    edit(&client, "lb", |p| {
        p.spec.datacenters.get_mut("dc1").unwrap().deprecated = true
    })
    .await;
    let kept = allocate(&client, "lb", &cluster("cluster-a", "dc1"))
        .await
        .unwrap();
    assert_eq!(kept.spec, a.spec);
    let e = allocate(&client, "lb", &cluster("cluster-b", "dc1"))
        .await
        .unwrap_err();
    assert_eq!(
        refusal(e),
        Refusal::Deprecated {
            pool: "lb".into(),
            dc: "dc1".into()
        }
    );
    // The refusal is where users look: a request object with the reason in its status.
    let b: IPAMAllocation = Api::namespaced(client.clone(), "cluster-b")
        .get("lb")
        .await
        .unwrap();
    assert_eq!(b.spec.allocation(), Ok(None));
    let status = b.status.unwrap();
    assert_eq!(status.state, Some(AllocationState::Refused));
    assert!(
        status
            .message
            .unwrap()
            .contains("is deprecated and serves no new cluster"),
    );
}

#[tokio::test]
async fn a_larger_allocation_range_grows_clusters_by_disjoint_runs() {
    let Some(server) = Server::start(
        "a_larger_allocation_range_grows_clusters_by_disjoint_runs",
        &["cluster-a", "cluster-b"],
    ) else {
        return;
    };
    server.insert(
        "ipampools",
        pool_object(
            "lb",
            json!({"dc1": {"type": "range", "poolCidr": "10.0.0.0/24", "allocationRange": 4}}),
        ),
    );
    let client = server.client().await;
    for ns in ["cluster-a", "cluster-b"] {
        allocate(&client, "lb", &cluster(ns, "dc1")).await.unwrap();
    }
    let before = pool(&client, "lb").await;
    edit(&client, "lb", |p| {
        p.spec.datacenters.get_mut("dc1").unwrap().allocation_range = Some(6)
    })
    .await;
    assert!(check_pool_edit(Some(&before), Some(&pool(&client, "lb").await), &[]).is_empty());
    let a = allocate(&client, "lb", &cluster("cluster-a", "dc1"))
        .await
        .unwrap();
    assert_eq!(
        a.spec.addresses,
        ["10.0.0.1-10.0.0.4", "10.0.0.9-10.0.0.10"]
    );
    assert_eq!(
        config_map(&client, "cluster-a").await["lb"],
        "10.0.0.1-10.0.0.4,10.0.0.9-10.0.0.10"
    );
    assert_eq!(a.status.unwrap().record_version, Some(3));
}

/// Fault: an IPAMPool whose allocationPrefix was lowered is stored; on a real API server the
/// CRD's CEL rule refuses that edit (as it should), so a pool stored so (before the rule, or
/// written past it) exists only on the in-memory server, which does not validate.
#[tokio::test]
async fn a_shorter_allocation_prefix_is_refused_and_the_prefix_kept() {
    let server = ApiServer::new();
    server.insert(
        "ipampools",
        pool_object(
            "nodes",
            json!({"dc1": {"type": "prefix", "poolCidr": "fd00:10::/48", "allocationPrefix": 64}}),
        ),
    );
    let client = server.client();
    let a = allocate(&client, "nodes", &cluster("cluster-a", "dc1"))
        .await
        .unwrap();
    assert_eq!(a.spec.cidr.as_deref(), Some("fd00:10::/64"));
    let before = pool(&client, "nodes").await;
    edit(&client, "nodes", |p| {
        p.spec.datacenters.get_mut("dc1").unwrap().allocation_prefix = Some(60)
    })
    .await;
    let after = pool(&client, "nodes").await;
    // The webhook's check refuses the edit ...
    let refused = check_pool_edit(Some(&before), Some(&after), &[]);
    assert_eq!(
        refused,
        [
            "IPAMPool nodes datacenter dc1: allocationPrefix is immutable (64 → 60): clusters hold /64 prefixes, which cannot be resized in place; for /60 prefixes create another IPAMPool"
        ]
    );
    // ... and if it got through anyway, the cluster keeps its /64.
    let e = allocate(&client, "nodes", &cluster("cluster-a", "dc1"))
        .await
        .unwrap_err();
    match refusal(e) {
        Refusal::Fleet { error, .. } => assert!(
            matches!(*error, FleetError::PrefixLengthLowered { .. }),
            "{error}"
        ),
        other => panic!("{other}"),
    }
    let record = pool(&client, "nodes").await.status.unwrap();
    assert_eq!(
        record.allocations["cluster-a"].cidr.as_deref(),
        Some("fd00:10::/64")
    );
    let object: IPAMAllocation = Api::namespaced(client.clone(), "cluster-a")
        .get("nodes")
        .await
        .unwrap();
    assert_eq!(object.spec.cidr.as_deref(), Some("fd00:10::/64"));
    let status = object.status.unwrap();
    assert_eq!(status.state, Some(AllocationState::Refused));
    assert!(
        status
            .message
            .unwrap()
            .contains("set allocationPrefix back to 64")
    );
}

#[tokio::test]
async fn release_frees_the_record_the_allocation_and_the_configmap_key() {
    let Some(server) = Server::start(
        "release_frees_the_record_the_allocation_and_the_configmap_key",
        &["cluster-a", "cluster-b"],
    ) else {
        return;
    };
    for name in ["lb", "nodes"] {
        server.insert(
            "ipampools",
            pool_object(
                name,
                json!({"dc1": {"type": "range", "poolCidr": "10.0.0.0/24", "allocationRange": 4}}),
            ),
        );
    }
    let client = server.client().await;
    let c = cluster("cluster-a", "dc1");
    allocate(&client, "lb", &c).await.unwrap();
    allocate(&client, "nodes", &c).await.unwrap();
    assert_eq!(config_map(&client, "cluster-a").await.len(), 2);

    let released = release(&client, "lb", "cluster-a").await.unwrap().unwrap();
    assert_eq!(released.addresses, ["10.0.0.1-10.0.0.4"]);
    assert!(
        pool(&client, "lb")
            .await
            .status
            .unwrap()
            .allocations
            .is_empty()
    );
    let objects: Api<IPAMAllocation> = Api::namespaced(client.clone(), "cluster-a");
    assert!(objects.get_opt("lb").await.unwrap().is_none());
    assert!(objects.get_opt("nodes").await.unwrap().is_some());
    let data = config_map(&client, "cluster-a").await;
    assert_eq!(data.keys().collect::<Vec<_>>(), ["nodes"]);
    // Again: nothing left to release, no error.
    assert_eq!(release(&client, "lb", "cluster-a").await.unwrap(), None);
    // The addresses are free for the next cluster.
    let b = allocate(&client, "lb", &cluster("cluster-b", "dc1"))
        .await
        .unwrap();
    assert_eq!(b.spec.addresses, ["10.0.0.1-10.0.0.4"]);
}

#[tokio::test]
async fn sync_releases_the_gone_adopts_the_migrated_and_serves_the_new() {
    let Some(server) = Server::start(
        "sync_releases_the_gone_adopts_the_migrated_and_serves_the_new",
        &[
            "cluster-new",
            "cluster-legacy",
            "cluster-b",
            "cluster-orphan",
            "cluster-r",
            "cluster-elsewhere",
            "cluster-gone",
            "cluster-moved",
        ],
    ) else {
        return;
    };
    let mut p = pool_object(
        "lb",
        json!({"dc1": {"type": "range", "poolCidr": "10.0.0.0/28", "allocationRange": 4},
               "dc2": {"type": "range", "poolCidr": "10.1.0.0/28", "allocationRange": 4}}),
    );
    p["status"] = json!({"allocations": {
        "cluster-gone": {"type": "range", "dc": "dc1", "addresses": ["10.0.0.5-10.0.0.8"]},
        "cluster-moved": {"type": "range", "dc": "dc3", "addresses": ["10.9.0.1-10.9.0.4"]},
    }, "recordVersion": 2});
    server.insert("ipampools", p);
    // Made by another allocator before allot: the pool has no record of it.
    server.insert(
        "ipamallocations",
        json!({"apiVersion": "allot.dev/v1alpha1", "kind": "IPAMAllocation",
               "metadata": {"name": "lb", "namespace": "cluster-legacy"},
               "spec": {"type": "range", "dc": "dc1", "addresses": ["10.0.0.1-10.0.0.4"]}}),
    );
    // Left behind by a release that recorded and did not get to delete.
    server.insert(
        "ipamallocations",
        json!({"apiVersion": "allot.dev/v1alpha1", "kind": "IPAMAllocation",
               "metadata": {"name": "lb", "namespace": "cluster-orphan"},
               "spec": {"type": "range", "dc": "dc1", "addresses": ["10.0.0.9-10.0.0.12"]}}),
    );
    let client = server.client().await;
    let mut request = cluster("cluster-r", "dc9");
    request.pools = Some(BTreeSet::from(["lb".to_string()]));
    let clusters = [
        cluster("cluster-new", "dc1"),
        cluster("cluster-legacy", "dc1"),
        cluster("cluster-b", "dc2"),
        cluster("cluster-elsewhere", "dc9"),
        request,
    ];
    let mut report = sync(&client, "lb", &clusters).await.unwrap();
    assert_eq!(
        report.released,
        ["cluster-gone", "cluster-moved", "cluster-orphan"]
    );
    assert!(
        Api::<IPAMAllocation>::namespaced(client.clone(), "cluster-orphan")
            .get_opt("lb")
            .await
            .unwrap()
            .is_none()
    );
    // A request from a datacenter the pool does not serve is told so; a Cluster there is not
    // the pool's business.
    let refused = report.allocated.remove("cluster-r").unwrap().unwrap_err();
    assert!(
        refused
            .to_string()
            .contains("IPAMPool lb has no entry for datacenter dc9"),
        "{refused}"
    );
    assert!(!report.allocated.contains_key("cluster-elsewhere"));
    let got: BTreeMap<&str, String> = report
        .allocated
        .iter()
        .map(|(ns, r)| (ns.as_str(), held(r.as_ref().unwrap()).to_string()))
        .collect();
    assert_eq!(
        got,
        BTreeMap::from([
            ("cluster-b", "10.1.0.1-10.1.0.4".to_string()),
            ("cluster-legacy", "10.0.0.1-10.0.0.4".to_string()),
            ("cluster-new", "10.0.0.5-10.0.0.8".to_string()),
        ])
    );
    let record = pool(&client, "lb").await.status.unwrap();
    assert_eq!(
        record.allocations.keys().collect::<Vec<_>>(),
        ["cluster-b", "cluster-legacy", "cluster-new"]
    );
    // A second sync changes nothing.
    let writes = server.requests("update", "ipampools");
    let again = sync(&client, "lb", &clusters).await.unwrap();
    assert!(again.released.is_empty());
    assert_eq!(server.requests("update", "ipampools"), writes);
}

#[tokio::test]
async fn a_pool_created_again_rewrites_what_its_predecessor_wrote() {
    let Some(server) = Server::start(
        "a_pool_created_again_rewrites_what_its_predecessor_wrote",
        &["cluster-a", "cluster-b", "cluster-c"],
    ) else {
        return;
    };
    let range = |n: u64| {
        pool_object(
            "lb",
            json!({"dc1": {"type": "range", "poolCidr": "10.0.0.0/24", "allocationRange": n}}),
        )
    };
    server.insert("ipampools", range(4));
    let client = server.client().await;
    for ns in ["cluster-b", "cluster-c", "cluster-a"] {
        allocate(&client, "lb", &cluster(ns, "dc1")).await.unwrap();
    }
    // Deleted and created again, larger: its record versions start over, and the
    // IPAMAllocation the old pool wrote at version 3 must not win over the new pool's version 1.
    Api::<IPAMPool>::all(client.clone())
        .delete("lb", &Default::default())
        .await
        .unwrap();
    server.insert("ipampools", range(6));
    let a = allocate(&client, "lb", &cluster("cluster-a", "dc1"))
        .await
        .unwrap();
    // cluster-a's grows past what cluster-b and cluster-c still hold (their IPAMAllocations,
    // which the new pool has no record of yet).
    assert_eq!(
        a.spec.addresses,
        ["10.0.0.9-10.0.0.12", "10.0.0.13-10.0.0.14"]
    );
    let stored: IPAMAllocation = Api::namespaced(client.clone(), "cluster-a")
        .get("lb")
        .await
        .unwrap();
    assert_eq!(stored.spec, a.spec);
    assert_eq!(stored.status.unwrap().record_version, Some(1));
}

/// Fault: the IPAMAllocation's creation answered 500 once (`fail`), as if the allocator had
/// died right after recording; a real API server cannot be told to fail one create.
#[tokio::test]
async fn an_allocation_recorded_but_not_written_is_written_on_the_next_call() {
    let server = ApiServer::new();
    server.insert(
        "ipampools",
        pool_object(
            "lb",
            json!({"dc1": {"type": "range", "poolCidr": "10.0.0.0/24", "allocationRange": 4}}),
        ),
    );
    let client = server.client();
    // The API server fails the IPAMAllocation's creation, as it would if the allocator died
    // right after recording.
    server.fail("create", "ipamallocations", 1, 500, "InternalError");
    let e = allocate(&client, "lb", &cluster("cluster-a", "dc1"))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("retrying later may succeed"), "{e}");
    let record = pool(&client, "lb").await.status.unwrap();
    assert_eq!(
        record.allocations["cluster-a"].addresses,
        ["10.0.0.1-10.0.0.4"]
    );
    assert!(server.objects("ipamallocations").is_empty());
    // Nobody else can be handed those addresses meanwhile.
    let b = allocate(&client, "lb", &cluster("cluster-b", "dc1"))
        .await
        .unwrap();
    assert_eq!(b.spec.addresses, ["10.0.0.5-10.0.0.8"]);
    // The next call writes what the record says, without recording again.
    let writes = server.requests("update", "ipampools");
    let a = allocate(&client, "lb", &cluster("cluster-a", "dc1"))
        .await
        .unwrap();
    assert_eq!(a.spec.addresses, ["10.0.0.1-10.0.0.4"]);
    assert_eq!(server.requests("update", "ipampools"), writes);
    assert_eq!(
        config_map(&client, "cluster-a").await["lb"],
        "10.0.0.1-10.0.0.4"
    );
}

/// Every IPAMAllocation holding addresses counts as taken, recorded or not. Another tool
/// (Kubermatic, someone migrating a cluster in) created cluster-b's while cluster-a was
/// recorded: growing cluster-a and serving cluster-c leave cluster-b's addresses alone, and
/// sync then adopts cluster-b as it is and grows it past everyone.
#[tokio::test]
async fn an_ipamallocation_the_pool_has_no_record_of_is_never_handed_out_again() {
    let Some(server) = Server::start(
        "an_ipamallocation_the_pool_has_no_record_of_is_never_handed_out_again",
        &["cluster-a", "cluster-b", "cluster-c"],
    ) else {
        return;
    };
    server.insert(
        "ipampools",
        pool_object(
            "lb",
            json!({"dc1": {"type": "range", "poolCidr": "10.0.0.0/24", "allocationRange": 4}}),
        ),
    );
    let client = server.client().await;
    let a = allocate(&client, "lb", &cluster("cluster-a", "dc1"))
        .await
        .unwrap();
    assert_eq!(a.spec.addresses, ["10.0.0.1-10.0.0.4"]);
    server.insert(
        "ipamallocations",
        json!({"apiVersion": "allot.dev/v1alpha1", "kind": "IPAMAllocation",
               "metadata": {"name": "lb", "namespace": "cluster-b"},
               "spec": {"type": "range", "dc": "dc1", "addresses": ["10.0.0.5-10.0.0.8"]}}),
    );
    edit(&client, "lb", |p| {
        p.spec.datacenters.get_mut("dc1").unwrap().allocation_range = Some(6)
    })
    .await;
    let a = allocate(&client, "lb", &cluster("cluster-a", "dc1"))
        .await
        .unwrap();
    assert_eq!(
        a.spec.addresses,
        ["10.0.0.1-10.0.0.4", "10.0.0.9-10.0.0.10"]
    );
    let c = allocate(&client, "lb", &cluster("cluster-c", "dc1"))
        .await
        .unwrap();
    assert_eq!(c.spec.addresses, ["10.0.0.11-10.0.0.16"]);
    let clusters = ["cluster-a", "cluster-b", "cluster-c"].map(|ns| cluster(ns, "dc1"));
    let report = sync(&client, "lb", &clusters).await.unwrap();
    let b = report.allocated["cluster-b"].as_ref().unwrap();
    assert_eq!(
        b.spec.addresses,
        ["10.0.0.5-10.0.0.8", "10.0.0.17-10.0.0.18"]
    );
    let record = pool(&client, "lb").await.status.unwrap();
    assert_eq!(record.allocations.len(), 3);
    // Nobody shares an address.
    let mut seen = BTreeSet::new();
    for spec in record.allocations.values() {
        for run in &spec.addresses {
            let (first, last) = run.split_once('-').unwrap();
            let (first, last): (std::net::Ipv4Addr, std::net::Ipv4Addr) =
                (first.parse().unwrap(), last.parse().unwrap());
            for n in u32::from(first)..=u32::from(last) {
                assert!(seen.insert(n), "{} held twice", std::net::Ipv4Addr::from(n));
            }
        }
    }
}

/// A prefix pool hands out its first and last prefixes too, and keeps a cluster migrating in
/// with the pool's first prefix.
#[tokio::test]
async fn a_prefix_pool_serves_its_first_and_last_prefix() {
    let Some(server) = Server::start(
        "a_prefix_pool_serves_its_first_and_last_prefix",
        &["cluster-migrated", "cluster-new"],
    ) else {
        return;
    };
    server.insert(
        "ipampools",
        pool_object(
            "nodes",
            json!({"dc1": {"type": "prefix", "poolCidr": "10.0.0.0/23", "allocationPrefix": 24}}),
        ),
    );
    server.insert(
        "ipamallocations",
        json!({"apiVersion": "allot.dev/v1alpha1", "kind": "IPAMAllocation",
               "metadata": {"name": "nodes", "namespace": "cluster-migrated"},
               "spec": {"type": "prefix", "dc": "dc1", "cidr": "10.0.0.0/24"}}),
    );
    let client = server.client().await;
    let clusters = ["cluster-migrated", "cluster-new"].map(|ns| cluster(ns, "dc1"));
    let report = sync(&client, "nodes", &clusters).await.unwrap();
    let got: BTreeMap<&str, Option<String>> = report
        .allocated
        .iter()
        .map(|(ns, r)| (ns.as_str(), r.as_ref().unwrap().spec.cidr.clone()))
        .collect();
    assert_eq!(
        got,
        BTreeMap::from([
            ("cluster-migrated", Some("10.0.0.0/24".to_string())),
            ("cluster-new", Some("10.0.1.0/24".to_string())),
        ])
    );
}
