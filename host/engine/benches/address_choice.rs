//! Choosing a free address in a /8 at 90% use against a /24 at 90% use, in one run.
//!
//! `cargo bench -p allot-engine --bench address_choice` (results: docs/benchmarks.md). Every 10th
//! address is free (the worst layout for the index: one free range per free address). One
//! operation takes the next free address and returns it, so the pool stays at 90% and the cursor
//! keeps moving through the whole pool.

use std::hint::black_box;
use std::time::{Duration, Instant};

use allot_core::AddrSet;
use allot_core::addr::{IpFamily, u128_to_addr};
use allot_engine::free::FreeIndex;

fn pool_at_90_percent(net: &str) -> (FreeIndex, usize) {
    let net: ipnet::IpNet = net.parse().unwrap();
    let all = AddrSet::from_net(&net);
    let mut index = FreeIndex::new(&all);
    let base = match net.network() {
        std::net::IpAddr::V4(a) => u32::from(a) as u128,
        std::net::IpAddr::V6(_) => unreachable!(),
    };
    let size = all.len() as u128;
    for i in 0..size {
        if i % 10 != 0 {
            index.remove(u128_to_addr(IpFamily::V4, base + i));
        }
    }
    let free = index.free_count() as usize;
    (index, free)
}

fn measure(index: &mut FreeIndex, ops: usize) -> Vec<Duration> {
    let mut samples = Vec::with_capacity(ops / 100);
    // Time batches of 100 operations: one operation is shorter than the clock's resolution.
    for _ in 0..ops / 100 {
        let t = Instant::now();
        for _ in 0..100 {
            let a = index.take_next().expect("90% used leaves room");
            black_box(a);
            index.insert(a);
        }
        samples.push(t.elapsed() / 100);
    }
    samples.sort_unstable();
    samples
}

fn pct(s: &[Duration], p: f64) -> Duration {
    s[((s.len() - 1) as f64 * p).round() as usize]
}

fn main() {
    let started = Instant::now();
    let (mut small, small_free) = pool_at_90_percent("10.1.0.0/24");
    let (mut big, big_free) = pool_at_90_percent("10.0.0.0/8");
    println!(
        "built the indexes in {:.1} s: /24 with {small_free} free, /8 with {big_free} free",
        started.elapsed().as_secs_f64()
    );
    let ops = 2_000_000;
    measure(&mut small, ops / 10);
    measure(&mut big, ops / 10);
    let s = measure(&mut small, ops);
    let b = measure(&mut big, ops);
    let ns = |d: Duration| d.as_secs_f64() * 1e9;
    println!("{:>6} {:>12} {:>12}", "pool", "p50/op", "p99/op");
    println!(
        "{:>6} {:>9.0} ns {:>9.0} ns",
        "/24",
        ns(pct(&s, 0.5)),
        ns(pct(&s, 0.99))
    );
    println!(
        "{:>6} {:>9.0} ns {:>9.0} ns",
        "/8",
        ns(pct(&b, 0.5)),
        ns(pct(&b, 0.99))
    );
    println!(
        "ratio /8 / /24 (p50): {:.2}",
        pct(&b, 0.5).as_secs_f64() / pct(&s, 0.5).as_secs_f64()
    );
}
