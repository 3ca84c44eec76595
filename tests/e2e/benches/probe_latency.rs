//! ADD latency through Debian's bridge and macvlan plugins with allot's probes off, on (in the
//! pod's namespace) and on with probing ahead from the parent link, in one run, for a free
//! address. Two agents run in the lab's host namespace (as a node's agent runs in the node's):
//! one without `--probe-ahead` (probes off, and probes in the pod's namespace), one with it, on
//! pools of their own in the same subnets. Configs alternate ADD by ADD (each followed by its
//! DEL, not timed) so that all see the same background load. Prints mean, p50, p99 per config,
//! the extra over probing off, and how many addresses were handed out probed ahead.
//!
//! `cargo bench -p allot-e2e --bench probe_latency` (as root, after `scripts/setup.sh` and a
//! release build). `ALLOT_BENCH_CYCLES` (default 30) sets the ADDs per config.

use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use allot_e2e::fleet::percentile;
use allot_e2e::probe::{bridge_with, foreign_host, metric, with_probe};
use allot_e2e::*;
use serde_json::{Value, json};

const WARMUP: usize = 3;

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1e3)
}

fn env_usize(key: &str, default: usize) -> usize {
    std::env::var(key)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// One timed ADD (and an untimed DEL) through `plugin`; panics on any failure.
fn add(lab: &Lab, plugin: &str, netns: &Arc<Netns>, name: &str, conf: &Value) -> Duration {
    let att = Attachment::in_netns(netns, name);
    let start = Instant::now();
    let out = lab.cni(plugin, "ADD", &att, conf);
    let took = start.elapsed();
    out.expect_ok();
    lab.cni(plugin, "DEL", &att, conf).expect_ok();
    took
}

/// The pools of one agent: `third` picks its share of each subnet.
fn pools(third: u8) -> String {
    format!(
        "{}{}{}",
        ippool(
            "br",
            "10.97.0.0/16",
            Some("10.97.0.1"),
            &[&format!("10.97.{third}.10-10.97.{third}.250")]
        ),
        ippool(
            "mv",
            "10.98.0.0/16",
            Some("10.98.0.1"),
            &[&format!("10.98.{third}.10-10.98.{third}.250")]
        ),
        ippool(
            "br6",
            "fd00:97::/64",
            Some("fd00:97::1"),
            &[&format!("fd00:97::{third}:10-fd00:97::{third}:250")]
        ),
    )
}

fn main() {
    let cycles = env_usize("ALLOT_BENCH_CYCLES", 30);
    let Some(lab) = Lab::in_host("probe_latency benchmark", &pools(0), &[]) else {
        return;
    };
    let ahead = Agent::start_in(&lab.host, &pools(2), &[("--probe-ahead", "")]);
    // Underlay topologies: the bridge has an uplink to a router holding the gateway (a bridge
    // without any port up has no carrier, and nothing to probe); the macvlan master's other end
    // is a router holding its gateway.
    bridge_with(&lab.host, &lab.bridge, &[]);
    let (_uplink_router, uplink, _) = foreign_host(&lab.host, &["10.97.0.1/16", "fd00:97::1/64"]);
    lab.host
        .ip(&["link", "set", &uplink, "master", &lab.bridge]);
    let (_router, master, _) = foreign_host(&lab.host, &["10.98.0.1/16"]);

    let probe = json!({"conflict": true, "gateway": true});
    let bridge_v6 = |agent: &Agent, v6: &[&str], probe: Option<&Value>| {
        let mut c = bridge_conf(
            "1.0.0",
            "bench-br",
            &lab.bridge,
            allot_ipam(&agent.socket(), &["br"], v6),
        );
        // The router is the gateway, not the bridge.
        c["isGateway"] = json!(false);
        probe.map_or(c.clone(), |p| with_probe(c, p.clone()))
    };
    let bridge = |agent: &Agent, probe: Option<&Value>| bridge_v6(agent, &[], probe);
    let dual = |agent: &Agent, probe: Option<&Value>| bridge_v6(agent, &["br6"], probe);
    let macvlan = |agent: &Agent, probe: Option<&Value>| {
        let c = macvlan_conf(
            "1.0.0",
            "bench-mv",
            &master,
            allot_ipam(&agent.socket(), &["mv"], &[]),
        );
        probe.map_or(c.clone(), |p| with_probe(c, p.clone()))
    };
    let configs: Vec<(&str, &str, Value)> = vec![
        ("bridge: off", "bridge", bridge(&lab.agent, None)),
        (
            "bridge: on, in the pod",
            "bridge",
            bridge(&lab.agent, Some(&probe)),
        ),
        (
            "bridge: on, probed ahead",
            "bridge",
            bridge(&ahead, Some(&probe)),
        ),
        ("macvlan: off", "macvlan", macvlan(&lab.agent, None)),
        (
            "macvlan: on, in the pod",
            "macvlan",
            macvlan(&lab.agent, Some(&probe)),
        ),
        (
            "macvlan: on, probed ahead",
            "macvlan",
            macvlan(&ahead, Some(&probe)),
        ),
        ("bridge dual stack: off", "bridge", dual(&lab.agent, None)),
        (
            "bridge dual stack: in pod",
            "bridge",
            dual(&lab.agent, Some(&probe)),
        ),
        (
            "bridge dual stack: ahead",
            "bridge",
            dual(&ahead, Some(&probe)),
        ),
    ];

    let uname = std::process::Command::new("uname").arg("-r").output();
    println!(
        "== probe_latency: ADD through bridge and macvlan, allot probes off / on / on and probed ahead =="
    );
    println!(
        "machine: nproc {} | kernel {} | loadavg {}",
        thread::available_parallelism().map_or(0, |n| n.get()),
        uname.map_or("?".into(), |o| String::from_utf8_lossy(&o.stdout)
            .trim()
            .to_string()),
        std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .trim(),
    );
    println!(
        "{cycles} ADDs per config (+{WARMUP} warm-up), configs alternating ADD by ADD; \
         address free, gateway a router behind the bridge's uplink / the macvlan master; IPv4 only but for the dual stack rows; probe {probe}"
    );
    println!();

    let netns = Arc::new(Netns::new());
    for i in 0..WARMUP {
        for (k, (_, plugin, conf)) in configs.iter().enumerate() {
            add(&lab, plugin, &netns, &format!("w{k}-{i}"), conf);
        }
    }
    let (hits0, misses0) = (
        metric(&ahead, "allot_probe_ahead_hits_total"),
        metric(&ahead, "allot_probe_ahead_misses_total"),
    );
    let mut samples: Vec<Vec<Duration>> = vec![Vec::new(); configs.len()];
    for i in 0..cycles {
        for (k, (_, plugin, conf)) in configs.iter().enumerate() {
            samples[k].push(add(&lab, plugin, &netns, &format!("m{k}-{i}"), conf));
        }
    }
    for s in &mut samples {
        s.sort();
    }
    println!(
        "{:<28} {:>6} {:>10} {:>10} {:>10} {:>14}",
        "config", "ADDs", "mean", "p50", "p99", "p50 - off p50"
    );
    for (k, ((name, _, _), s)) in configs.iter().zip(&samples).enumerate() {
        let off = percentile(&samples[k - k % 3], 0.50);
        let mean = s.iter().sum::<Duration>() / s.len() as u32;
        let p50 = percentile(s, 0.50);
        println!(
            "{:<28} {:>6} {:>10} {:>10} {:>10} {:>14}",
            name,
            s.len(),
            ms(mean),
            ms(p50),
            ms(percentile(s, 0.99)),
            ms(p50.saturating_sub(off)),
        );
    }
    let hits = metric(&ahead, "allot_probe_ahead_hits_total") - hits0;
    let misses = metric(&ahead, "allot_probe_ahead_misses_total") - misses0;
    println!(
        "probed ahead: {hits} of {} timed addresses handed out with a fresh verdict ({misses} probed in the pod)",
        hits + misses
    );
    println!(
        "probes ahead run: {} in all",
        metric(&ahead, "allot_probe_ahead_probes_total")
    );
    println!(
        "loadavg after: {}",
        std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .trim()
    );
    for (agent, pool) in [
        (&lab.agent, "br"),
        (&lab.agent, "mv"),
        (&ahead, "br"),
        (&ahead, "mv"),
    ] {
        let (total, free) = agent.pool_counts(pool);
        assert_eq!(
            total,
            free,
            "allot leaked {} claims of {pool}",
            total - free
        );
    }
}
