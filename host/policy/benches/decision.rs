//! A full decision through the default policy as a WebAssembly component and through the same
//! policy crate compiled natively, at 10, 100 and 1,000 pools, in one run.
//!
//! `cargo bench -p allot-policy --bench decision` (results: docs/benchmarks.md). Both sides
//! start from allot-core types: the WASM side converts, lowers, runs, lifts and validates; the
//! native side converts to the SDK's types and runs the same pipeline.

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use allot_core::IpFamily;
use allot_core::policy::{self as core, Policy};
use allot_core::spec::{LabelSelector, SelectorOperator};
use allot_policy::{Limits, PolicyEngine, PolicySource, workload};
use allot_policy_default::DefaultPolicy;
use allot_policy_sdk::types as sdk;

fn main() {
    let pool_counts: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let pool_counts = if pool_counts.is_empty() {
        vec![10, 100, 1000]
    } else {
        pool_counts
    };

    let engine = PolicyEngine::new(Limits::default(), None).expect("engine");
    let compile_started = Instant::now();
    let wasm = engine
        .load(&PolicySource::embedded_default())
        .expect("default policy");
    println!(
        "compiled the default policy in {:.1} ms",
        compile_started.elapsed().as_secs_f64() * 1e3
    );

    println!(
        "{:>6} {:>12} {:>12} {:>12} {:>12} {:>8}",
        "pools", "wasm p50", "wasm p99", "native p50", "native p99", "ratio"
    );
    for n in pool_counts {
        let inventory = Arc::new(workload::inventory(n));
        let request = workload::request(&inventory);
        let iterations = (2_000_000 / n).clamp(2_000, 50_000);

        let wasm_times = measure(iterations, || {
            black_box(wasm.decide(&inventory, &request).expect("wasm decision"));
        });

        let loaded = allot_policy_sdk::Loaded::new(sdk_inventory(&inventory));
        let check = loaded
            .decide::<DefaultPolicy>(&sdk_request(&inventory, &request))
            .expect("native decision");
        let wasm_check = wasm.decide(&inventory, &request).unwrap();
        assert_eq!(
            check.nics[0].families[0].order, wasm_check.nics[0].families[0].order,
            "native and wasm must decide alike"
        );
        let native_times = measure(iterations, || {
            let req = sdk_request(&inventory, &request);
            black_box(
                loaded
                    .decide::<DefaultPolicy>(&req)
                    .expect("native decision"),
            );
        });

        let (w50, w99) = (pct(&wasm_times, 0.5), pct(&wasm_times, 0.99));
        let (n50, n99) = (pct(&native_times, 0.5), pct(&native_times, 0.99));
        println!(
            "{n:>6} {:>9.1} µs {:>9.1} µs {:>9.1} µs {:>9.1} µs {:>8.2}",
            us(w50),
            us(w99),
            us(n50),
            us(n99),
            w50.as_secs_f64() / n50.as_secs_f64()
        );
    }
    deadline_overrun();
}

/// How long past its deadline a looping policy runs, and what the next call then costs.
fn deadline_overrun() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../target/wasm-policies/wasm32-wasip2/release/hostile_policy.wasm");
    let Ok(wasm) = std::fs::read(&path) else {
        println!("(deadline overrun not measured: build the hostile fixture with `make policies`)");
        return;
    };
    let deadline = Duration::from_millis(50);
    let limits = Limits {
        deadline,
        ..Limits::default()
    };
    let engine = PolicyEngine::new(limits, None).expect("engine");
    let hostile = engine
        .load(&PolicySource::bytes("hostile", wasm))
        .expect("hostile fixture");
    let inventory = Arc::new(workload::inventory(10));
    let good = workload::request(&inventory);
    let mut looping = good.clone();
    looping
        .pod
        .annotations
        .insert("hostile.allot.dev/mode".into(), "loop".into());
    let mut overruns = Vec::new();
    let mut recoveries = Vec::new();
    for _ in 0..20 {
        let t = Instant::now();
        let err = hostile
            .decide(&inventory, &looping)
            .expect_err("the loop must be stopped");
        assert_eq!(err.kind, allot_core::PolicyErrorKind::Deadline);
        overruns.push(t.elapsed().saturating_sub(deadline));
        let t = Instant::now();
        hostile
            .decide(&inventory, &good)
            .expect("the next call succeeds");
        recoveries.push(t.elapsed());
    }
    overruns.sort_unstable();
    recoveries.sort_unstable();
    println!(
        "looping policy, deadline 50 ms: stopped {:.2} ms past it (p50), {:.2} ms (max); next call {:.0} µs (p50, new instance)",
        pct(&overruns, 0.5).as_secs_f64() * 1e3,
        overruns.last().unwrap().as_secs_f64() * 1e3,
        us(pct(&recoveries, 0.5))
    );
}

fn measure(iterations: usize, mut f: impl FnMut()) -> Vec<Duration> {
    for _ in 0..iterations / 10 {
        f();
    }
    let mut samples: Vec<Duration> = (0..iterations)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed()
        })
        .collect();
    samples.sort_unstable();
    samples
}

fn pct(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn family(f: IpFamily) -> sdk::IpFamily {
    match f {
        IpFamily::V4 => sdk::IpFamily::Ipv4,
        IpFamily::V6 => sdk::IpFamily::Ipv6,
    }
}

fn labels(l: &core::Labels) -> Vec<sdk::Label> {
    l.iter()
        .map(|(k, v)| sdk::Label {
            key: k.clone(),
            value: v.clone(),
        })
        .collect()
}

fn selector(s: &LabelSelector) -> sdk::LabelSelector {
    sdk::LabelSelector {
        match_labels: labels(&s.match_labels),
        match_expressions: s
            .match_expressions
            .iter()
            .map(|r| sdk::SelectorRequirement {
                key: r.key.clone(),
                operator: match r.operator {
                    SelectorOperator::In => sdk::SelectorOperator::In,
                    SelectorOperator::NotIn => sdk::SelectorOperator::NotIn,
                    SelectorOperator::Exists => sdk::SelectorOperator::Exists,
                    SelectorOperator::DoesNotExist => sdk::SelectorOperator::DoesNotExist,
                },
                values: r.values.clone(),
            })
            .collect(),
    }
}

fn sdk_inventory(inv: &core::Inventory) -> sdk::Inventory {
    sdk::Inventory {
        generation: inv.generation,
        pools: inv
            .pools
            .iter()
            .map(|p| sdk::Pool {
                name: p.name.clone(),
                labels: labels(&p.labels),
                ip_version: family(p.family),
                subnet: p.spec.subnet.clone(),
                ips: p.spec.ips.clone(),
                exclude_ips: p.spec.exclude_ips.clone(),
                gateway: p.spec.gateway.clone(),
                routes: vec![],
                pod_affinity: p.spec.pod_affinity.as_ref().map(selector),
                namespace_affinity: p.spec.namespace_affinity.as_ref().map(selector),
                node_affinity: p.spec.node_affinity.as_ref().map(selector),
                namespace_name: p.spec.namespace_name.clone(),
                node_name: p.spec.node_name.clone(),
                multus_name: p.spec.multus_name.clone(),
                default: p.spec.default,
                disable: p.spec.disable,
                terminating: p.terminating,
                total_count: p.total_count,
                all_excluded: p.all_excluded,
                all_reserved: p.all_reserved,
                subnet_owner: p.subnet_owner.clone(),
                application: None,
            })
            .collect(),
        subnets: vec![],
    }
}

fn sdk_request(inv: &core::Inventory, r: &core::Request) -> sdk::Request {
    sdk::Request {
        inventory_generation: inv.generation,
        pod: sdk::Pod {
            namespace: r.pod.namespace.clone(),
            name: r.pod.name.clone(),
            uid: r.pod.uid.clone(),
            labels: labels(&r.pod.labels),
            annotations: labels(&r.pod.annotations),
            owner: r.pod.owner.as_ref().map(|o| sdk::Owner {
                kind: o.kind.clone(),
                name: o.name.clone(),
            }),
        },
        // Natively nothing crosses a sandbox: the namespace and node are always there.
        namespace: Some(sdk::Namespace {
            name: r.namespace.name.clone(),
            labels: labels(&r.namespace.labels),
            annotations: labels(&r.namespace.annotations),
        }),
        node: Some(sdk::Node {
            name: r.node.name.clone(),
            labels: labels(&r.node.labels),
        }),
        nics: r
            .nics
            .iter()
            .map(|n| sdk::Nic {
                interface: n.interface.clone(),
                multus_name: n.multus_name.clone(),
            })
            .collect(),
        cni_defaults: sdk::CniDefaults {
            ipv4: r.cni_defaults.ipv4.clone(),
            ipv6: r.cni_defaults.ipv6.clone(),
        },
        free_counts: r.free_counts.clone(),
    }
}
