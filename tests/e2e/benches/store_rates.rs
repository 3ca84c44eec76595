//! The store alone at hyperscale rates (issue 40, item 4): the Kubernetes store and the etcd
//! store, each driven by N simulated agents at once, against the backend's own ceiling measured
//! in the same run with the same concurrency.
//!
//! Each agent is an engine over a store of its own (its own client, watch and mirror, as on a
//! node of its own) with two pools: a /16 every agent allocates from (contention) and a /24 of
//! its own (none). For `ALLOT_BENCH_SECONDS` (default 10) per run, each agent runs
//! `ALLOT_BENCH_CONCURRENCY` (default 4) closed loops of ADD, a hold of `ALLOT_BENCH_HOLD_MS`
//! (default 5), DEL. Reported per N (`ALLOT_BENCH_AGENTS`, default `1,10,50,100,200`): claims
//! per second, p50/p99 ADD latency, compare-and-swap conflicts (409) and lost races per claim,
//! errors, and the cores this process and the servers used.
//!
//! The ceilings, with the same clients and loops, each claim written, held and removed through
//! the backend's own client: for the API server, PUTs (replace on the resourceVersion read) of
//! an IPBlock as large as the agents' blocks were midway through their shared-pool run, a block
//! per loop (no contention) and one block for all (contention, retried on 409); for etcd, a
//! transaction creating a key under `create_revision == 0`, then its delete. The ratio column
//! divides each rate by the uncontended ceiling of the same backend and N.
//!
//! Backends: upstream etcd and kube-apiserver on loopback (`allot_lab::LoopbackControlPlane`,
//! built by `scripts/setup.sh`; skipped with a line when missing), and Debian's etcd for the
//! etcd store (`allot_store::etcd::testing::EtcdServer`). All of it shares this machine's cores.
//!
//! `cargo bench -p allot-e2e --bench store_rates` (no root needed; results: docs/benchmarks.md).

use std::time::Duration;

use allot_core::store::{Claim, PodRef, Store};
use allot_lab::{LoopbackControlPlane, LoopbackOptions};
use allot_store::etcd::testing::EtcdServer;
use allot_store::{EtcdConfig, EtcdStore, KubeConfig, KubeStore};

#[path = "store_rates/agents.rs"]
mod agents;
#[path = "store_rates/ceiling.rs"]
mod ceiling;
#[path = "store_rates/measure.rs"]
mod measure;

use agents::{Agent, SHARED, own_pool};
use measure::{CpuClock, Kind, Load, Row};

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn agent_counts() -> Vec<usize> {
    std::env::var("ALLOT_BENCH_AGENTS")
        .unwrap_or_else(|_| "1,10,50,100,200".into())
        .split(',')
        .filter_map(|n| n.trim().parse().ok())
        .collect()
}

/// The two allot runs (a shared pool, a pool per agent) on `agents`; `counters` reads the
/// stores' compare-and-swap conflicts and requests so far (where the store counts them),
/// `midway` is called halfway through each run.
fn allot_runs<S: Store + 'static>(
    backend: &'static str,
    agents: &[Agent<S>],
    counters: &dyn Fn() -> (u64, u64),
    midway: &(dyn Fn(&str) + Sync),
    servers: &[(String, u32)],
    load: &Load,
    rows: &mut Vec<Row>,
) {
    let n = agents.len();
    for (run, shared) in [
        ("allot, one shared pool", true),
        ("allot, a pool per agent", false),
    ] {
        let tag = if shared { "s" } else { "o" };
        let pool_of = |a| if shared { SHARED.into() } else { own_pool(a) };
        agents::warm_up(agents, pool_of, &format!("{tag}{n}"));
        let (lost, (cas, requests)) = (agents::lost_races(agents), counters());
        let cpu = CpuClock::start(servers);
        let (tally, elapsed) = std::thread::scope(|scope| {
            scope.spawn(|| {
                std::thread::sleep(load.seconds / 2);
                midway(tag);
            });
            agents::drive(agents, pool_of, load, &format!("{tag}{n}"))
        });
        let claims = tally.latencies.len().max(1) as f64;
        let mut row = Row::new(backend, n, run, Kind::Allot, tally, elapsed, cpu.read());
        let (cas_after, requests_after) = counters();
        row.conflicts = (cas_after - cas) as f64 / claims;
        row.requests = (requests_after > 0).then(|| (requests_after - requests) as f64 / claims);
        row.lost = (agents::lost_races(agents) - lost) as f64 / claims;
        row.print();
        rows.push(row);
    }
}

fn kubernetes(plane: &LoopbackControlPlane, n: usize, load: &Load, rows: &mut Vec<Row>) {
    let servers = measure::servers_of(plane.dir());
    let kubeconfig = plane.kubeconfig().to_path_buf();
    let stores = measure::open_stores(n, |i| {
        let config = KubeConfig {
            kubeconfig: Some(kubeconfig.clone()),
            node: Some(format!("node-{i}")),
            timeout: None,
            scope: Default::default(),
        };
        KubeStore::connect(&config)
    });
    let agents: Vec<_> = stores
        .iter()
        .enumerate()
        .map(|(i, s)| agents::agent(s.clone(), i))
        .collect();
    // The mean size of a block's spec holding claims, midway through each run.
    let sizes = std::sync::Mutex::new(Vec::new());
    let midway = |tag: &str| {
        let blocks = plane.list("allot.dev/v1alpha1", "ipblocks").unwrap();
        let written: Vec<usize> = blocks
            .iter()
            .filter(|b| {
                let some =
                    |field: &str| b["spec"][field].as_object().is_some_and(|c| !c.is_empty());
                some("claims") || some("released")
            })
            .map(|b| b["spec"].to_string().len())
            .collect();
        let mean = written.iter().sum::<usize>() / written.len().max(1);
        println!(
            "kubernetes N={n} ({tag}): midway, {} of {} IPBlocks hold claims or releases, their \
             specs {mean} bytes on average",
            written.len(),
            blocks.len()
        );
        sizes.lock().unwrap().push(mean);
    };
    let counters = || {
        let stats: Vec<_> = stores.iter().map(|s| s.stats()).collect();
        (
            stats.iter().map(|s| s.conflicts).sum(),
            stats.iter().map(|s| s.requests).sum(),
        )
    };
    allot_runs(
        "kubernetes",
        &agents,
        &counters,
        &midway,
        &servers,
        load,
        rows,
    );
    drop(agents);
    drop(stores);
    // As large as the shared pool's blocks were (at least one claim's worth).
    let spec_bytes = sizes.lock().unwrap().first().copied().unwrap_or(0).max(400);
    for (run, kind) in [
        (
            "ceiling: PUT add, PUT remove; a block per loop",
            Kind::Ceiling,
        ),
        (
            "ceiling: PUT add, PUT remove; one block for all",
            Kind::ContendedCeiling,
        ),
    ] {
        let cpu = CpuClock::start(&servers);
        let shared = kind == Kind::ContendedCeiling;
        let (tally, elapsed) = ceiling::kube(plane.kubeconfig(), n, load, shared, spec_bytes);
        let run = format!("{run} ({spec_bytes} B spec)");
        let row = Row::new("kubernetes", n, &run, kind, tally, elapsed, cpu.read());
        row.print();
        rows.push(row);
    }
}

fn etcd(server: &EtcdServer, n: usize, load: &Load, rows: &mut Vec<Row>) {
    let servers = measure::servers_of(server.data_dir());
    let config = EtcdConfig::from_url(&server.url()).unwrap();
    let stores = measure::open_stores(n, |_| EtcdStore::connect(&config));
    let agents: Vec<_> = stores
        .iter()
        .enumerate()
        .map(|(i, s)| agents::agent(s.clone(), i))
        .collect();
    // The etcd store counts neither: a lost transaction is a lost race, which the engine counts.
    allot_runs(
        "etcd",
        &agents,
        &|| (0, 0),
        &|_: &str| {},
        &servers,
        load,
        rows,
    );
    drop(agents);
    drop(stores);
    let value = allot_store::etcd::keys::encode(&Claim {
        address: "10.0.0.7".parse().unwrap(),
        pool: SHARED.into(),
        network: "bench".into(),
        attachment: Some(allot_core::store::Attachment {
            container_id: format!("{:064x}", 7u128 * 0x9e37_79b9_7f4a_7c15),
            interface: "eth0".into(),
        }),
        pod: PodRef {
            namespace: "team-7".into(),
            name: "web-7-7d9f8c6b5-x2x4z".into(),
            uid: "00000000-0000-4000-8000-000000000007".into(),
            owner_kind: Some("Deployment".into()),
            owner_name: Some("web-7".into()),
        },
        node: "node-7".into(),
        updated_at: 1_700_000_007,
    });
    let cpu = CpuClock::start(&servers);
    let (tally, elapsed) = ceiling::etcd(&server.endpoint(), n, load, &value);
    let run = format!(
        "ceiling: txn create (own key per loop, {} B value), delete",
        value.len()
    );
    let row = Row::new("etcd", n, &run, Kind::Ceiling, tally, elapsed, cpu.read());
    row.print();
    rows.push(row);
}

fn main() {
    let load = Load {
        seconds: Duration::from_secs(env_or("ALLOT_BENCH_SECONDS", 10)),
        per_agent: env_or("ALLOT_BENCH_CONCURRENCY", 4),
        hold: Duration::from_millis(env_or("ALLOT_BENCH_HOLD_MS", 5)),
    };
    let counts = agent_counts();
    println!(
        "store_rates: N = {counts:?} agents, {} closed loops each (ADD, hold {} ms, DEL), {} s \
         per run; {} cores, {:.1} GiB memory",
        load.per_agent,
        load.hold.as_millis(),
        load.seconds.as_secs(),
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        memory_gib()
    );
    let mut rows = Vec::new();

    let options = LoopbackOptions {
        admission_webhooks: false,
        ..LoopbackOptions::default()
    };
    match LoopbackControlPlane::start(options) {
        Ok(plane) => {
            plane.apply_crds(&allot_k8s::crds()).unwrap();
            for &n in &counts {
                kubernetes(&plane, n, &load, &mut rows);
            }
        }
        Err(e) => println!("kubernetes: skipped ({e:#}); run scripts/setup.sh"),
    }

    if std::process::Command::new("etcd")
        .arg("--version")
        .output()
        .is_ok()
    {
        let server = EtcdServer::start();
        for &n in &counts {
            etcd(&server, n, &load, &mut rows);
        }
    } else {
        println!("etcd: skipped (no etcd on PATH); run scripts/setup.sh");
    }

    println!("\n{}", measure::table(&mut rows));
}

/// The machine's memory, from /proc/meminfo.
fn memory_gib() -> f64 {
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
        .unwrap_or(0.0)
        / (1 << 20) as f64
}
