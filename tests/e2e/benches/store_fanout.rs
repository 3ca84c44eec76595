//! What one claim write costs as the cluster grows (issue 40, items 1 and 3): N simulated
//! agents, each a Kubernetes claim store of its own (its own client, watch and mirror, as on a
//! node of its own) on a real kube-apiserver, each writing `ALLOT_BENCH_WRITES` (default 5)
//! claims in a pool of its own (a region of its own, as pools with node affinity are). Two runs
//! per N (`ALLOT_BENCH_AGENTS`, default `10,100,300`):
//!
//! - **scoped**: each store follows its pool's region, as agents now do;
//! - **every block**: each store follows every block, as agents did before, and as every agent
//!   still follows a pool every node uses: every write reaches every agent.
//!
//! Reported: watch events each agent received (mean and max), events per claim write across
//! all agents, the API server's CPU milliseconds per claim write (the write plus the fan-out of
//! its watch events), and how long until every event was delivered (waited for, up to 90 s);
//! then every agent restarted (its store dropped and opened again, ten at a time, as the bench
//! opens them): how long, the claims listed in all, and the API server's CPU seconds.
//! Contention for shared blocks is `store_rates`' subject, not this one's.
//!
//! `cargo bench -p allot-e2e --bench store_fanout` (no root needed; needs the control plane
//! `scripts/setup.sh` builds; results: docs/benchmarks.md).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use allot_core::block::{BlockScope, region_of};
use allot_core::store::{Attachment, Claim, PodRef, Store};
use allot_lab::{LoopbackControlPlane, LoopbackOptions};
use allot_store::{KubeConfig, KubeStore};

#[path = "store_rates/measure.rs"]
#[allow(dead_code)]
mod measure;

use measure::CpuClock;

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The first address of agent `i`'s region (a /20 each, from 10.0.0.0).
fn region_base(i: usize) -> u32 {
    u32::from(std::net::Ipv4Addr::new(10, 0, 0, 0)) + ((i as u32) << 12)
}

#[derive(Clone, Copy, PartialEq)]
enum Run {
    Scoped,
    EveryBlock,
}

impl Run {
    fn name(self) -> &'static str {
        match self {
            Run::Scoped => "scoped to its pool's region",
            Run::EveryBlock => "every block (before; a pool every node uses)",
        }
    }

    /// The blocks agent `i` follows.
    fn scope(self, i: usize) -> BlockScope {
        match self {
            Run::EveryBlock => BlockScope::All,
            Run::Scoped => BlockScope::Regions(
                [region_of(std::net::Ipv4Addr::from(region_base(i)).into())].into(),
            ),
        }
    }

    /// Events each agent should receive: its own writes' versions, or everyone's.
    fn expected(self, n: usize, writes: usize) -> u64 {
        match self {
            Run::Scoped => writes as u64,
            Run::EveryBlock => (n * writes) as u64,
        }
    }
}

fn claim(i: usize, k: usize) -> Claim {
    Claim {
        address: std::net::Ipv4Addr::from(region_base(i) + k as u32 + 1).into(),
        pool: format!("pool-{i}"),
        network: "bench".into(),
        attachment: Some(Attachment {
            container_id: format!("c-{i}-{k}"),
            interface: "eth0".into(),
        }),
        pod: PodRef {
            namespace: "bench".into(),
            name: format!("pod-{i}-{k}"),
            uid: format!("u-{i}-{k}"),
            ..PodRef::default()
        },
        node: format!("node-{i}"),
        updated_at: 1,
    }
}

fn open(plane: &LoopbackControlPlane, n: usize, run: Run) -> Vec<Arc<KubeStore>> {
    let kubeconfig = plane.kubeconfig().to_path_buf();
    measure::open_stores(n, |i| {
        KubeStore::connect(&KubeConfig {
            kubeconfig: Some(kubeconfig.clone()),
            node: Some(format!("node-{i}")),
            timeout: Some(Duration::from_secs(30)),
            scope: run.scope(i),
        })
    })
}

fn one_run(plane: &LoopbackControlPlane, n: usize, writes: usize, run: Run) {
    plane
        .delete_all("allot.dev/v1alpha1", "ipblocks")
        .expect("every IPBlock deleted");
    let servers: Vec<(String, u32)> = measure::servers_of(plane.dir())
        .into_iter()
        .filter(|(name, _)| name == "kube-apiserver")
        .collect();
    let stores = open(plane, n, run);
    let before: Vec<u64> = stores.iter().map(|s| s.stats().watch_events).collect();
    let cpu = CpuClock::start(&servers);
    let started = Instant::now();
    // Every agent writes at once, each its claims one after another; a write that fails (the
    // API server too busy to answer within the store's budget) is counted, not retried.
    let failed = AtomicUsize::new(0);
    std::thread::scope(|scope| {
        for (i, store) in stores.iter().enumerate() {
            let failed = &failed;
            scope.spawn(move || {
                for k in 0..writes {
                    if store.claim(&[claim(i, k)]).is_err() {
                        failed.fetch_add(1, Ordering::Relaxed);
                    }
                }
            });
        }
    });
    let written = started.elapsed();
    let failed = failed.into_inner();
    // Until every event is in: every write's for each store (every block), or its own (scoped);
    // a failed write may have landed, so past that, until nothing arrives for 3 s.
    let landed = n * writes - failed;
    let expected = match run {
        Run::Scoped => (landed / n) as u64,
        Run::EveryBlock => landed as u64,
    };
    let deadline = Instant::now() + Duration::from_secs(90);
    let (mut last, mut quiet_since) = (0, Instant::now());
    let received = loop {
        let received: Vec<u64> = stores
            .iter()
            .zip(&before)
            .map(|(s, b)| s.stats().watch_events - b)
            .collect();
        let total: u64 = received.iter().sum();
        if total != last {
            (last, quiet_since) = (total, Instant::now());
        }
        let all_in = failed == 0 && received.iter().all(|&r| r >= run.expected(n, writes));
        if all_in
            || (failed > 0 && quiet_since.elapsed() > Duration::from_secs(3))
            || Instant::now() > deadline
        {
            break received;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let delivered = started.elapsed();
    let cpu = cpu.read();
    let api_cpu = cpu.servers.first().map_or(0.0, |(_, c)| *c) * delivered.as_secs_f64();
    let total: u64 = received.iter().sum();
    let claims = (n * writes) as f64;
    println!(
        "N={n:>4}  {:<46} events per agent: mean {:>7.1}, max {:>6} (expected {expected:>6}); \
         events per claim write {:>7.1}; API server {:>6.2} ms CPU per claim write; writes {:.2} s \
         ({failed} failed), all delivered {:.2} s",
        run.name(),
        total as f64 / n as f64,
        received.iter().max().unwrap_or(&0),
        total as f64 / claims,
        api_cpu * 1000.0 / claims,
        written.as_secs_f64(),
        delivered.as_secs_f64(),
    );
    // Every agent restarted (a DaemonSet rollout): the stores dropped and opened again, ten at
    // a time, each listing what its scope holds now.
    drop(stores);
    let cpu = CpuClock::start(&servers);
    let started = Instant::now();
    let stores = open(plane, n, run);
    let reopened = started.elapsed();
    let api_cpu = cpu.read().servers.first().map_or(0.0, |(_, c)| *c) * reopened.as_secs_f64();
    let listed: usize = stores.iter().map(|s| s.stats().claims).sum();
    println!(
        "N={n:>4}  {:<46} every agent restarted: {:.2} s, {listed} claims listed in all, API \
         server {api_cpu:.2} s CPU",
        run.name(),
        reopened.as_secs_f64(),
    );
    drop(stores);
}

fn main() {
    let writes = env_or("ALLOT_BENCH_WRITES", 5usize);
    let counts: Vec<usize> = std::env::var("ALLOT_BENCH_AGENTS")
        .unwrap_or_else(|_| "10,100,300".into())
        .split(',')
        .filter_map(|n| n.trim().parse().ok())
        .collect();
    println!(
        "store_fanout: N = {counts:?} agents, {writes} claim writes each; {} cores",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    let options = LoopbackOptions {
        admission_webhooks: false,
        ..LoopbackOptions::default()
    };
    let plane = match LoopbackControlPlane::start(options) {
        Ok(plane) => plane,
        Err(e) => {
            println!("store_fanout: skipped ({e:#}); run scripts/setup.sh");
            return;
        }
    };
    plane.apply_crds(&allot_k8s::crds()).unwrap();
    for &n in &counts {
        for run in [Run::Scoped, Run::EveryBlock] {
            one_run(&plane, n, writes, run);
        }
    }
}
