//! The Kubernetes store at scale, against the in-memory API server (`tests/apiserver`):
//!
//! 1. **Objects per 150,000 claims**: ten nodes' engines (each starting its pools at a place of
//!    its own, as agents do) allocate 150,000 addresses, then half the pods go and 75,000 come;
//!    the IPBlocks needed are the distinct aligned 64-address runs holding a claim.
//! 2. **Conflicts per 1,000 allocations**: ten nodes, each a `KubeStore` with its own watch and
//!    an engine, allocate 100 addresses each at once from one pool: compare-and-swap writes
//!    lost (409) and batches lost to an address already taken.
//! 3. **Memory per 100,000 claims**: the heap a store retains for its mirror of 100,000 claims
//!    (1,563 blocks listed at start), counted by a counting allocator.
//!
//! `cargo bench -p allot-store --bench kube_scale` (results: docs/benchmarks.md).

use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use allot_core::block::{block_name, block_of};
use allot_core::store::{Attachment, Store, system_clock};
use allot_engine::testing::{CniDefaultsPolicy, pool, request};
use allot_engine::{Engine, EngineConfig, seed_of};
use allot_store::{KubeConfig, KubeStore, SqliteStore};
use allot_test_apiserver::ApiServer;
use serde_json::json;

/// Counts the bytes allocated and not yet freed.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size(), Ordering::Relaxed);
        // SAFETY: the caller's contract is System's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: the caller's contract is System's.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_add(new_size, Ordering::Relaxed);
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: the caller's contract is System's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

const NODES: usize = 10;

fn engine<S: Store + 'static>(store: S, node: usize, spread: bool) -> Engine<S, CniDefaultsPolicy> {
    let config = EngineConfig {
        cooldown: 0,
        gc_grace: 0,
        spread: spread.then(|| seed_of(&format!("node-{node}"))),
        single_node: !spread,
        ..EngineConfig::default()
    };
    Engine::with_config(store, CniDefaultsPolicy, config, system_clock())
}

fn blocks_of(store: &dyn Store) -> (usize, usize) {
    let claims = store.all().expect("all");
    let blocks: BTreeSet<String> = claims
        .iter()
        .map(|c| block_name(&block_of(c.address)))
        .collect();
    (blocks.len(), claims.len())
}

/// 1. Objects per 150,000 claims, with churn, in a pool of `subnet`.
fn objects(subnet: &str) {
    // SQLite: its lookups by attachment are indexed (the memory store scans), and the layout
    // depends only on which addresses the engines choose.
    let dir = tempfile::tempdir().expect("temp dir");
    let store = Arc::new(SqliteStore::open(dir.path().join("claims.db")).expect("open"));
    let engines: Vec<_> = (0..NODES).map(|n| engine(store.clone(), n, true)).collect();
    for e in &engines {
        e.load(vec![pool("big", subnet)], vec![], vec![])
            .expect("load");
    }
    let mut live = Vec::new();
    for i in 0..150_000 {
        let id = format!("c{i}");
        engines[i % NODES]
            .add(&request(&id, &id, false))
            .expect("add");
        live.push((i % NODES, id));
    }
    let (blocks, claims) = blocks_of(&*store);
    println!(
        "{subnet:<16} {claims:>7} claims after 150,000 ADDs from {NODES} nodes: {blocks:>6} IPBlocks ({:.1} claims each)",
        claims as f64 / blocks as f64
    );
    // Churn: every other pod goes (a spread-out half), 75,000 new ones come.
    let mut kept = Vec::new();
    for (i, (node, id)) in live.into_iter().enumerate() {
        if i % 2 == 0 {
            engines[node]
                .del(&Attachment {
                    container_id: id,
                    interface: "eth0".into(),
                })
                .expect("del");
        } else {
            kept.push(id);
        }
    }
    for i in 0..75_000 {
        let id = format!("d{i}");
        engines[i % NODES]
            .add(&request(&id, &id, false))
            .expect("add");
    }
    let (blocks, claims) = blocks_of(&*store);
    println!(
        "{subnet:<16} {claims:>7} claims after half left and 75,000 came:  {blocks:>6} IPBlocks ({:.1} claims each)",
        claims as f64 / blocks as f64
    );
}

fn kube_store(server: &ApiServer, node: usize) -> KubeStore {
    let server = server.clone();
    let config = KubeConfig {
        node: Some(format!("node-{node}")),
        ..KubeConfig::default()
    };
    KubeStore::open_with(&config, system_clock(), move || async move {
        Ok(server.client())
    })
    .expect("open")
}

/// 2. Conflicts per 1,000 allocations from ten nodes at once.
fn conflicts(spread: bool) {
    let server = ApiServer::new();
    let stores: Vec<Arc<KubeStore>> = (0..NODES)
        .map(|n| Arc::new(kube_store(&server, n)))
        .collect();
    let engines: Vec<_> = stores
        .iter()
        .enumerate()
        .map(|(n, s)| {
            let e = engine(s.clone(), n, spread);
            e.load(vec![pool("big", "10.0.0.0/16")], vec![], vec![])
                .expect("load");
            e
        })
        .collect();
    let t = Instant::now();
    std::thread::scope(|scope| {
        for (n, e) in engines.iter().enumerate() {
            scope.spawn(move || {
                for i in 0..100 {
                    let id = format!("n{n}-{i}");
                    e.add(&request(&id, &id, false)).expect("add");
                }
            });
        }
    });
    let elapsed = t.elapsed();
    let (mut cas, mut lost, mut requests) = (0, 0, 0);
    for s in &stores {
        let st = s.stats();
        cas += st.conflicts;
        lost += st.lost_races;
        requests += st.requests;
    }
    let blocks = server.objects("ipblocks").len();
    println!(
        "1,000 ADDs from {NODES} nodes at once, {}: {cas} compare-and-swap retries, {lost} lost \
         races, {:.2} API requests per ADD, {blocks} IPBlocks, {:.2} s",
        if spread {
            "each node starting at its own place"
        } else {
            "all nodes starting at one place"
        },
        requests as f64 / 1000.0,
        elapsed.as_secs_f64()
    );
}

fn rss_mib() -> f64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: f64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0.0);
    pages * 4096.0 / (1 << 20) as f64
}

/// 3. The heap a store retains for 100,000 claims.
fn memory() {
    const CLAIMS: usize = 100_000;
    let server = ApiServer::new();
    let mut blocks: std::collections::BTreeMap<String, serde_json::Map<String, serde_json::Value>> =
        Default::default();
    for i in 0..CLAIMS {
        let address = std::net::IpAddr::from(std::net::Ipv4Addr::from(
            u32::from_be_bytes([10, 8, 0, 0]) + i as u32,
        ));
        // Realistic sizes: a 64-hex container id, a UUID, a ReplicaSet pod's name.
        let claim = json!({
            "pool": "default-v4", "network": "underlay",
            "containerId": format!("{:064x}", seed_of(&i) as u128 * 0x9e37_79b9_7f4a_7c15),
            "interface": "eth0", "namespace": "shop", "pod": format!("web-7d9f8c6b5-{i:05}"),
            "uid": format!("6f1c2d3e-{:04x}-4000-8000-{:012x}", i % 65536, i),
            "ownerKind": "Deployment", "ownerName": "web", "updatedAt": 1_795_430_000u64 + i as u64,
        });
        blocks
            .entry(block_name(&block_of(address)))
            .or_default()
            .insert(address.to_string(), claim);
    }
    let count = blocks.len();
    for (name, claims) in blocks {
        let cidr = name
            .trim_start_matches("v4-")
            .rsplitn(2, '-')
            .collect::<Vec<_>>();
        let cidr = format!("{}/{}", cidr[1].replace('-', "."), cidr[0]);
        server.insert(
            "ipblocks",
            json!({"apiVersion": "allot.dev/v1alpha1", "kind": "IPBlock",
                   "metadata": {"name": name}, "spec": {"cidr": cidr, "claims": claims}}),
        );
    }
    let sizes: Vec<usize> = server
        .objects("ipblocks")
        .iter()
        .map(|o| o.to_string().len())
        .collect();
    let before = LIVE.load(Ordering::Relaxed);
    let rss_before = rss_mib();
    let t = Instant::now();
    let store = kube_store(&server, 0);
    while store.stats().claims < CLAIMS {
        std::thread::sleep(Duration::from_millis(10));
    }
    let opened = t.elapsed();
    std::thread::sleep(Duration::from_millis(200));
    let retained = LIVE.load(Ordering::Relaxed) - before;
    println!(
        "{CLAIMS} claims in {count} IPBlocks (JSON {:.1} KiB each, {:.1} KiB at most): a store \
         lists and indexes them in {:.2} s and keeps {:.1} MiB of heap ({:.0} bytes per claim; \
         process RSS {:.0} → {:.0} MiB, the test server's copy included)",
        sizes.iter().sum::<usize>() as f64 / sizes.len() as f64 / 1024.0,
        *sizes.iter().max().unwrap_or(&0) as f64 / 1024.0,
        opened.as_secs_f64(),
        retained as f64 / (1 << 20) as f64,
        retained as f64 / CLAIMS as f64,
        rss_before,
        rss_mib(),
    );
    drop(store);
}

fn main() {
    // `cargo bench … -- memory` runs one part (objects, conflicts, memory).
    let only: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let run = |part: &str| only.is_empty() || only.iter().any(|o| o == part);
    if run("objects") {
        objects("10.0.0.0/14");
        objects("10.0.0.0/12");
    }
    if run("conflicts") {
        conflicts(true);
        conflicts(false);
    }
    if run("memory") {
        memory();
    }
}
