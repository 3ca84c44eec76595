//! The node agent's memory in cluster mode, per 100,000 claims: two agents (`--kubernetes`)
//! on the in-memory API server over loopback HTTP, one on a cluster whose IPBlocks hold
//! `ALLOT_BENCH_CLAIMS` claims (default 100,000, made by other nodes) and one on an empty
//! cluster, measured in the same run; the difference of their resident sets is what the claims
//! cost the agent (the store's mirror and the engine's per-pool indexes).
//!
//! `cargo bench -p allot-e2e --bench kube_agent` (after a release build; no root needed).

use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};

use allot_e2e::Agent;
use allot_test_apiserver::ApiServer;
use serde_json::{Map, json};

const NODE: &str = "node-bench";

fn claims_wanted() -> usize {
    std::env::var("ALLOT_BENCH_CLAIMS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100_000)
}

/// An API server on a loopback port with one /14 pool and `claims` claims in full blocks,
/// made by pods of 40 other nodes; returns it with its kubeconfig.
fn cluster(runtime: &tokio::runtime::Runtime, claims: usize) -> (ApiServer, tempfile::TempDir) {
    let server = ApiServer::new();
    let addr = runtime
        .block_on(server.serve("127.0.0.1:0".parse().unwrap()))
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("kubeconfig"),
        ApiServer::kubeconfig(&format!("http://{addr}")),
    )
    .unwrap();
    server.insert(
        "ippools",
        json!({"apiVersion": "allot.dev/v1alpha1", "kind": "IPPool",
               "metadata": {"name": "big"},
               "spec": {"subnet": "10.64.0.0/14", "gateway": "10.64.0.1", "default": true}}),
    );
    let base = u32::from(Ipv4Addr::new(10, 64, 0, 64));
    for block in 0..claims.div_ceil(64) {
        let first = base + (block as u32) * 64;
        let mut map = Map::new();
        for i in 0..64usize.min(claims - block * 64) {
            let address = IpAddr::V4(Ipv4Addr::from(first + i as u32));
            let n = block * 64 + i;
            map.insert(
                address.to_string(),
                json!({
                    "pool": "big", "network": "underlay",
                    "containerId": format!("{:064x}", n as u128 * 0x9e37_79b9_7f4a_7c15),
                    "interface": "eth0", "namespace": format!("team-{}", n % 200),
                    "pod": format!("web-{n}-7d9f8c6b5-x2x4z"),
                    "uid": format!("00000000-0000-4000-8000-{n:012x}"),
                    "ownerKind": "Deployment", "ownerName": format!("web-{}", n % 5000),
                    "updatedAt": 1_700_000_000u64 + n as u64,
                }),
            );
        }
        let a = Ipv4Addr::from(first).octets();
        server.insert(
            "ipblocks",
            json!({"apiVersion": "allot.dev/v1alpha1", "kind": "IPBlock",
                   "metadata": {"name": format!("v4-{}-{}-{}-{}-26", a[0], a[1], a[2], a[3])},
                   "spec": {"cidr": format!("{}/26", Ipv4Addr::from(first)),
                            "node": format!("node-{}", block % 40), "claims": map}}),
        );
    }
    (server, dir)
}

/// The agent's resident set, read once it has settled (three equal readings 500 ms apart).
fn rss_mib(agent: &Agent) -> f64 {
    let pid = agent.pid().expect("running");
    let read = || {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        let kib: f64 = status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap();
        kib / 1024.0
    };
    let mut last = read();
    let mut same = 0;
    let deadline = Instant::now() + Duration::from_secs(30);
    while same < 3 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(500));
        let now = read();
        if (now - last).abs() < 0.5 {
            same += 1;
        } else {
            same = 0;
        }
        last = now;
    }
    last
}

fn main() {
    let claims = claims_wanted();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let mut measured = Vec::new();
    for n in [0, claims] {
        let (server, dir) = cluster(&runtime, n);
        let started = Instant::now();
        let agent = Agent::start_on_cluster(&dir.path().join("kubeconfig"), NODE, &[]);
        let ready = started.elapsed();
        let usage = agent.status().pools;
        let held = usage.iter().map(|p| p.total - p.free).sum::<u64>();
        assert_eq!(held as usize, n, "the agent sees every claim");
        let rss = rss_mib(&agent);
        println!(
            "{n:>7} claims in {:>5} IPBlocks: agent ready in {:>6.0} ms, resident {rss:>6.1} MiB",
            server.objects("ipblocks").len(),
            ready.as_secs_f64() * 1e3
        );
        measured.push(rss);
        drop(agent);
    }
    let per_100k = (measured[1] - measured[0]) * 100_000.0 / claims as f64;
    println!("agent memory per 100,000 claims: {per_100k:.1} MiB (goal <= 50 MB)");
}
