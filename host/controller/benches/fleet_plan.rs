//! Planning a fleet: 10,000 clusters from a /8 with exclusions, from scratch and again with
//! every allocation already held (the steady state a controller re-plans), in one run.
//!
//! `cargo bench -p allot-controller --bench fleet_plan` (results: docs/benchmarks.md).

use std::hint::black_box;
use std::time::{Duration, Instant};

use allot_controller::fleet::{FleetCluster, plan};
use allot_k8s::{IPAMAllocation, IPAMAllocationSpec, IPAMPool};

const CLUSTERS: usize = 10_000;

fn pool() -> IPAMPool {
    serde_yaml::from_str(
        "apiVersion: allot.dev/v1alpha1
kind: IPAMPool
metadata: {name: big}
spec:
  datacenters:
    dc1:
      type: range
      poolCidr: 10.0.0.0/8
      allocationRange: 100
      excludePrefixes: [10.0.0.0/16, 10.0.128.0/24, 10.128.0.0/12]
      excludeRanges: [10.1.0.0-10.1.0.255, 10.2.3.4, 10.3.0.7-10.3.9.200]
    dc2:
      type: prefix
      poolCidr: 10.0.0.0/8
      allocationPrefix: 24
      excludePrefixes: [10.0.0.0/16, 10.64.0.0/10]
",
    )
    .expect("a valid pool")
}

fn clusters() -> Vec<FleetCluster> {
    (0..CLUSTERS)
        .map(|i| FleetCluster {
            namespace: format!("cluster-{i:05}"),
            name: format!("c{i:05}"),
            datacenter: if i % 2 == 0 { "dc1" } else { "dc2" }.to_string(),
            pools: None,
        })
        .collect()
}

fn time(runs: usize, mut f: impl FnMut()) -> (Duration, Duration) {
    let mut samples: Vec<Duration> = (0..runs)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed()
        })
        .collect();
    samples.sort();
    (samples[runs / 2], samples[runs - 1])
}

fn main() {
    let pools = [pool()];
    let fleet = clusters();
    let first = plan(&pools, &[], &fleet);
    assert_eq!(
        first.refused(),
        0,
        "{:?}",
        first.entries.iter().find(|e| e.outcome.is_err())
    );
    let held: Vec<IPAMAllocation> = first
        .entries
        .iter()
        .map(|e| {
            let (a, _) = e.outcome.as_ref().expect("planned");
            let mut o = IPAMAllocation::new("big", IPAMAllocationSpec::recording(a, &e.dc));
            o.metadata.namespace = Some(e.namespace.clone());
            o
        })
        .collect();
    let (p50, max) = time(5, || {
        black_box(plan(&pools, &[], &fleet));
    });
    println!(
        "plan {CLUSTERS} new clusters (2 datacenters of a /8):  p50 {:.1} ms  max {:.1} ms",
        p50.as_secs_f64() * 1e3,
        max.as_secs_f64() * 1e3
    );
    let (p50, max) = time(5, || {
        let again = plan(&pools, &held, &fleet);
        assert_eq!(again.refused(), 0);
        black_box(again);
    });
    println!(
        "re-plan with all {CLUSTERS} held (adopted, checked):   p50 {:.1} ms  max {:.1} ms",
        p50.as_secs_f64() * 1e3,
        max.as_secs_f64() * 1e3
    );
}
