//! The node agent's memory in cluster mode, per 100,000 claims: two agents (`--kubernetes`) on
//! one cluster, one while its IPBlocks hold no claim and one once they hold
//! `ALLOT_BENCH_CLAIMS` claims (default 100,000, made by other nodes); the difference of their
//! resident sets is what the claims cost the agent (the store's mirror and the engine's
//! per-pool indexes). Measured on the in-memory API server over loopback HTTP and, in the same
//! run, on a real kube-apiserver (`allot_lab::LoopbackControlPlane`, built by
//! `scripts/setup.sh`; skipped with a line when its binaries are not there).
//!
//! `cargo bench -p allot-e2e --bench kube_agent` (after a release build; no root needed).

use std::net::{IpAddr, Ipv4Addr};
use std::path::Path;
use std::time::{Duration, Instant};

use allot_e2e::Agent;
use allot_lab::{LoopbackControlPlane, LoopbackOptions};
use allot_test_apiserver::ApiServer;
use serde_json::{Map, Value, json};

const NODE: &str = "node-bench";

fn claims_wanted() -> usize {
    std::env::var("ALLOT_BENCH_CLAIMS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100_000)
}

/// The one /14 pool every claim is of.
fn pool() -> Value {
    json!({"apiVersion": "allot.dev/v1alpha1", "kind": "IPPool",
           "metadata": {"name": "big"},
           "spec": {"subnet": "10.64.0.0/14", "gateway": "10.64.0.1", "default": true}})
}

/// `claims` claims in full blocks, made by pods of 40 other nodes (realistic values: 64-hex
/// container IDs, UUIDs, ReplicaSet pod names).
fn blocks(claims: usize) -> Vec<Value> {
    let base = u32::from(Ipv4Addr::new(10, 64, 0, 64));
    let mut out = Vec::new();
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
        out.push(
            json!({"apiVersion": "allot.dev/v1alpha1", "kind": "IPBlock",
               "metadata": {"name": format!("v4-{}-{}-{}-{}-26", a[0], a[1], a[2], a[3])},
               "spec": {"cidr": format!("{}/26", Ipv4Addr::from(first)),
                        "node": format!("node-{}", block % 40), "claims": map}}),
        );
    }
    out
}

/// A size the kernel reports for the agent's process (`VmRSS:`, `VmHWM:`), in MiB.
fn status_mib(pid: u32, field: &str) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kib: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap();
    kib / 1024.0
}

/// The agent's resident set, read once it has settled (three equal readings 500 ms apart).
fn rss_mib(agent: &Agent) -> f64 {
    let pid = agent.pid().expect("running");
    let read = || status_mib(pid, "VmRSS:");
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

/// Starts an agent on the cluster of `kubeconfig` holding `n` claims, prints and returns its
/// settled resident set.
fn measure(server: &str, kubeconfig: &Path, n: usize, blocks: usize) -> f64 {
    let started = Instant::now();
    let agent = Agent::start_on_cluster(kubeconfig, NODE, &[]);
    let ready = started.elapsed();
    let usage = agent.status().pools;
    let held = usage.iter().map(|p| p.total - p.free).sum::<u64>();
    assert_eq!(held as usize, n, "the agent sees every claim");
    let rss = rss_mib(&agent);
    // The highest resident set since start: what a memory limit must allow.
    let peak = status_mib(agent.pid().expect("running"), "VmHWM:");
    println!(
        "{server}: {n:>7} claims in {blocks:>5} IPBlocks: agent ready in {:>6.0} ms, resident \
         {rss:>6.1} MiB (peak {peak:>6.1} MiB)",
        ready.as_secs_f64() * 1e3
    );
    rss
}

fn per_100k(server: &str, empty: f64, full: f64, claims: usize) -> f64 {
    let per = (full - empty) * 100_000.0 / claims as f64;
    println!("{server}: agent memory per 100,000 claims: {per:.1} MiB (goal <= 50 MB)");
    per
}

fn main() {
    let claims = claims_wanted();
    let objects = blocks(claims);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();

    let name = "the in-memory API server";
    let mut measured = Vec::new();
    for n in [0, claims] {
        let server = ApiServer::new();
        let addr = runtime
            .block_on(server.serve("127.0.0.1:0".parse().unwrap()))
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let kubeconfig = dir.path().join("kubeconfig");
        std::fs::write(
            &kubeconfig,
            ApiServer::kubeconfig(&format!("http://{addr}")),
        )
        .unwrap();
        server.insert("ippools", pool());
        let written = if n == 0 { &[][..] } else { &objects[..] };
        for o in written {
            server.insert("ipblocks", o.clone());
        }
        measured.push(measure(name, &kubeconfig, n, written.len()));
    }
    let in_memory = per_100k(name, measured[0], measured[1], claims);

    let plane = match LoopbackControlPlane::start(LoopbackOptions::default()) {
        Ok(p) => p,
        Err(e) => {
            println!("a real kube-apiserver: skipped ({e:#}); run scripts/setup.sh");
            return;
        }
    };
    let name = "a real kube-apiserver (etcd 3.6, Kubernetes 1.35)";
    plane.apply_crds(&allot_k8s::crds()).unwrap();
    plane.create("ippools", pool()).unwrap();
    let empty = measure(name, plane.kubeconfig(), 0, 0);
    let t = Instant::now();
    for o in &objects {
        plane.create("ipblocks", o.clone()).unwrap();
    }
    println!(
        "{name}: {} IPBlocks created in {:.1} s",
        objects.len(),
        t.elapsed().as_secs_f64()
    );
    let full = measure(name, plane.kubeconfig(), claims, objects.len());
    let real = per_100k(name, empty, full, claims);
    println!("real / in-memory: {:.2}", real / in_memory);
}
