//! A full GC scan of 150,000 claims against cached pods, on two API servers in one run: the
//! in-memory one (tests/apiserver) and a real kube-apiserver with etcd
//! (`allot_lab::LoopbackControlPlane`, built by `scripts/setup.sh`; skipped with a line when its
//! binaries are missing).
//!
//! The claims live in 2,344 IPBlocks and are read through the real Kubernetes store (its
//! watch-fed mirror), as the controller reads them; 150,000 pods are in the controller's index,
//! 1% of them deleted (their DEL never came). Timed:
//! 1. the first scan: every claim decided, the 1,500 leaks seen once;
//! 2. the second scan past the grace period: every claim decided again, the 1,500 leaks
//!    re-read from the API (404), released in batches, Events recorded;
//! 3. a scan with nothing to release.
//!
//! `cargo bench -p allot-controller --bench gc_scan`

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use allot_controller::gc::{ApiReader, Collector, GcSettings};
use allot_controller::lease::Leadership;
use allot_controller::metrics::Metrics;
use allot_core::block::{block_name, block_of};
use allot_core::store::{Clock, Store, system_clock};
use allot_index::{ClusterIndex, IndexResource, Shared};
use allot_k8s::openapi::api::apps::v1::StatefulSet;
use allot_k8s::openapi::api::core::v1::{Node, Pod, PodIP, PodSpec, PodStatus};
use allot_k8s::openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use allot_lab::{LoopbackControlPlane, LoopbackOptions};
use allot_store::{KubeConfig, KubeStore};
use allot_test_apiserver::ApiServer;
use serde_json::{Map, Value, json};

const CLAIMS: usize = 150_000;
/// One pod in a hundred is gone.
const LEAKED_EVERY: usize = 100;
const T0: u64 = 1_800_000_000;

fn address(i: usize) -> IpAddr {
    IpAddr::V4(Ipv4Addr::from(
        u32::from_be_bytes([10, 16, 0, 0]) + i as u32,
    ))
}

fn pod_name(i: usize) -> String {
    format!("web-7d9f8c6b5-{i:06}")
}

fn uid(i: usize) -> String {
    format!("6f1c2d3e-{:04x}-4000-8000-{i:012x}", i % 65536)
}

fn pod(i: usize) -> Pod {
    Pod {
        metadata: ObjectMeta {
            namespace: Some("shop".into()),
            name: Some(pod_name(i)),
            uid: Some(uid(i)),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            node_name: Some(format!("node-{}", i % 50)),
            ..PodSpec::default()
        }),
        status: Some(PodStatus {
            phase: Some("Running".into()),
            pod_ips: Some(vec![PodIP {
                ip: address(i).to_string(),
            }]),
            ..PodStatus::default()
        }),
    }
}

fn node(i: usize) -> Node {
    serde_json::from_value(json!({"metadata": {"name": format!("node-{i}")},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]}}))
    .unwrap()
}

fn main() {
    let mut blocks: BTreeMap<String, Map<String, Value>> = BTreeMap::new();
    for i in 0..CLAIMS {
        let a = address(i);
        let claim = json!({
            "pool": "default-v4", "network": "underlay",
            "containerId": format!("{:064x}", i as u128 * 0x9e37_79b9_7f4a_7c15),
            "interface": "eth0", "namespace": "shop", "pod": pod_name(i), "uid": uid(i),
            "ownerKind": "Deployment", "ownerName": "web", "updatedAt": T0 - 86_400,
        });
        blocks
            .entry(block_name(&block_of(a)))
            .or_default()
            .insert(a.to_string(), claim);
    }
    let objects: Vec<Value> = blocks
        .into_iter()
        .map(|(name, claims)| {
            let cidr = allot_core::block::block_named(&name).unwrap().to_string();
            json!({"apiVersion": "allot.dev/v1alpha1", "kind": "IPBlock",
                   "metadata": {"name": name}, "spec": {"cidr": cidr, "claims": claims}})
        })
        .collect();

    {
        let server = ApiServer::new();
        for o in &objects {
            server.insert("ipblocks", o.clone());
        }
        let s = server.clone();
        let store: Arc<dyn Store> = Arc::new(
            KubeStore::open_with(&KubeConfig::default(), system_clock(), move || async move {
                Ok(s.client())
            })
            .expect("the store lists the blocks"),
        );
        scan(
            "the in-memory API server",
            objects.len(),
            store,
            move |_| server.client(),
        );
    }

    let plane = match LoopbackControlPlane::start(LoopbackOptions::default()) {
        Ok(p) => p,
        Err(e) => {
            println!("a real kube-apiserver: skipped ({e:#}); run scripts/setup.sh");
            return;
        }
    };
    plane.apply_crds(&allot_k8s::crds()).unwrap();
    let t = Instant::now();
    for o in &objects {
        plane.create("ipblocks", o.clone()).unwrap();
    }
    println!(
        "{} IPBlocks created in the real API server in {:.1} s",
        objects.len(),
        t.elapsed().as_secs_f64()
    );
    let store: Arc<dyn Store> = Arc::new(
        KubeStore::connect(&KubeConfig {
            kubeconfig: Some(plane.kubeconfig().to_path_buf()),
            ..KubeConfig::default()
        })
        .expect("the store lists the blocks"),
    );
    let kubeconfig = plane.kubeconfig().to_path_buf();
    scan(
        "a real kube-apiserver (etcd 3.6, Kubernetes 1.35)",
        objects.len(),
        store,
        move |runtime| {
            runtime
                .block_on(allot_lab::kube_client(&kubeconfig))
                .unwrap()
        },
    );
}

/// Indexes the pods, then times three scans over the claims `store` reads, the leaks re-read
/// with the client `client` makes on the runtime the scans run on.
fn scan(
    server: &str,
    block_count: usize,
    store: Arc<dyn Store>,
    client: impl FnOnce(&tokio::runtime::Runtime) -> kube::Client,
) {
    let t = Instant::now();
    let mut index = ClusterIndex::new();
    IndexResource::<Pod>::reset(
        &mut index,
        (0..CLAIMS)
            .filter(|i| i % LEAKED_EVERY != 0)
            .map(pod)
            .collect(),
    );
    IndexResource::<Node>::reset(&mut index, (0..50).map(node).collect());
    IndexResource::<StatefulSet>::reset(&mut index, Vec::new());
    index.take_pending();
    let index = Shared::of(index);
    let indexed = t.elapsed();

    let now = Arc::new(AtomicU64::new(T0));
    let clock: Clock = {
        let now = now.clone();
        Arc::new(move || now.load(Ordering::SeqCst))
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    // The reader's client spawns its worker on the runtime it is built on.
    let _entered = runtime.enter();
    let mut gc = Collector::new(
        store.clone(),
        index,
        Arc::new(ApiReader::new(client(&runtime), "bench")),
        GcSettings::default(),
        Leadership::always(),
        Arc::new(Metrics::new()),
        clock,
    );
    let t = Instant::now();
    let all = store.all().unwrap().len();
    let read = t.elapsed();

    let timed = |gc: &mut Collector| {
        let t = Instant::now();
        let pass = runtime.block_on(gc.scan());
        let pass = pass.unwrap_or_else(|e| panic!("a scan after {:?}: {e}", t.elapsed()));
        (t.elapsed(), pass)
    };
    let (first, p1) = timed(&mut gc);
    now.fetch_add(60, Ordering::SeqCst);
    let (second, p2) = timed(&mut gc);
    now.fetch_add(60, Ordering::SeqCst);
    let (third, p3) = timed(&mut gc);

    let secs = |d: Duration| d.as_secs_f64();
    println!("on {server}:");
    println!(
        "  {CLAIMS} claims in {block_count} IPBlocks, {} pods cached ({:.2} s to index); the \
         store's all() returns {all} claims in {:.3} s",
        CLAIMS - CLAIMS / LEAKED_EVERY,
        secs(indexed),
        secs(read)
    );
    println!(
        "  scan 1 (first sighting): {:.3} s, {} claims, {} leaked, {} released",
        secs(first),
        p1.claims,
        p1.leaked,
        p1.released.len()
    );
    println!(
        "  scan 2 (past grace: fresh reads, releases, Events): {:.3} s, {} claims, {} leaked, {} released",
        secs(second),
        p2.claims,
        p2.leaked,
        p2.released.len()
    );
    println!(
        "  scan 3 (nothing to release): {:.3} s, {} claims, {} leaked",
        secs(third),
        p3.claims,
        p3.leaked
    );
}
