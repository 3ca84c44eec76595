//! ADD latency through Debian's bridge plugin with allot's probes off and on, in one run, for
//! a free address (nobody else on the bridge): the price of conflict and gateway probing.
//! Configs alternate ADD by ADD (each followed by its DEL, not timed) so that all see the same
//! background load. Prints mean, p50, p99 per config and the extra over probing off.
//!
//! `cargo bench -p allot-e2e --bench probe_latency` (as root, after `scripts/setup.sh` and a
//! release build). `ALLOT_BENCH_CYCLES` (default 30) sets the ADDs per config.

use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use allot_e2e::fleet::percentile;
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

/// One timed ADD (and an untimed DEL) through the bridge plugin; panics on any failure.
fn add(lab: &Lab, netns: &Arc<Netns>, name: &str, conf: &Value) -> Duration {
    let att = Attachment::in_netns(netns, name);
    let start = Instant::now();
    let out = lab.cni("bridge", "ADD", &att, conf);
    let took = start.elapsed();
    out.expect_ok();
    lab.cni("bridge", "DEL", &att, conf).expect_ok();
    took
}

fn main() {
    let cycles = env_usize("ALLOT_BENCH_CYCLES", 30);
    let pools = ippool(
        "bench",
        "10.97.0.0/16",
        Some("10.97.0.1"),
        &["10.97.0.10-10.97.3.250"],
    );
    let Some(lab) = Lab::new("probe_latency benchmark", &pools) else {
        return;
    };
    // The gateway on the bridge before the first ADD (the bridge plugin adds it only after
    // IPAM has returned).
    lab.host.ip(&["link", "add", &lab.bridge, "type", "bridge"]);
    lab.host.ip(&["link", "set", &lab.bridge, "up"]);
    lab.host
        .ip(&["addr", "add", "10.97.0.1/16", "dev", &lab.bridge]);

    let base = lab.bridge_conf(&["bench"], &[]);
    let with = |probe: Value| {
        let mut c = base.clone();
        c["ipam"]["probe"] = probe;
        c
    };
    let configs: Vec<(&str, Value)> = vec![
        ("off", base.clone()),
        (
            "conflict+gateway 3x100ms",
            with(json!({"conflict": true, "gateway": true})),
        ),
        (
            "conflict+gateway 3x30ms",
            with(json!({"conflict": true, "gateway": true, "tries": 3, "timeoutMs": 30})),
        ),
        ("gateway only 3x100ms", with(json!({"gateway": true}))),
    ];

    let uname = std::process::Command::new("uname").arg("-r").output();
    println!("== probe_latency: ADD through the bridge plugin, allot probes off vs on ==");
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
        "{cycles} ADDs per config (+{WARMUP} warm-up), configs alternating ADD by ADD; IPv4 only, address free, gateway on the bridge"
    );
    println!();

    let netns = Arc::new(Netns::new());
    for i in 0..WARMUP {
        for (k, (_, conf)) in configs.iter().enumerate() {
            add(&lab, &netns, &format!("w{k}-{i}"), conf);
        }
    }
    let mut samples: Vec<Vec<Duration>> = vec![Vec::new(); configs.len()];
    for i in 0..cycles {
        for (k, (_, conf)) in configs.iter().enumerate() {
            samples[k].push(add(&lab, &netns, &format!("m{k}-{i}"), conf));
        }
    }
    for s in &mut samples {
        s.sort();
    }
    let p50_off = percentile(&samples[0], 0.50);
    println!(
        "{:<26} {:>6} {:>10} {:>10} {:>10} {:>14}",
        "probe", "ADDs", "mean", "p50", "p99", "p50 - off p50"
    );
    for ((name, _), s) in configs.iter().zip(&samples) {
        let mean = s.iter().sum::<Duration>() / s.len() as u32;
        let p50 = percentile(s, 0.50);
        println!(
            "{:<26} {:>6} {:>10} {:>10} {:>10} {:>14}",
            name,
            s.len(),
            ms(mean),
            ms(p50),
            ms(percentile(s, 0.99)),
            ms(p50.saturating_sub(p50_off)),
        );
    }
    println!(
        "loadavg after: {}",
        std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .trim()
    );
    let (total, free) = lab.agent.pool_counts("bench");
    assert_eq!(total, free, "allot leaked {} claims", total - free);
}
