//! The tables: each phase per IPAM, allot's ratio to each peer, every IPAM's ratio to the
//! floor (host-local), memory, and the watch load extrapolated to 1,000 nodes.

use crate::Config;
use crate::ipams::Ipam;
use crate::measure::quantile;
use crate::phases::{IpamResult, Phase};

fn seconds(p: &Phase) -> String {
    match p.seconds {
        Some(t) => format!("{t:.1}"),
        None => format!("not done: {} of {}", p.reached, p.pods),
    }
}

fn q(values: &[f64], at: f64, scale: f64) -> String {
    if values.is_empty() {
        return "-".into();
    }
    let mut v: Vec<f64> = values.iter().map(|x| x * scale).collect();
    format!("{:.0}", quantile(&mut v, at))
}

pub fn print(config: &Config, results: &[IpamResult]) {
    let nodes = config.nodes as f64;
    println!(
        "Phases ({} nodes, {} pods in {} Deployments, limit {} s per phase). Times in s from the \
         requests; per-pod and ADD in ms (p50/p99); requests per pod; CPU s per node for the \
         IPAM's node processes and for the CNI plugins run (bridge + IPAM), s in all for the \
         control plane.",
        config.nodes,
        config.pods,
        config.deployments,
        config.limit.as_secs()
    );
    println!(
        "| phase | IPAM | time | per pod p50/p99 | ADD p50/p99 (n, failed) | API req/pod | \
         IPAM req/pod | IPAM node CPU/node | IPAM cluster CPU | plugins CPU/node | \
         apiserver CPU | etcd CPU |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let phase_count = results.iter().map(|r| r.phases.len()).max().unwrap_or(0);
    for i in 0..phase_count {
        for r in results {
            let Some(p) = r.phases.get(i) else { continue };
            let per = p.pods.max(1) as f64;
            let adds: Vec<f64> = p.adds.iter().map(|a| a.add_ms).collect();
            let failed = p.adds.iter().filter(|a| !a.ok).count();
            let per_pod = if p.cycles.is_empty() {
                &p.per_pod
            } else {
                &p.cycles
            };
            println!(
                "| {} | {} | {} | {}/{} | {}/{} ({}, {failed}) | {:.1} | {:.1} | {:.2} | {:.1} | \
                 {:.2} | {:.1} | {:.1} |",
                p.name,
                r.ipam.name(),
                seconds(p),
                q(per_pod, 0.5, 1e3),
                q(per_pod, 0.99, 1e3),
                q(&adds, 0.5, 1.0),
                q(&adds, 0.99, 1.0),
                adds.len(),
                p.requests / per,
                p.audit.ipam as f64 / per,
                p.cpu.node_daemons / nodes,
                p.cpu.cluster,
                p.cpu.plugins / nodes,
                p.cpu.apiserver,
                p.cpu.etcd,
            );
        }
    }
    if let Some(allot) = results.iter().find(|r| r.ipam == Ipam::Allot) {
        // host-local is no peer but the floor, below.
        let peers = results
            .iter()
            .filter(|r| !matches!(r.ipam, Ipam::Allot | Ipam::HostLocal));
        for peer in peers {
            println!(
                "\nallot / {} (same run; below 1: allot faster or cheaper):",
                peer.ipam.name()
            );
            ratios(allot, peer);
        }
    }
    floor(config, results);
    println!(
        "\nReference only (not this machine, not this run): Spiderpool's published figures for \
         1,000 pods on 10 nodes: Spiderpool 207 s, Calico 322 s, Whereabouts 2,529 s, and \
         Whereabouts failing outright when the pool has exactly as many addresses as pods."
    );
    for r in results {
        println!("\n{}: memory and watch load", r.ipam.name());
        let scope = if r.ipam.node_local() {
            " of one node (across nodes they repeat by design)"
        } else {
            ""
        };
        println!(
            "  addresses answering in two pods' sandboxes{scope} at once: {} (in two samples a \
             second apart; {} samples through every phase)",
            r.shared.seen.len(),
            r.shared.samples
        );
        for shared in r.shared.seen.iter().take(5) {
            println!("    {shared}");
        }
        let max = |v: &[(f64, f64)], hwm: bool| {
            v.iter()
                .map(|(rss, peak)| if hwm { *peak } else { *rss })
                .fold(0.0, f64::max)
        };
        let mean =
            |v: &[(f64, f64)]| v.iter().map(|(rss, _)| rss).sum::<f64>() / v.len().max(1) as f64;
        if r.ipam.node_pods().is_none() && r.ipam.cluster_pods().is_none() {
            println!("  no processes of its own: a plugin run for each ADD and DEL");
        } else {
            println!(
                "  node processes ({}): resident {:.1} MiB mean, {:.1} max, peak {:.1} MiB",
                r.rss.len(),
                mean(&r.rss),
                max(&r.rss, false),
                max(&r.rss, true)
            );
            if !r.cluster_rss.is_empty() {
                println!(
                    "  cluster processes ({}): resident {:.1} MiB mean, peak {:.1} MiB",
                    r.cluster_rss.len(),
                    mean(&r.cluster_rss),
                    max(&r.cluster_rss, true)
                );
            }
        }
        let held: f64 = r.watch.watches.values().sum();
        println!(
            "  WATCH requests held once installed: {held:.0} ({}), registered watchers {:+.0}",
            r.watch
                .watches
                .iter()
                .map(|(k, v)| format!("{k} {v:+.0}"))
                .collect::<Vec<_>>()
                .join(", "),
            r.watch.registered_watchers
        );
        println!(
            "  lists at start (user agent, user, URI: processes, objects returned with the \
             create phase's pods running):"
        );
        let mut per_node_lists = 0usize;
        let mut per_node_objects = 0f64;
        let mut at_1000 = 0f64;
        for l in &r.watch.lists {
            println!(
                "    {} {} {}: {} processes, {} objects",
                l.agent, l.user, l.uri, l.processes, l.objects
            );
            if l.processes >= config.nodes {
                // A process per node.
                per_node_lists += 1;
                per_node_objects += l.objects as f64;
                at_1000 += scaled(&l.uri, l.objects as f64, nodes);
            }
        }
        println!(
            "  per node: {per_node_lists} lists at start returning {per_node_objects:.0} objects \
             (informers keep a WATCH open per list); at 1,000 nodes: 1,000 x \
             {per_node_lists} = {} WATCH requests held by the node processes, and 1,000 x \
             {at_1000:.0} = {:.0} objects sent when all of them start at once (cluster-wide \
             lists of nodes, pods, workloads and IP blocks scaled by 1,000/{}, the pods per \
             node staying the same; node-scoped lists, pools and namespaces as measured)",
            1000 * per_node_lists,
            1000.0 * at_1000,
            config.nodes
        );
    }
    println!("\n{}", config.command());
}

/// What a list returning `objects` in a cluster of `nodes` nodes returns at 1,000 nodes with
/// the same pods per node: a node-scoped list (`<node>` in its selector) or one of a kind that
/// does not grow with the cluster (pools, policies, namespaces, webhook configurations) the
/// same; a cluster-wide list of what grows with nodes and pods (nodes, pods, workloads, IP
/// blocks, endpoint records) times 1,000/nodes.
fn scaled(uri: &str, objects: f64, nodes: f64) -> f64 {
    let path = uri.split('?').next().unwrap_or_default();
    let grows = [
        "/nodes",
        "/pods",
        "/replicasets",
        "/statefulsets",
        "/jobs",
        "/cronjobs",
        "/deployments",
        "/ipblocks",
        "/endpoints",
        "/leases",
        "/ipamblocks",
        "/ipamhandles",
        "/blockaffinities",
    ]
    .iter()
    .any(|k| path.ends_with(k));
    if grows && !uri.contains("<node>") {
        objects * 1000.0 / nodes
    } else {
        objects
    }
}

/// Every other IPAM's phases as ratios to host-local's (the floor: a plugin on each node and
/// nothing behind it), or a line saying why there are none.
fn floor(config: &Config, results: &[IpamResult]) {
    let Some(host_local) = results.iter().find(|r| r.ipam == Ipam::HostLocal) else {
        let why = if config.ipams.contains(&Ipam::HostLocal) {
            "skipped, failed, or not yet run"
        } else {
            "not in ALLOT_BENCH_IPAMS"
        };
        println!("\nNo ratios to the floor: host-local has no results ({why}).");
        return;
    };
    let others: Vec<&IpamResult> = results
        .iter()
        .filter(|r| r.ipam != Ipam::HostLocal)
        .collect();
    if others.is_empty() {
        return;
    }
    for r in others {
        println!(
            "\n{} / host-local, the floor (same run; above 1: what coordinating addresses costs \
             beyond a node-local plugin):",
            r.ipam.name()
        );
        ratios(r, host_local);
    }
    println!(
        "(host-local gives each node the whole pool: its exact phases never run short, a node \
         taking about {} of the pool's {} addresses; its IPAM requests are none, so ratios to \
         them read -.)",
        config.pods.div_ceil(config.nodes.max(1)),
        config.pods
    );
}

/// The table of `a`'s phases as ratios to `b`'s same phases.
fn ratios(a: &IpamResult, b: &IpamResult) {
    println!(
        "| phase | time | per-pod p50 | per-pod p95 | per-pod p99 | ADD p50 | API req/pod | \
         IPAM req/pod |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|");
    let (a_name, b_name) = (a.ipam.name(), b.ipam.name());
    let ratio = |x: Option<f64>, y: Option<f64>| match (x, y) {
        (Some(x), Some(y)) if y > 0.0 && x.is_finite() && y.is_finite() => format!("{:.3}", x / y),
        _ => "-".into(),
    };
    let time = |x: &Phase, y: &Phase| match (x.seconds, y.seconds) {
        (Some(_), None) => format!("{b_name} not done"),
        (None, Some(_)) => format!("{a_name} not done"),
        (x, y) => ratio(x, y),
    };
    let per_pod = |p: &Phase, at: f64| {
        let v = if p.cycles.is_empty() {
            &p.per_pod
        } else {
            &p.cycles
        };
        (!v.is_empty()).then(|| quantile(&mut v.clone(), at))
    };
    let add50 = |p: &Phase| {
        let mut v: Vec<f64> = p.adds.iter().map(|a| a.add_ms).collect();
        (!v.is_empty()).then(|| quantile(&mut v, 0.5))
    };
    let req = |p: &Phase| Some(p.requests / p.pods.max(1) as f64);
    let own = |p: &Phase| Some(p.audit.ipam as f64 / p.pods.max(1) as f64);
    for x in &a.phases {
        let Some(y) = b.phases.iter().find(|y| y.name == x.name) else {
            println!("| {} | {b_name} did not run it | | | | | | |", x.name);
            continue;
        };
        println!(
            "| {} | {} | {} | {} | {} | {} | {} | {} |",
            x.name,
            time(x, y),
            ratio(per_pod(x, 0.5), per_pod(y, 0.5)),
            ratio(per_pod(x, 0.95), per_pod(y, 0.95)),
            ratio(per_pod(x, 0.99), per_pod(y, 0.99)),
            ratio(add50(x), add50(y)),
            ratio(req(x), req(y)),
            ratio(own(x), own(y)),
        );
    }
}
