//! What users feel at cluster scale, allot beside its peers and beside the floor, on one
//! machine: for each IPAM of `ALLOT_BENCH_IPAMS` (`host-local,allot,whereabouts,calico`), one
//! after another, a fresh lab cluster (`tests/lab`: real etcd, kube-apiserver,
//! controller-manager and scheduler, a kubelet stand-in per node calling the node's CNI
//! configuration as containerd does) of `ALLOT_BENCH_NODES` nodes (10), so that no IPAM runs
//! beside another's leftovers (its CRDs, its processes, its reservations in the nodes' files);
//! each lab is taken down before the next starts (one lab per machine), and its start time is
//! printed. In each, the same phases behind the same bridge plugin:
//!
//! 1. `create`: `ALLOT_BENCH_DEPLOYMENTS` (10) Deployments totalling `ALLOT_BENCH_PODS` (1,000)
//!    pods created at once; the time from the creation requests until every pod's status has
//!    an address (each pod's time too, and each CNI ADD's duration as the node measured it),
//!    from a pool of 65,000 addresses; then `delete`: the Deployments deleted, until every pod
//!    is gone (its DEL done);
//! 2. `exact`: the same from a pool of exactly `ALLOT_BENCH_PODS` addresses;
//! 3. `scale-0` and `scale-up`: the Deployments scaled to 0 (release), then back (reuse);
//! 4. `churn`: `ALLOT_BENCH_CYCLES` (100) create/address/delete cycles of one pod of the same
//!    name while the Deployments allocate the pool's other addresses (pods - 1);
//!
//! with, per phase, the API server's requests per pod (its `apiserver_request_total`, and its
//! audit log grouped by user: the IPAM's own components, the rest), the CPU time of the IPAM's
//! processes on each node and of the control plane (from `/proc`); per IPAM, its processes'
//! resident memory and the load its watches put on the API server (watches held, what each
//! of its processes lists at start), extrapolated to 1,000 nodes; and, sampled every second
//! through every phase from the nodes' CNI result caches, any address configured in two pods'
//! sandboxes at once (the peers' known failure, `tests/cluster/tests/cluster/peer_failures.rs`).
//!
//! host-local, CNI's own plugin (Debian's, as the lab links it into every node's
//! `/opt/cni/bin`), is the floor: what an ADD and a DEL cost with nothing behind them. It
//! coordinates nothing: every node is given the whole pool's range, so an address may answer
//! on two nodes at once (each node's bridge is node-local, so those pods never meet; the
//! sampler looks for two sandboxes of one node only), and in the exact phases a node never
//! runs short (it takes about pods / nodes of the pool's addresses): they measure no
//! exhaustion for it, only release and reuse on each node. It installs nothing, runs no
//! process and asks the API server nothing: not a correct cluster IPAM, the cost below which
//! none gets. The report gives every phase of allot against each peer as ratios, and every
//! phase of every IPAM as ratios to host-local's (time, per-pod p50/p95/p99, ADD p50, API
//! requests per pod), or says why there are none (host-local not run).
//!
//! A phase not done within `ALLOT_BENCH_LIMIT_SECONDS` (900) is stopped and reported with how
//! many pods it addressed. A peer whose binaries are not built is skipped with a line.
//!
//! `cargo bench -p allot-e2e --bench cluster_scale` as root, after `cargo build --release`
//! and `make policies` (the lab's allot image) and `scripts/build-upstream.sh` (`--peers` for
//! the peers). The lab's lock makes each lab wait for another lab on the machine.

#[path = "cluster_scale/ipams.rs"]
mod ipams;
#[path = "cluster_scale/measure.rs"]
mod measure;
#[path = "cluster_scale/phases.rs"]
mod phases;
#[path = "cluster_scale/report.rs"]
mod report;
#[path = "cluster_scale/start_load.rs"]
mod start_load;

use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::time::Duration;

use allot_cluster_tests::Suite;
use ipams::{Ipam, Pool};

/// What to run, from the environment.
#[derive(Clone, Debug)]
pub struct Config {
    pub nodes: usize,
    pub pods: usize,
    pub deployments: usize,
    pub cycles: usize,
    pub ipams: Vec<Ipam>,
    pub limit: Duration,
}

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

impl Config {
    fn from_env() -> Config {
        let ipams = std::env::var("ALLOT_BENCH_IPAMS")
            .unwrap_or_else(|_| "host-local,allot,whereabouts,calico".into())
            .split(',')
            .filter_map(|n| {
                let ipam = Ipam::parse(n);
                if ipam.is_none() {
                    println!("ALLOT_BENCH_IPAMS: {n:?} is not an IPAM of this benchmark");
                }
                ipam
            })
            .collect();
        Config {
            nodes: env_or("ALLOT_BENCH_NODES", 10),
            pods: env_or("ALLOT_BENCH_PODS", 1000),
            deployments: env_or("ALLOT_BENCH_DEPLOYMENTS", 10).max(1),
            cycles: env_or("ALLOT_BENCH_CYCLES", 100),
            ipams,
            limit: Duration::from_secs(env_or("ALLOT_BENCH_LIMIT_SECONDS", 900) as u64),
        }
    }

    /// The command that reproduces this run.
    pub fn command(&self) -> String {
        let ipams: Vec<&str> = self.ipams.iter().map(|i| i.name()).collect();
        format!(
            "ALLOT_BENCH_NODES={} ALLOT_BENCH_PODS={} ALLOT_BENCH_DEPLOYMENTS={} \
             ALLOT_BENCH_CYCLES={} ALLOT_BENCH_IPAMS={} ALLOT_BENCH_LIMIT_SECONDS={} \
             cargo bench -p allot-e2e --bench cluster_scale",
            self.nodes,
            self.pods,
            self.deployments,
            self.cycles,
            ipams.join(","),
            self.limit.as_secs()
        )
    }

    /// The pool much larger than the pods, and the pool of exactly as many addresses.
    pub fn pools(&self) -> (Pool, Pool) {
        (
            Pool::new("bench-large", Ipv4Addr::new(198, 18, 0, 0), 65_000),
            Pool::new(
                "bench-exact",
                Ipv4Addr::new(198, 19, 0, 0),
                self.pods as u32,
            ),
        )
    }
}

fn main() {
    let config = Config::from_env();
    println!("{}", config.command());
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    // Interrupted, the lab is still taken down (dropped with `run`'s future).
    runtime.block_on(async {
        tokio::select! {
            () = run(config) => {}
            _ = tokio::signal::ctrl_c() => println!("interrupted: taking the lab down"),
        }
    });
}

async fn run(config: Config) {
    let mut ipams = Vec::new();
    for ipam in &config.ipams {
        match ipam.missing() {
            Some(why) => println!("{}: skipped: {why}", ipam.name()),
            None => ipams.push(*ipam),
        }
    }
    let image_dir = tempfile::tempdir().unwrap();
    let whereabouts_image = if ipams.contains(&Ipam::Whereabouts) {
        Some(ipams::whereabouts_image(image_dir.path()).expect("the Whereabouts image"))
    } else {
        None
    };
    let mut results = Vec::new();
    for ipam in ipams {
        println!("\n== {} ==", ipam.name());
        let image = whereabouts_image
            .clone()
            .filter(|_| ipam == Ipam::Whereabouts);
        let Some(s) = lab(&config, ipam, image).await else {
            return;
        };
        match phases::run_ipam(&s, &config, ipam).await {
            Ok(r) => results.push(r),
            Err(e) => println!("{}: failed: {e:#}", ipam.name()),
        }
        // One lab on the machine at a time: this one is down before the next starts.
        drop(s);
        // The tables so far, so that a run stopped early still tells what it measured.
        println!();
        report::print(&config, &results);
    }
}

/// A fresh lab for `ipam`, so that no IPAM runs beside another's leftovers (its CRDs, its
/// processes, its reservations in the nodes' files); with Whereabouts' image when given.
async fn lab(config: &Config, ipam: Ipam, whereabouts_image: Option<PathBuf>) -> Option<Suite> {
    let started = std::time::Instant::now();
    let s = Suite::own(
        &format!("cluster_scale-{}", ipam.name()),
        config.nodes,
        |o| {
            o.lock_wait = Duration::from_secs(3600);
            o.ready_timeout = Duration::from_secs(300);
            // Real nodes cost about 240 MiB each before their pods and a runc shim of about
            // 13 MiB per pod (docs/benchmarks.md): 1,000 pods on 10 nodes would take some 15 GiB
            // of this machine's 24 beside the control plane, and its two cores would measure
            // containerd rather than the IPAM. The scale comparison stays on the kubelet stand-in.
            o.node_kind = allot_lab::NodeKind::StandIn;
            if let Some(dir) = whereabouts_image {
                o.images.push((ipams::WHEREABOUTS_IMAGE.into(), dir));
            }
        },
    )
    .await?;
    println!(
        "{}: lab of {} nodes ready in {:.0} s (directory {})",
        ipam.name(),
        config.nodes,
        started.elapsed().as_secs_f64(),
        s.lab.info().dir.display()
    );
    Some(s)
}
