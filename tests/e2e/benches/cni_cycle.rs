//! ADD+DEL cycles through Debian's bridge plugin, with allot as IPAM against the same bridge
//! config with host-local: sequential, then 8-way concurrent (8 threads, each its own pod
//! namespace). Prints per-cycle mean, p50 and p99 and the ratio allot / host-local.
//!
//! `cargo bench -p allot-e2e --bench cni_cycle` (as root, after `scripts/setup.sh` and a release
//! build). `ALLOT_BENCH_CYCLES` (default 200) sets the sequential cycles per IPAM and the
//! concurrent cycles per IPAM (split over the threads); `ALLOT_BENCH_THREADS` (default 8).

use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use allot_e2e::fleet::percentile;
use allot_e2e::*;
use serde_json::{Value, json};

const WARMUP: usize = 5;

/// One cycle: (ADD, DEL).
type Sample = (Duration, Duration);

struct Stats {
    cycles: usize,
    mean: Duration,
    p50: Duration,
    p99: Duration,
    add_p50: Duration,
    del_p50: Duration,
    /// Wall-clock time of the measured phases, for cycles/s.
    wall: Duration,
}

fn stats(samples: &[Sample], wall: Duration) -> Stats {
    let sorted = |f: &dyn Fn(&Sample) -> Duration| {
        let mut v: Vec<Duration> = samples.iter().map(f).collect();
        v.sort();
        v
    };
    let cycles = sorted(&|s| s.0 + s.1);
    let n = cycles.len();
    Stats {
        cycles: n,
        mean: cycles.iter().sum::<Duration>() / n as u32,
        p50: percentile(&cycles, 0.50),
        p99: percentile(&cycles, 0.99),
        add_p50: percentile(&sorted(&|s| s.0), 0.50),
        del_p50: percentile(&sorted(&|s| s.1), 0.50),
        wall,
    }
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1e3)
}

/// One ADD and one DEL through the bridge plugin; panics on any failure.
fn cycle(lab: &Lab, netns: &Arc<Netns>, name: &str, conf: &Value) -> Sample {
    let att = Attachment::in_netns(netns, name);
    let start = Instant::now();
    let add = lab.cni("bridge", "ADD", &att, conf);
    let added = start.elapsed();
    add.expect_ok();
    let del = lab.cni("bridge", "DEL", &att, conf);
    let took = start.elapsed();
    del.expect_ok();
    (added, took - added)
}

/// Sequential cycles, alternating the two configs cycle by cycle so that both see the same
/// background load.
fn sequential(lab: &Lab, confs: [&Value; 2], cycles: usize) -> [Stats; 2] {
    let netns = Arc::new(Netns::new());
    for i in 0..WARMUP {
        for (k, conf) in confs.iter().enumerate() {
            cycle(lab, &netns, &format!("s{k}-warm-{i}"), conf);
        }
    }
    let mut samples: [Vec<Sample>; 2] = Default::default();
    let mut wall = [Duration::ZERO; 2];
    for i in 0..cycles {
        for (k, conf) in confs.iter().enumerate() {
            let start = Instant::now();
            samples[k].push(cycle(lab, &netns, &format!("s{k}-{i}"), conf));
            wall[k] += start.elapsed();
        }
    }
    [0, 1].map(|k| stats(&samples[k], wall[k]))
}

/// Concurrent phases in the order A B B A (half the cycles each), so that a drift in background
/// load favours neither config.
fn concurrent(lab: &Lab, confs: [&Value; 2], threads: usize, per_thread: usize) -> [Stats; 2] {
    let mut samples: [Vec<Sample>; 2] = Default::default();
    let mut wall = [Duration::ZERO; 2];
    for (phase, k) in [0usize, 1, 1, 0].into_iter().enumerate() {
        let n = if phase < 2 {
            per_thread / 2
        } else {
            per_thread - per_thread / 2
        };
        let (s, w) = concurrent_phase(lab, confs[k], &format!("c{phase}"), threads, n);
        samples[k].extend(s);
        wall[k] += w;
    }
    [0, 1].map(|k| stats(&samples[k], wall[k]))
}

fn concurrent_phase(
    lab: &Lab,
    conf: &Value,
    label: &str,
    threads: usize,
    per_thread: usize,
) -> (Vec<Sample>, Duration) {
    let namespaces: Vec<Arc<Netns>> = (0..threads).map(|_| Arc::new(Netns::new())).collect();
    for (t, netns) in namespaces.iter().enumerate() {
        cycle(lab, netns, &format!("{label}-warm-{t}"), conf);
    }
    let start = Instant::now();
    let samples: Vec<Sample> = thread::scope(|s| {
        let handles: Vec<_> = namespaces
            .iter()
            .enumerate()
            .map(|(t, netns)| {
                s.spawn(move || {
                    (0..per_thread)
                        .map(|i| cycle(lab, netns, &format!("{label}-t{t}-{i}"), conf))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect()
    });
    (samples, start.elapsed())
}

fn env_usize(key: &str, default: usize) -> usize {
    std::env::var(key)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn first_line(path: &str, prefix: &str) -> String {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with(prefix))
        .map(|l| l.split_once(':').map_or(l, |(_, v)| v).trim().to_string())
        .unwrap_or_else(|| "?".into())
}

fn main() {
    // `cargo bench` passes `--bench`; nothing else to parse.
    let cycles = env_usize("ALLOT_BENCH_CYCLES", 200);
    let threads = env_usize("ALLOT_BENCH_THREADS", 8);
    let per_thread = cycles.div_ceil(threads);

    let pools = ippool(
        "bench",
        "10.95.0.0/16",
        Some("10.95.0.1"),
        &["10.95.0.10-10.95.3.250"],
    );
    let Some(lab) = Lab::new("cni_cycle benchmark", &pools) else {
        return;
    };
    let host_local_dir = tempfile::tempdir().unwrap();
    let allot = lab.bridge_conf(&["bench"], &[]);
    let host_local = bridge_conf(
        "1.0.0",
        &lab.network,
        &lab.bridge,
        json!({
            "type": "host-local",
            "dataDir": host_local_dir.path(),
            "ranges": [[{
                "subnet": "10.95.0.0/16",
                "rangeStart": "10.95.0.10",
                "rangeEnd": "10.95.3.250",
                "gateway": "10.95.0.1",
            }]],
        }),
    );

    let uname = std::process::Command::new("uname").arg("-r").output();
    let bridge_version = lab.call("bridge", "VERSION", "{}").run(None);
    println!("== cni_cycle: ADD+DEL through the bridge plugin, allot vs host-local ==");
    println!(
        "machine: nproc {} | {} | kernel {} | loadavg {}",
        thread::available_parallelism().map_or(0, |n| n.get()),
        first_line("/proc/cpuinfo", "model name"),
        uname.map_or("?".into(), |o| String::from_utf8_lossy(&o.stdout)
            .trim()
            .to_string()),
        std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .trim(),
    );
    println!("bridge plugin: {}", bridge_version.stdout.trim());
    println!(
        "allot: {} ; agent: {} (standalone, embedded store)",
        bin("allot").display(),
        bin("allot-agent").display()
    );
    println!(
        "cycle = ADD then DEL of a fresh container id in a pod namespace, plugins run in a private host namespace"
    );
    println!(
        "sequential: {cycles} cycles per IPAM (+{WARMUP} warm-up), allot and host-local alternating cycle by cycle"
    );
    println!(
        "concurrent: {threads} threads x {per_thread} cycles per IPAM, one pod namespace per thread, phases allot, host-local, host-local, allot"
    );
    println!("pools:\n{}", pools.trim());
    println!("allot config:      {allot}");
    println!("host-local config: {host_local}");
    println!();

    let [seq_allot, seq_host_local] = sequential(&lab, [&allot, &host_local], cycles);
    let [conc_allot, conc_host_local] =
        concurrent(&lab, [&allot, &host_local], threads, per_thread);
    let runs = [
        ("sequential", "allot", seq_allot),
        ("sequential", "host-local", seq_host_local),
        ("concurrent", "allot", conc_allot),
        ("concurrent", "host-local", conc_host_local),
    ];

    println!(
        "{:<11} {:<11} {:>6} {:>11} {:>11} {:>11} {:>11} {:>11} {:>9}",
        "mode", "ipam", "cycles", "mean", "p50", "p99", "ADD p50", "DEL p50", "cycles/s"
    );
    for (mode, ipam, s) in &runs {
        println!(
            "{:<11} {:<11} {:>6} {:>11} {:>11} {:>11} {:>11} {:>11} {:>9.1}",
            mode,
            ipam,
            s.cycles,
            ms(s.mean),
            ms(s.p50),
            ms(s.p99),
            ms(s.add_p50),
            ms(s.del_p50),
            s.cycles as f64 / s.wall.as_secs_f64()
        );
    }
    println!();
    for pair in runs.chunks(2) {
        let (mode, _, a) = &pair[0];
        let (_, _, h) = &pair[1];
        let r = |x: Duration, y: Duration| x.as_secs_f64() / y.as_secs_f64();
        println!(
            "ratio allot/host-local ({mode}): mean {:.2}x  p50 {:.2}x  p99 {:.2}x  ADD p50 {:.2}x",
            r(a.mean, h.mean),
            r(a.p50, h.p50),
            r(a.p99, h.p99),
            r(a.add_p50, h.add_p50)
        );
    }
    println!(
        "loadavg after: {}",
        std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .trim()
    );

    let (total, free) = lab.agent.pool_counts("bench");
    assert_eq!(
        total,
        free,
        "allot leaked {} claims over the benchmark",
        total - free
    );
}
