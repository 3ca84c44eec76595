//! What the fleet controller pays per change at fleet scale, and what it would pay if every
//! change ran the full `allot_controller::fleet::sync` of the pool instead of a targeted pass:
//!
//! - deciding a pass from the index (`wants`) when 10,000 clusters are all in order: the cost
//!   of every watch event (including the controller's own writes) in the steady state;
//! - one new Cluster among 1,000 through the API (decide, then create, record, write, project);
//! - a full `sync` of the same 1,000-cluster pool (the periodic resync), in the same run.
//!
//! `cargo bench -p allot-controller --bench fleet_pass` (results: docs/benchmarks.md). The API
//! server is tests/apiserver in process: a real one adds a network round trip per request.

use std::hint::black_box;
use std::time::{Duration, Instant};

use allot_controller::fleet::reconcile::{Events, Reconciler};
use allot_controller::fleet::wants;
use allot_controller::fleet::{FleetCluster, plan, sync};
use allot_controller::lease::Leadership;
use allot_index::{
    CapiClusterObject, FleetIndex, IndexResource, IpamAllocationObject, IpamPoolObject,
};
use allot_k8s::openapi::api::core::v1::ConfigMap;
use allot_k8s::{IPAMAllocationSpec, IPAMPool};
use allot_test_apiserver::ApiServer;
use serde_json::{Value, json};

fn pool_spec() -> Value {
    json!({"datacenters": {
        "dc1": {"type": "range", "poolCidr": "10.0.0.0/8", "allocationRange": 100,
                "excludePrefixes": ["10.0.0.0/16", "10.128.0.0/12"],
                "excludeRanges": ["10.1.0.0-10.1.0.255", "10.2.3.4"]},
        "dc2": {"type": "prefix", "poolCidr": "10.0.0.0/8", "allocationPrefix": 24,
                "excludePrefixes": ["10.0.0.0/16", "10.64.0.0/10"]}}})
}

fn ns(i: usize) -> String {
    format!("cluster-{i:05}")
}

fn dc(i: usize) -> &'static str {
    if i.is_multiple_of(2) { "dc1" } else { "dc2" }
}

fn cluster(i: usize) -> Value {
    json!({"apiVersion": "cluster.x-k8s.io/v1beta1", "kind": "Cluster",
           "metadata": {"namespace": ns(i), "name": format!("c{i:05}"), "uid": format!("u{i}"),
                        "labels": {"allot.dev/datacenter": dc(i)}}})
}

/// The pool, its IPAMAllocations and ConfigMaps for `n` clusters, all in order.
fn fleet(n: usize) -> (Value, Vec<Value>, Vec<Value>) {
    let pool: IPAMPool = serde_json::from_value(json!({
        "apiVersion": "allot.dev/v1alpha1", "kind": "IPAMPool",
        "metadata": {"name": "big"}, "spec": pool_spec()}))
    .unwrap();
    let clusters: Vec<FleetCluster> = (0..n)
        .map(|i| FleetCluster {
            namespace: ns(i),
            name: format!("c{i:05}"),
            datacenter: dc(i).to_string(),
            pools: None,
        })
        .collect();
    let planned = plan(&[pool], &[], &clusters);
    assert_eq!(planned.refused(), 0);
    let mut records = serde_json::Map::new();
    let (mut objects, mut maps) = (Vec::new(), Vec::new());
    for e in &planned.entries {
        let (a, _) = e.outcome.as_ref().unwrap();
        let spec = serde_json::to_value(IPAMAllocationSpec::recording(a, &e.dc)).unwrap();
        records.insert(e.namespace.clone(), spec.clone());
        let name = format!("c{}", &e.namespace[8..]);
        objects.push(
            json!({"apiVersion": "allot.dev/v1alpha1", "kind": "IPAMAllocation",
            "metadata": {"namespace": e.namespace, "name": "big",
                         "labels": {"cluster.x-k8s.io/cluster-name": name}},
            "spec": spec,
            "status": {"state": "Allocated", "message": "m", "recordVersion": n,
                       "poolUid": "uid-big"}}),
        );
        maps.push(json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"namespace": e.namespace, "name": "allot-ipam-allocations"},
            "data": {"big": a.to_string()}}));
    }
    let pool = json!({"apiVersion": "allot.dev/v1alpha1", "kind": "IPAMPool",
        "metadata": {"name": "big", "uid": "uid-big"}, "spec": pool_spec(),
        "status": {"allocations": records, "recordVersion": n, "clusters": n}});
    (pool, objects, maps)
}

fn index(pool: &Value, objects: &[Value], clusters: &[Value], maps: &[Value]) -> FleetIndex {
    let dynamic = |v: &Value| serde_json::from_value(v.clone()).unwrap();
    let mut i = FleetIndex::new("allot.dev/datacenter");
    i.reset(vec![IpamPoolObject(dynamic(pool))]);
    i.reset(
        objects
            .iter()
            .map(|o| IpamAllocationObject(dynamic(o)))
            .collect::<Vec<_>>(),
    );
    i.reset(
        clusters
            .iter()
            .map(|c| CapiClusterObject(dynamic(c)))
            .collect::<Vec<_>>(),
    );
    i.reset(
        maps.iter()
            .map(|m| serde_json::from_value(m.clone()).unwrap())
            .collect::<Vec<ConfigMap>>(),
    );
    assert!(i.ready());
    i
}

fn summary(mut samples: Vec<Duration>) -> (Duration, Duration) {
    samples.sort();
    (samples[samples.len() / 2], samples[samples.len() - 1])
}

fn main() {
    // Deciding a pass over 10,000 clusters in order.
    let (pool, objects, maps) = fleet(10_000);
    let clusters: Vec<Value> = (0..10_000).map(cluster).collect();
    let big = index(&pool, &objects, &clusters, &maps);
    let samples: Vec<Duration> = (0..11)
        .map(|_| {
            let t = Instant::now();
            let work = black_box(wants(&big));
            assert!(work.is_empty());
            t.elapsed()
        })
        .collect();
    let (p50, max) = summary(samples);
    println!("decide a pass, 10,000 clusters in order: p50 {p50:?}, max of 11 {max:?}");

    // Through the API: 1,000 clusters.
    const N: usize = 1_000;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let _guard = runtime.enter();
    let (pool, objects, maps) = fleet(N);
    let server = ApiServer::new();
    let uid = server.insert("ipampools", pool.clone())["metadata"]["uid"].clone();
    for o in &objects {
        let mut o = o.clone();
        o["status"]["poolUid"] = uid.clone();
        server.insert("ipamallocations", o);
    }
    for m in &maps {
        server.insert("configmaps", m.clone());
    }
    let mut clusters: Vec<Value> = (0..N).map(cluster).collect();
    let client = server.client();
    let mut reconciler = Reconciler::new(
        client.clone(),
        Events::new(client.clone(), "bench"),
        Leadership::always(),
        "v1beta1",
    );
    let mut samples = Vec::new();
    for run in 0..7 {
        // The index as the watches would show it now, with one Cluster more.
        let i = N + run;
        clusters.push(cluster(i));
        let stored = |plural: &str| server.objects(plural);
        let pool_now = stored("ipampools").remove(0);
        let index = index(
            &pool_now,
            &stored("ipamallocations"),
            &clusters,
            &stored("configmaps"),
        );
        let t = Instant::now();
        let work = wants(&index);
        assert_eq!(work.allocations.len(), 1, "only the new cluster");
        let outcome = runtime.block_on(reconciler.pass(work));
        samples.push(t.elapsed());
        assert_eq!(outcome.allocated, 1);
    }
    let (p50, max) = summary(samples);
    println!("one new Cluster among {N}: decide and write, p50 {p50:?}, max of 7 {max:?}");

    let fleet_clusters: Vec<FleetCluster> = (0..N + 7)
        .map(|i| FleetCluster {
            namespace: ns(i),
            name: format!("c{i:05}"),
            datacenter: dc(i).to_string(),
            pools: None,
        })
        .collect();
    let samples: Vec<Duration> = (0..3)
        .map(|_| {
            let t = Instant::now();
            let report = runtime
                .block_on(sync(&client, "big", &fleet_clusters))
                .unwrap();
            assert!(report.released.is_empty());
            t.elapsed()
        })
        .collect();
    let requests: u64 = ["get", "patch", "update", "list", "create"]
        .iter()
        .map(|v| {
            ["ipampools", "ipamallocations", "configmaps"]
                .iter()
                .map(|p| server.requests(v, p))
                .sum::<u64>()
        })
        .sum();
    let (p50, max) = summary(samples);
    println!(
        "full sync of the pool, {} clusters: p50 {p50:?}, max of 3 {max:?} ({requests} requests served in the whole run)",
        N + 7
    );
}
