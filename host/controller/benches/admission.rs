//! What one admission costs at cluster scale: 1,000 IPPools (one /24 each) and 150,000 claims
//! (150 per pool), read as the webhook reads them (a list of pools and subnets through the API,
//! every claim from the store), then checked. Each step is also timed alone, in the same run, so
//! the share of the reads and of the checks shows.
//!
//! `cargo bench -p allot-controller --bench admission` (results: docs/benchmarks.md). The API
//! server is tests/apiserver in process: a real one adds its network round trip to the list.

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use allot_controller::webhook::admit::{self, Lookup};
use allot_core::edit::held_by_pool;
use allot_core::store::{Attachment, Claim, MemoryStore, PodRef, Store};
use allot_test_apiserver::ApiServer;
use kube::Api;
use kube::api::{ApiResource, DynamicObject, ListParams};
use kube::core::admission::{AdmissionRequest, AdmissionReview};
use serde_json::{Value, json};

const POOLS: usize = 1_000;
const CLAIMS_PER_POOL: usize = 150;
const RUNS: usize = 30;

fn subnet(i: usize) -> String {
    format!("10.{}.{}.0/24", i / 256, i % 256)
}

fn pool(i: usize) -> Value {
    json!({"apiVersion": "allot.dev/v1alpha1", "kind": "IPPool",
           "metadata": {"name": format!("pool-{i:04}")},
           "spec": {"subnet": subnet(i), "ips": [format!("10.{}.{}.10-10.{}.{}.250", i / 256, i % 256, i / 256, i % 256)]}})
}

fn request(
    operation: &str,
    object: Option<&Value>,
    old: Option<&Value>,
) -> AdmissionRequest<DynamicObject> {
    let some = object.or(old).unwrap();
    let review = json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": "u", "operation": operation, "name": some["metadata"]["name"],
            "kind": {"group": "allot.dev", "version": "v1alpha1", "kind": some["kind"]},
            "resource": {"group": "allot.dev", "version": "v1alpha1", "resource": "ippools"},
            "userInfo": {"username": "bench"}, "object": object, "oldObject": old,
        }
    });
    let review: AdmissionReview<DynamicObject> = serde_json::from_value(review).unwrap();
    review.try_into().unwrap()
}

fn time<F: Future>(rt: &tokio::runtime::Runtime, mut f: impl FnMut() -> F) -> (Duration, Duration) {
    let mut samples: Vec<Duration> = (0..RUNS)
        .map(|_| {
            let t = Instant::now();
            black_box(rt.block_on(f()));
            t.elapsed()
        })
        .collect();
    samples.sort();
    (samples[RUNS / 2], samples[RUNS - 1])
}

fn report(what: &str, (p50, max): (Duration, Duration)) {
    println!(
        "{what:<58} p50 {:>8.2} ms   max {:>8.2} ms",
        p50.as_secs_f64() * 1e3,
        max.as_secs_f64() * 1e3
    );
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let server = ApiServer::new();
    for i in 0..POOLS {
        server.insert("ippools", pool(i));
    }
    let store = MemoryStore::new();
    let claims: Vec<Claim> = (0..POOLS)
        .flat_map(|i| {
            (0..CLAIMS_PER_POOL).map(move |j| Claim {
                address: format!("10.{}.{}.{}", i / 256, i % 256, 10 + j)
                    .parse()
                    .unwrap(),
                pool: format!("pool-{i:04}"),
                network: "net".into(),
                attachment: Some(Attachment {
                    container_id: format!("c{i}-{j}"),
                    interface: "eth0".into(),
                }),
                pod: PodRef {
                    namespace: "bench".into(),
                    name: format!("p{i}-{j}"),
                    uid: format!("u{i}-{j}"),
                    ..PodRef::default()
                },
                node: String::new(),
                updated_at: 0,
            })
        })
        .collect();
    for chunk in claims.chunks(1_000) {
        store.claim(chunk).unwrap();
    }
    let store: Arc<dyn Store> = Arc::new(store);
    let client = rt.block_on(async { server.client() });
    let lookup = Lookup::new(client.clone(), store.clone());
    println!(
        "{POOLS} IPPools, {} claims; {RUNS} runs each",
        POOLS * CLAIMS_PER_POOL
    );

    let fresh = pool(POOLS + 1);
    report(
        "IPPool CREATE (allowed): lists, claims, checks",
        time(&rt, || {
            let r = request("CREATE", Some(&fresh), None);
            let lookup = lookup.clone();
            async move { assert!(admit::validate(&r, &lookup).await.allowed) }
        }),
    );
    let old = pool(7);
    let mut shrunk = old.clone();
    shrunk["spec"]["ips"] = json!(["10.0.7.100-10.0.7.250"]);
    report(
        "IPPool UPDATE removing addresses in use (denied)",
        time(&rt, || {
            let r = request("UPDATE", Some(&shrunk), Some(&old));
            let lookup = lookup.clone();
            async move { assert!(!admit::validate(&r, &lookup).await.allowed) }
        }),
    );
    report(
        "IPPool DELETE of a pool with claims (denied)",
        time(&rt, || {
            let r = request("DELETE", None, Some(&old));
            let lookup = lookup.clone();
            async move { assert!(!admit::validate(&r, &lookup).await.allowed) }
        }),
    );
    let mut finalizer = old.clone();
    finalizer["metadata"]["finalizers"] = json!(["allot.dev/claims"]);
    report(
        "IPPool UPDATE of metadata only (allowed, nothing read)",
        time(&rt, || {
            let r = request("UPDATE", Some(&finalizer), Some(&old));
            let lookup = lookup.clone();
            async move { assert!(admit::validate(&r, &lookup).await.allowed) }
        }),
    );

    println!("the steps alone:");
    let api: Api<DynamicObject> =
        Api::all_with(client, &ApiResource::erase::<allot_k8s::IPPool>(&()));
    report(
        "  list 1,000 IPPools through the API",
        time(&rt, || {
            let api = api.clone();
            async move { api.list(&ListParams::default().limit(500)).await.unwrap() }
        }),
    );
    report(
        "  every claim from the store (Store::all)",
        time(&rt, || {
            let store = store.clone();
            async move { store.all().unwrap().len() }
        }),
    );
    report(
        "  every claim from the store, grouped by pool",
        time(&rt, || {
            let store = store.clone();
            async move { held_by_pool(store.all().unwrap()).len() }
        }),
    );
}
