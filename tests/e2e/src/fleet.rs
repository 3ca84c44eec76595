//! Several agents ("nodes") sharing one claim store, and many pods arriving at once through the
//! `allot` plugin, spread over them: the etcd stress test and benchmark.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::{
    Agent, Attachment, Cni, CniOutput, Lab, Netns, allot_ipam, bridge_conf, http_get, http_post,
};

pub struct Fleet {
    pub lab: Lab,
    pub others: Vec<Agent>,
    confs: Vec<Value>,
    sockets: Vec<PathBuf>,
    netns: Arc<Netns>,
}

impl Fleet {
    /// `agents` agents with `flags` (e.g. `--store etcd://…`) on the pool documents `pools`,
    /// whose network configs ask for `pool`. `None` when this machine cannot run e2e tests.
    pub fn start(
        test: &str,
        agents: usize,
        pools: &str,
        pool: &str,
        flags: &[(&str, &str)],
    ) -> Option<Fleet> {
        let lab = Lab::with_flags(test, pools, flags)?;
        let others: Vec<Agent> = (1..agents)
            .map(|_| Agent::start_sharing(&lab.agent))
            .collect();
        let sockets: Vec<PathBuf> = std::iter::once(lab.agent.socket())
            .chain(others.iter().map(Agent::socket))
            .collect();
        let confs = sockets
            .iter()
            .map(|s| {
                bridge_conf(
                    "1.0.0",
                    &lab.network,
                    &lab.bridge,
                    allot_ipam(s, &[pool], &[]),
                )
            })
            .collect();
        Some(Fleet {
            lab,
            others,
            confs,
            sockets,
            netns: Arc::new(Netns::new()),
        })
    }

    /// `n` pods (attachments in one shared namespace: the IPAM plugin does not enter it).
    pub fn pods(&self, n: usize) -> Vec<Attachment> {
        (0..n)
            .map(|i| Attachment::in_netns(&self.netns, &format!("pod-{i}")))
            .collect()
    }

    /// Runs `command` for every pod, `parallel` at a time, pod `i` through agent `i % agents`.
    /// Returns the outputs in pod order and the wall-clock time.
    pub fn run(
        &self,
        command: &str,
        pods: &[Attachment],
        parallel: usize,
    ) -> (Vec<CniOutput>, Duration) {
        in_parallel(pods.len(), parallel, |i| {
            let conf = &self.confs[i % self.confs.len()];
            // Spawned from here, not entering the lab's host namespace: the IPAM plugin only
            // talks to its agent's socket, and a spawn without `setns` is a cheap vfork where
            // entering one forks the whole (large) test process.
            let call = Cni::new(&self.lab.plugins, "allot", command, &conf.to_string());
            call.attachment(&pods[i]).run(None)
        })
    }

    /// `path` (`/v1/add`, `/v1/del`) straight to the agents' API for every pod, `parallel` at a
    /// time, without a plugin process: what the agents cost without process starts. Returns
    /// the per-request latencies (sorted) and the wall-clock time; panics on a failure.
    pub fn run_api(
        &self,
        path: &str,
        pods: &[Attachment],
        parallel: usize,
    ) -> (Vec<Duration>, Duration) {
        let (mut latencies, elapsed) = in_parallel(pods.len(), parallel, |i| {
            let pod = &pods[i];
            let body = if path == allot_api::ADD {
                serde_json::json!({
                    "containerId": pod.container_id,
                    "ifName": pod.ifname,
                    "netns": pod.netns.path(),
                    "network": self.lab.network,
                    "defaultIpv4Pools": self.confs[0]["ipam"]["default_ipv4_ippool"],
                    "pod": {"namespace": pod.namespace, "name": pod.name, "uid": pod.uid},
                })
            } else {
                serde_json::json!({
                    "containerId": pod.container_id,
                    "ifName": pod.ifname,
                })
            };
            let socket = &self.sockets[i % self.sockets.len()];
            let t = Instant::now();
            let (code, answer) = http_post(socket, path, &body.to_string()).expect("agent API");
            assert_eq!(code, 200, "{path} for pod {i}: {answer}");
            t.elapsed()
        });
        latencies.sort();
        (latencies, elapsed)
    }

    /// Races for addresses the agents lost to each other so far (`allot_lost_races_total`).
    pub fn lost_races(&self) -> u64 {
        self.sockets
            .iter()
            .filter_map(|s| http_get(s, "/metrics").ok())
            .filter_map(|(_, text)| {
                text.lines()
                    .find(|l| l.starts_with("allot_lost_races_total "))
                    .and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
            })
            .sum::<f64>() as u64
    }
}

/// Two agents on the lab's store sharing a pool of six addresses named `pool`: three ADDs
/// through the lab's agent, three through a second one once it has followed the first three, a
/// seventh refused as exhausted (CNI code 100), and the first agent following until it sees the
/// pool full. Returns the six addresses handed out (`ADDRESS/LEN`), all distinct.
pub fn two_agents_share_six(lab: &Lab, pool: &str, wait: Duration) -> BTreeSet<String> {
    let other = Agent::start_sharing(&lab.agent);
    let conf = lab.bridge_conf(&[pool], &[]);
    let other_conf = lab.bridge_conf_via(&other.socket(), &[pool], &[]);
    let mut seen = BTreeSet::new();
    for name in ["a1", "a2", "a3"] {
        seen.insert(lab.bridge_add(&Attachment::new(name), &conf).ip());
    }
    let added = Instant::now();
    lab.eventually("the other agent sees 3 free", wait, || {
        other.pool_counts(pool) == (6, 3)
    });
    eprintln!("the other agent followed 3 claims in {:?}", added.elapsed());
    for name in ["b1", "b2", "b3"] {
        seen.insert(lab.bridge_add(&Attachment::new(name), &other_conf).ip());
    }
    assert_eq!(seen.len(), 6, "six distinct addresses: {seen:?}");
    lab.cni("allot", "ADD", &Attachment::new("b4"), &other_conf)
        .expect_err(&[100]);
    lab.eventually("the first agent sees the pool exhausted", wait, || {
        lab.agent.pool_counts(pool) == (6, 0)
    });
    seen
}

/// `work(i)` for every `i` below `n`, on `parallel` threads taking the next index as they
/// finish: the results in index order, and the wall-clock time.
fn in_parallel<T: Send>(
    n: usize,
    parallel: usize,
    work: impl Fn(usize) -> T + Sync,
) -> (Vec<T>, Duration) {
    let next = AtomicUsize::new(0);
    let started = Instant::now();
    let mut done: Vec<(usize, T)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..parallel)
            .map(|_| {
                s.spawn(|| {
                    let mut mine = Vec::new();
                    loop {
                        let i = next.fetch_add(1, Ordering::SeqCst);
                        if i >= n {
                            return mine;
                        }
                        mine.push((i, work(i)));
                    }
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect()
    });
    let elapsed = started.elapsed();
    done.sort_by_key(|(i, _)| *i);
    (done.into_iter().map(|(_, t)| t).collect(), elapsed)
}

/// The `p` quantile of sorted durations.
pub fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let n = sorted.len();
    sorted[((n as f64 * p).ceil() as usize).clamp(1, n) - 1]
}
