//! One IPAM through every phase, and what each phase cost.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use allot_cluster_tests::Suite;
use allot_k8s::openapi::api::apps::v1::Deployment;
use allot_k8s::openapi::api::core::v1::{Node, Pod};
use anyhow::{Context, Result};
use futures::StreamExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use serde_json::json;

use crate::Config;
use crate::ipams::{self, Ipam};
use crate::measure::{self, Add, ApiMetrics, AuditCursor, RequestCount};
use crate::start_load::{self, WatchLoad};

/// The label every benchmark pod carries.
const LABEL: &str = "allot-bench";

/// What one phase measured.
#[derive(Clone, Debug, Default)]
pub struct Phase {
    pub name: String,
    /// Pods the phase waits for (addressed, or gone).
    pub pods: usize,
    /// How many it saw (addressed, or gone).
    pub reached: usize,
    /// Seconds until all were, None when the time limit came first.
    pub seconds: Option<f64>,
    /// Each pod's seconds from the phase's request until it had an address.
    pub per_pod: Vec<f64>,
    pub adds: Vec<Add>,
    pub requests: f64,
    pub audit: RequestCount,
    pub cpu: Cpu,
    /// churn: each cycle's seconds from the create request until the pod had an address.
    pub cycles: Vec<f64>,
}

/// CPU seconds spent during a phase.
#[derive(Clone, Debug, Default)]
pub struct Cpu {
    /// The IPAM's processes on the nodes (agents, control loops), all nodes together.
    pub node_daemons: f64,
    /// The IPAM's cluster-wide processes (controllers).
    pub cluster: f64,
    /// The processes the stand-ins ran and reaped: CNI plugins (main plugin and IPAM plugin).
    pub plugins: f64,
    /// The stand-ins themselves (the harness's kubelets).
    pub stand_ins: f64,
    pub apiserver: f64,
    pub etcd: f64,
}

impl Cpu {
    fn minus(&self, before: &Cpu) -> Cpu {
        Cpu {
            node_daemons: self.node_daemons - before.node_daemons,
            cluster: self.cluster - before.cluster,
            plugins: self.plugins - before.plugins,
            stand_ins: self.stand_ins - before.stand_ins,
            apiserver: self.apiserver - before.apiserver,
            etcd: self.etcd - before.etcd,
        }
    }
}

/// Everything measured for one IPAM.
#[derive(Clone, Debug)]
pub struct IpamResult {
    pub ipam: Ipam,
    pub phases: Vec<Phase>,
    pub watch: WatchLoad,
    /// Resident MiB (VmRSS, VmHWM) of each of the IPAM's per-node processes at the end.
    pub rss: Vec<(f64, f64)>,
    pub cluster_rss: Vec<(f64, f64)>,
    /// Addresses seen configured in two pods' sandboxes at once, through every phase.
    pub shared: measure::Sharing,
}

/// Every benchmark pod's first sighting, first address and deletion, as a watch saw them.
#[derive(Default)]
struct Seen {
    pods: HashMap<String, PodSeen>,
}

struct PodSeen {
    name: String,
    first: Instant,
    addressed: Option<Instant>,
    gone: Option<Instant>,
}

type Tracker = Arc<Mutex<Seen>>;

fn track(client: kube::Client, ns: &str) -> (Tracker, tokio::task::JoinHandle<()>) {
    let seen: Tracker = Arc::default();
    let api: Api<Pod> = Api::namespaced(client, ns);
    let config = watcher::Config::default().labels(LABEL);
    let shared = seen.clone();
    let task = tokio::spawn(async move {
        let mut stream = watcher(api, config).boxed();
        while let Some(event) = stream.next().await {
            let now = Instant::now();
            let mut seen = shared.lock().unwrap();
            match event {
                Ok(watcher::Event::Apply(pod) | watcher::Event::InitApply(pod)) => {
                    let uid = pod.metadata.uid.clone().unwrap_or_default();
                    let entry = seen.pods.entry(uid).or_insert_with(|| PodSeen {
                        name: pod.metadata.name.clone().unwrap_or_default(),
                        first: now,
                        addressed: None,
                        gone: None,
                    });
                    let has_ip = pod
                        .status
                        .as_ref()
                        .and_then(|s| s.pod_ip.as_ref())
                        .is_some_and(|ip| !ip.is_empty());
                    if has_ip && entry.addressed.is_none() {
                        entry.addressed = Some(now);
                    }
                }
                Ok(watcher::Event::Delete(pod)) => {
                    let uid = pod.metadata.uid.clone().unwrap_or_default();
                    if let Some(p) = seen.pods.get_mut(&uid) {
                        p.gone.get_or_insert(now);
                    }
                }
                Ok(_) => {}
                Err(e) => println!("  (watch of the pods: {e})"),
            }
        }
    });
    (seen, task)
}

/// Where the phases read their costs from.
struct Meter<'a> {
    s: &'a Suite,
    ipam: Ipam,
    audit: AuditCursor,
    adds: measure::AddLog,
    ns: String,
}

struct Probe {
    /// None when the API server did not answer (loaded, it may not within kubectl's time).
    metrics: Option<ApiMetrics>,
    cpu: Cpu,
}

impl Meter<'_> {
    async fn probe(&self) -> Probe {
        Probe {
            metrics: ApiMetrics::read(&self.s.lab.kubeconfig())
                .inspect_err(|e| println!("  (the API server's metrics: {e:#})"))
                .ok(),
            cpu: self.cpu().await,
        }
    }

    async fn cpu(&self) -> Cpu {
        let own = |pids: &[u32]| -> f64 {
            pids.iter()
                .filter_map(|p| measure::cpu_seconds(*p))
                .map(|(own, _)| own)
                .sum()
        };
        let info = self.s.lab.info();
        let control = |name: &str| {
            info.processes
                .iter()
                .filter(|p| p.name == name)
                .filter_map(|p| p.pid)
                .collect::<Vec<_>>()
        };
        let stand_ins: Vec<u32> = info.nodes.iter().filter_map(|n| n.pid).collect();
        let node_daemons = pids_of(self.s, self.ipam.node_pods()).await;
        let cluster = pids_of(self.s, self.ipam.cluster_pods()).await;
        Cpu {
            node_daemons: own(&node_daemons),
            cluster: own(&cluster),
            plugins: stand_ins
                .iter()
                .filter_map(|p| measure::cpu_seconds(*p))
                .map(|(_, children)| children)
                .sum(),
            stand_ins: own(&stand_ins),
            apiserver: own(&control("kube-apiserver")),
            etcd: own(&control("etcd")),
        }
    }

    /// What happened since `before`, for phase `phase`.
    async fn finish(&mut self, before: Probe, phase: &mut Phase) {
        let after = self.probe().await;
        phase.requests = match (&before.metrics, &after.metrics) {
            // A restarted API server counts from zero.
            (Some(b), Some(a)) if a.requests >= b.requests => a.requests - b.requests,
            _ => f64::NAN,
        };
        phase.cpu = after.cpu.minus(&before.cpu);
        let audited = self.audit.read().unwrap_or_default();
        phase.audit = measure::count(&audited, &self.ipam.users());
        phase.adds = self.adds.read(&self.ns);
    }
}

/// The pids of the running containers of the pods `selector` in `ns`, from the stand-ins'
/// records.
async fn pids_of(s: &Suite, which: Option<(&str, &str)>) -> Vec<u32> {
    let mut pids = Vec::new();
    let Some((ns, selector)) = which else {
        return pids;
    };
    for pod in pods(s, ns, selector).await.unwrap_or_default() {
        let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.clone()) else {
            continue;
        };
        let Ok(node) = s.lab.node(&node) else {
            continue;
        };
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let dir = allot_lab::node::state::pods_dir(&node.root).join(uid);
        if let Some(record) = allot_lab::node::state::PodRecord::load(&dir) {
            pids.extend(record.processes.iter().map(|p| p.pid));
        }
    }
    pids
}

fn deployment(name: &str, replicas: i32) -> Deployment {
    serde_json::from_value(json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name, LABEL: "1"}},
                "spec": {
                    "terminationGracePeriodSeconds": 1,
                    "containers": [{"name": "pause", "image": "registry.k8s.io/pause:3.10"}],
                },
            },
        },
    }))
    .expect("a Deployment")
}

/// Replicas of each of `deployments` Deployments totalling `pods`.
fn split(pods: usize, deployments: usize) -> Vec<i32> {
    (0..deployments)
        .map(|i| (pods / deployments + usize::from(i < pods % deployments)) as i32)
        .collect()
}

fn names(config: &Config) -> Vec<String> {
    (0..config.deployments)
        .map(|i| format!("bench-{i}"))
        .collect()
}

async fn create_deployments(api: &Api<Deployment>, config: &Config) -> Result<()> {
    let replicas = split(config.pods, config.deployments);
    let post = PostParams::default();
    let post = &post;
    let made = futures::future::join_all(names(config).iter().zip(replicas).map(|(n, r)| {
        let d = deployment(n, r);
        async move { retry("creating a Deployment", || api.create(post, &d)).await }
    }))
    .await;
    for m in made {
        m?;
    }
    Ok(())
}

async fn scale(api: &Api<Deployment>, config: &Config, total: usize) -> Result<()> {
    let replicas = split(total, config.deployments);
    let params = PatchParams::default();
    let params = &params;
    let done = futures::future::join_all(names(config).iter().zip(replicas).map(|(n, r)| {
        let patch = Patch::Merge(json!({"spec": {"replicas": r}}));
        async move { retry("scaling a Deployment", || api.patch(n, params, &patch)).await }
    }))
    .await;
    for d in done {
        d?;
    }
    Ok(())
}

/// Waits until `want` pods first seen since `since` have an address, or the limit.
async fn wait_addressed(seen: &Tracker, since: Instant, want: usize, limit: Duration) -> Phase {
    let deadline = since + limit;
    loop {
        let (reached, per_pod) = {
            let seen = seen.lock().unwrap();
            let times: Vec<f64> = seen
                .pods
                .values()
                .filter(|p| p.first >= since && p.name != "churn")
                .filter_map(|p| p.addressed)
                .map(|a| (a - since).as_secs_f64())
                .collect();
            (times.len(), times)
        };
        let done = reached >= want;
        if done || Instant::now() > deadline {
            return Phase {
                pods: want,
                reached,
                seconds: done.then(|| per_pod.iter().copied().fold(0.0, f64::max)),
                per_pod,
                ..Phase::default()
            };
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until no benchmark pod is left in the namespace, or the limit.
async fn wait_gone(s: &Suite, ns: &str, seen: &Tracker, since: Instant, limit: Duration) -> Phase {
    let deadline = since + limit;
    let mut checked = Instant::now();
    loop {
        let (left, gone) = {
            let seen = seen.lock().unwrap();
            let left = seen.pods.values().filter(|p| p.gone.is_none()).count();
            let gone = seen
                .pods
                .values()
                .filter(|p| p.gone.is_some_and(|g| g >= since))
                .count();
            (left, gone)
        };
        // A watch may miss a deletion while it restarts: the API's word, every 5 s.
        let really_left = if left > 0 && checked.elapsed() > Duration::from_secs(5) {
            checked = Instant::now();
            let Some(listed) = pods(s, ns, LABEL).await else {
                // The API server did not answer (loaded): ask again later.
                if Instant::now() > deadline {
                    return Phase {
                        pods: gone + left,
                        reached: gone,
                        ..Phase::default()
                    };
                }
                continue;
            };
            let uids: Vec<String> = listed
                .iter()
                .filter_map(|p| p.metadata.uid.clone())
                .collect();
            let mut seen = seen.lock().unwrap();
            let now = Instant::now();
            for (uid, p) in seen.pods.iter_mut() {
                if p.gone.is_none() && !uids.contains(uid) {
                    p.gone = Some(now);
                }
            }
            listed.len()
        } else {
            left
        };
        if really_left == 0 || Instant::now() > deadline {
            return Phase {
                pods: gone + really_left,
                reached: gone,
                seconds: (really_left == 0).then(|| since.elapsed().as_secs_f64()),
                ..Phase::default()
            };
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until every node is Ready without the not-ready taint (its CNI configuration read).
async fn nodes_ready(s: &Suite) -> Result<()> {
    let api: Api<Node> = Api::all(s.client.clone());
    for _ in 0..600 {
        let nodes = api.list(&ListParams::default()).await?.items;
        let ready = nodes.iter().all(|n| {
            allot_lab::node_ready(n) == Some(true)
                && !n
                    .spec
                    .as_ref()
                    .and_then(|s| s.taints.as_ref())
                    .is_some_and(|t| t.iter().any(|t| t.key == "node.kubernetes.io/not-ready"))
        });
        if ready {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    anyhow::bail!("the nodes did not turn Ready with the benchmark's network in 300 s")
}

fn say(ipam: Ipam, p: &Phase) {
    let status = match p.seconds {
        Some(t) => format!("{t:.1} s"),
        None => format!("not done in the time limit: {} of {}", p.reached, p.pods),
    };
    let failed = p.adds.iter().filter(|a| !a.ok).count();
    let mut errors: BTreeMap<String, usize> = BTreeMap::new();
    for e in p.adds.iter().filter_map(|a| a.error.as_deref()) {
        // The plugin's message without the sandbox's ID.
        let e = e.rsplit("): ").next().unwrap_or(e);
        *errors.entry(e.chars().take(160).collect()).or_default() += 1;
    }
    for (e, n) in &errors {
        println!("    {n} failed ADD(s): {e}");
    }
    let mut waits: Vec<f64> = p.adds.iter().map(|a| a.wait_ms).collect();
    println!(
        "  {} {}: {status}; {} ADDs ({failed} failed, p99 {:.0} ms queued for one of the \
         node's CNI slots); {:.0} API requests ({} by the IPAM, {} refused; {} by the \
         benchmark); IPAM's: {:?}",
        ipam.name(),
        p.name,
        p.adds.len(),
        measure::quantile(&mut waits, 0.99),
        p.requests,
        p.audit.ipam,
        p.audit.ipam_refused,
        p.audit.admin,
        p.audit.ipam_by,
    );
}

/// Runs every phase for `ipam` in lab `s` (its own): install, measure.
pub async fn run_ipam(s: &Suite, config: &Config, ipam: Ipam) -> Result<IpamResult> {
    let nodes: Vec<_> = s.lab.nodes().into_iter().take(config.nodes).collect();
    let (large, exact) = config.pools();
    // The network first: a node without one is NotReady, and so unschedulable.
    ipams::conflist(&nodes, ipam, &large)?;
    nodes_ready(s).await?;
    // Install, with what the IPAM's start costs the API server.
    let mut audit = AuditCursor::at_end(&s.lab.info().dir.join("logs"));
    let before = ApiMetrics::read(&s.lab.kubeconfig())?;
    let t = Instant::now();
    ipam.install(s, &nodes).await?;
    println!(
        "  {} installed and ready in {:.1} s",
        ipam.name(),
        t.elapsed().as_secs_f64()
    );
    tokio::time::sleep(Duration::from_secs(10)).await;
    let after = ApiMetrics::read(&s.lab.kubeconfig())?;
    let mut watch = start_load::watch_load(&mut audit, &nodes, &ipam.users(), &before, &after);

    let ns = s.namespace(&format!("bench-{}", ipam.name())).await;
    let (seen, watching) = track(s.client.clone(), &ns);
    let stop_sampling = Arc::new(AtomicBool::new(false));
    let _stop = Stop {
        watching,
        sampling: stop_sampling.clone(),
    };
    let sampling = measure::sample_sharing(
        nodes.clone(),
        ns.clone(),
        ipam.node_local(),
        stop_sampling.clone(),
    );
    let mut meter = Meter {
        s,
        ipam,
        audit,
        adds: measure::AddLog::at_end(&nodes),
        ns: ns.clone(),
    };
    let deployments: Api<Deployment> = Api::namespaced(s.client.clone(), &ns);
    let mut phases = Vec::new();
    let limit = config.limit;

    for (pool, create, remove) in [
        (&large, "create", "delete"),
        (&exact, "exact", "exact-delete"),
    ] {
        ipam.make_pool(s, pool)?;
        ipams::conflist(&nodes, ipam, pool)?;
        nodes_ready(s).await?;
        // As a user would, the phase begins once the pool is there, not as it is created.
        tokio::time::sleep(Duration::from_secs(5)).await;
        // Whatever the IPAM did between phases is not the phase's.
        let _ = meter.audit.read();
        let _ = meter.adds.read(&ns);
        let probe = meter.probe().await;
        let t = Instant::now();
        create_deployments(&deployments, config).await?;
        let mut p = wait_addressed(&seen, t, config.pods, limit).await;
        p.name = format!("{create} ({} addresses)", pool.size());
        meter.finish(probe, &mut p).await;
        if pool.name == large.name {
            // What the start-up lists return in a cluster running the benchmark's pods.
            start_load::count_lists(s, &mut watch, &nodes[0].name);
        }
        say(ipam, &p);
        let addressed_all = p.seconds.is_some();
        phases.push(p);
        if pool.name == exact.name && !addressed_all {
            println!("  (scale and churn skipped: the exact pool's pods were not all addressed)");
        }
        if pool.name == exact.name && addressed_all {
            // Release and reuse in the exact pool.
            for (name, total) in [("scale-0", 0), ("scale-up", config.pods)] {
                let probe = meter.probe().await;
                let t = Instant::now();
                scale(&deployments, config, total).await?;
                let mut p = if total == 0 {
                    wait_gone(s, &ns, &seen, t, limit).await
                } else {
                    wait_addressed(&seen, t, total, limit).await
                };
                p.name = name.into();
                meter.finish(probe, &mut p).await;
                say(ipam, &p);
                phases.push(p);
            }
            scale(&deployments, config, 0).await?;
            wait_gone(s, &ns, &seen, Instant::now(), limit).await;
            let p = churn(s, config, &mut meter, &deployments, &seen, &ns).await?;
            say(ipam, &p);
            phases.push(p);
        }
        let probe = meter.probe().await;
        let t = Instant::now();
        for n in names(config) {
            let _ = deployments.delete(&n, &DeleteParams::background()).await;
        }
        let mut p = wait_gone(s, &ns, &seen, t, limit).await;
        p.name = remove.into();
        meter.finish(probe, &mut p).await;
        say(ipam, &p);
        phases.push(p);
        if p_left(&phases) {
            force_delete(s, &ns).await;
        }
        ipam.drop_pool(s, pool);
    }

    stop_sampling.store(true, Ordering::Relaxed);
    let shared = sampling.join().unwrap_or_default();
    // Memory at the end of the run. Nothing is uninstalled: the lab goes with its IPAM.
    let rss = |pids: Vec<u32>| pids.into_iter().filter_map(measure::rss_mib).collect();
    let node_rss = rss(pids_of(s, ipam.node_pods()).await);
    let cluster_rss = rss(pids_of(s, ipam.cluster_pods()).await);
    Ok(IpamResult {
        ipam,
        phases,
        watch,
        rss: node_rss,
        cluster_rss,
        shared,
    })
}

/// Stops the pod watch and the sandbox sampler however [`run_ipam`] ends, an error included:
/// the lab they read goes with its IPAM, and a watch of a stopped API server would only fail.
struct Stop {
    watching: tokio::task::JoinHandle<()>,
    sampling: Arc<AtomicBool>,
}

impl Drop for Stop {
    fn drop(&mut self) {
        self.watching.abort();
        self.sampling.store(true, Ordering::Relaxed);
    }
}

fn p_left(phases: &[Phase]) -> bool {
    phases.last().is_some_and(|p| p.seconds.is_none())
}

/// Pods a phase left behind, deleted at once (their DEL still runs on their nodes).
async fn force_delete(s: &Suite, ns: &str) {
    println!("  force-deleting the pods left in {ns}");
    let _ = s.kubectl(&[
        "-n",
        ns,
        "delete",
        "pods",
        "--all",
        "--force",
        "--grace-period=0",
        "--wait=false",
    ]);
}

/// `cycles` create/address/delete cycles of one pod named `churn` while the Deployments take
/// every other address of the exact pool.
async fn churn(
    s: &Suite,
    config: &Config,
    meter: &mut Meter<'_>,
    deployments: &Api<Deployment>,
    seen: &Tracker,
    ns: &str,
) -> Result<Phase> {
    let pods: Api<Pod> = Api::namespaced(s.client.clone(), ns);
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "churn", "labels": {LABEL: "1"}},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "pause", "image": "registry.k8s.io/pause:3.10"}],
        },
    }))?;
    let _ = meter.audit.read();
    let _ = meter.adds.read(ns);
    let probe = meter.probe().await;
    let t = Instant::now();
    let deadline = t + config.limit;
    let others = config.pods.saturating_sub(1);
    scale(deployments, config, others).await?;
    let mut cycles = Vec::new();
    let mut failed = None;
    'cycles: for _ in 0..config.cycles {
        let c = Instant::now();
        let post = PostParams::default();
        let made = retry("creating the churn pod", || pods.create(&post, &pod)).await?;
        let uid = made.metadata.uid.unwrap_or_default();
        loop {
            let addressed = seen
                .lock()
                .unwrap()
                .pods
                .get(&uid)
                .and_then(|p| p.addressed);
            if let Some(a) = addressed {
                cycles.push((a - c).as_secs_f64());
                break;
            }
            if Instant::now() > deadline {
                failed = Some("a churn pod had no address in the time limit");
                break 'cycles;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let params = DeleteParams::default();
        retry("deleting the churn pod", || pods.delete("churn", &params)).await?;
        loop {
            if retry("reading the churn pod", || pods.get_opt("churn"))
                .await?
                .is_none()
            {
                break;
            }
            if Instant::now() > deadline {
                failed = Some("a churn pod was not gone in the time limit");
                break 'cycles;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    let rest = deadline.saturating_duration_since(Instant::now());
    let mut p = wait_addressed(seen, t, others, rest).await;
    if let Some(why) = failed {
        println!("  churn: {why}");
    }
    p.name = format!("churn ({} cycles, {others} others)", config.cycles);
    p.pods = others + config.cycles;
    p.reached += cycles.len();
    if cycles.len() < config.cycles {
        p.seconds = None;
    } else if p.seconds.is_some() {
        p.seconds = Some(t.elapsed().as_secs_f64());
    }
    p.cycles = cycles;
    meter.finish(probe, &mut p).await;
    Ok(p)
}

/// The pods `selector` in `ns`; None (after saying why) when the API server does not answer,
/// as a loaded one may not.
pub async fn pods(s: &Suite, ns: &str, selector: &str) -> Option<Vec<Pod>> {
    let api: Api<Pod> = Api::namespaced(s.client.clone(), ns);
    match api.list(&ListParams::default().labels(selector)).await {
        Ok(list) => Some(list.items),
        Err(e) => {
            println!("  (listing pods {selector} in {ns}: {e})");
            None
        }
    }
}

/// `call` again (up to 5 tries, 2 s apart) while the API server fails to answer; a loaded one
/// drops connections now and then.
async fn retry<T, F, Fut>(what: &str, mut call: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, kube::Error>>,
{
    let mut tries = 0;
    loop {
        match call().await {
            Ok(v) => return Ok(v),
            Err(kube::Error::Api(e)) => return Err(anyhow::anyhow!("{what}: {e}")),
            Err(e) if tries < 4 => {
                tries += 1;
                println!("  ({what}: {e}; again)");
                tokio::time::sleep(Duration::from_secs(2)).await;
            }
            Err(e) => return Err(e).context(what.to_string()),
        }
    }
}
