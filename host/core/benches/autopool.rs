//! Subnet auto-pools: one reconcile pass's decisions for 1,000 workloads beside 1,000 other
//! pools, in an IPv4 /16 against an IPv6 /64 (and a /8), in one run.
//!
//! `cargo bench -p allot-core --bench autopool` (results: docs/benchmarks.md). Every workload
//! has its auto pool of 4 addresses; the other pools are single addresses spread through the
//! Subnet, so the free space is 2,000 runs. "steady" is a pass with nothing to do; "scale-up"
//! one where every workload went from 3 to 9 replicas (each pool grows by 6); "carve" creates
//! all 1,000 pools from nothing. Claims are not read (the controller reads them once per pass).

use std::collections::{BTreeMap, BTreeSet};
use std::hint::black_box;
use std::time::{Duration, Instant};

use allot_core::autopool::{
    Action, Inputs, IpNumber, PoolView, SubnetWant, Wants, Workload, labels, plan, pool_name,
};
use allot_core::policy::Application;
use allot_core::spec::{IpPoolSpec, ObjectMeta, SubnetSpec};
use allot_core::{AddrSet, IpFamily, Subnet};

const WORKLOADS: usize = 1_000;

struct Setup {
    workloads: Vec<Workload>,
    subnets: BTreeMap<String, Result<Subnet, String>>,
    pools: Vec<PoolView>,
    empty: [AddrSet; 2],
}

fn app(n: usize) -> Application {
    Application {
        kind: "Deployment".into(),
        namespace: "team".into(),
        name: format!("w{n:04}"),
    }
}

/// The `n`-th address of the subnet, as text.
fn nth(cidr: &ipnet::IpNet, n: u128) -> String {
    match cidr {
        ipnet::IpNet::V4(net) => {
            std::net::Ipv4Addr::from(u32::from(net.network()) + n as u32).to_string()
        }
        ipnet::IpNet::V6(net) => {
            std::net::Ipv6Addr::from(u128::from(net.network()) + n).to_string()
        }
    }
}

fn setup(cidr: &str, replicas: u64, with_pools: bool) -> Setup {
    let net: ipnet::IpNet = cidr.parse().unwrap();
    let family = IpFamily::of_net(&net);
    let subnet = Subnet::from_spec(
        ObjectMeta {
            name: "s".into(),
            ..Default::default()
        },
        SubnetSpec {
            subnet: cidr.into(),
            ..Default::default()
        },
    )
    .unwrap();
    let view = |name: String, labels: BTreeMap<String, String>, ips: Vec<String>| PoolView {
        addresses: Some(AddrSet::parse_entries(family, &ips).unwrap()),
        name,
        resource_version: "1".into(),
        labels,
        terminating: false,
        spec: Ok(IpPoolSpec {
            ip_version: Some(family.version()),
            subnet: cidr.into(),
            ips,
            ..Default::default()
        }),
    };
    let mut pools = Vec::new();
    let mut workloads = Vec::new();
    for n in 0..WORKLOADS {
        // Slots of 16 addresses: an auto pool of 4, a gap, a hand pool of 1, a gap.
        let base = 16 * n as u128 + 1;
        pools.push(view(
            format!("hand-{n:04}"),
            BTreeMap::new(),
            vec![nth(&net, base + 10)],
        ));
        if with_pools {
            pools.push(view(
                pool_name(&app(n), "s", family),
                labels(&app(n), "s", true),
                vec![format!("{}-{}", nth(&net, base), nth(&net, base + 3))],
            ));
        }
        workloads.push(Workload {
            app: app(n),
            replicas,
            deleting: false,
            wants: Ok(Wants {
                subnets: vec![SubnetWant {
                    subnet: "s".into(),
                    family,
                    nics: 1,
                }],
                ip_number: IpNumber::Flexible(1),
                reclaim: true,
            }),
        });
    }
    Setup {
        workloads,
        subnets: BTreeMap::from([("s".to_string(), Ok(subnet))]),
        pools,
        empty: [AddrSet::empty(IpFamily::V4), AddrSet::empty(IpFamily::V6)],
    }
}

/// A case: its name, its setup, and what its pass must decide.
type Case = (&'static str, Setup, fn(&[Action]) -> bool);

fn pass(s: &Setup) -> Vec<Action> {
    let inputs = Inputs {
        workloads: &s.workloads,
        subnets: &s.subnets,
        pools: &s.pools,
        reserved_v4: &s.empty[0],
        reserved_v6: &s.empty[1],
        pending: &[],
        followed_kinds: &BTreeSet::from(["Deployment".to_string()]),
    };
    plan(&inputs, &mut |current| AddrSet::empty(current.family()))
}

fn measure(s: &Setup, expect: impl Fn(&[Action]) -> bool) -> (Duration, Duration) {
    let mut samples = Vec::new();
    for _ in 0..21 {
        let t = Instant::now();
        let actions = black_box(pass(s));
        samples.push(t.elapsed());
        assert!(expect(&actions), "{:?}", actions.first());
    }
    samples.sort_unstable();
    (samples[samples.len() / 2], samples[samples.len() - 1])
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn main() {
    println!(
        "{:<10} {:<10} {:>10} {:>10}",
        "subnet", "pass", "p50 ms", "max ms"
    );
    // Warm up (allocator, caches, clock): the first case measured ran ~1.5x slow without it.
    measure(&setup("10.0.0.0/16", 3, true), |a| a.is_empty());
    let mut p50 = BTreeMap::new();
    for cidr in ["10.0.0.0/16", "10.0.0.0/8", "fd00::/64"] {
        let cases: [Case; 3] = [
            ("steady", setup(cidr, 3, true), |a| a.is_empty()),
            ("scale-up", setup(cidr, 9, true), |a| {
                a.len() == WORKLOADS && matches!(a[0], Action::Update { added: 6, .. })
            }),
            ("carve", setup(cidr, 3, false), |a| {
                a.len() == WORKLOADS && matches!(a[0], Action::Create { .. })
            }),
        ];
        for (name, s, expect) in cases {
            let (median, max) = measure(&s, expect);
            println!(
                "{cidr:<10} {name:<10} {:>10.2} {:>10.2}",
                ms(median),
                ms(max)
            );
            p50.insert((name, cidr), median);
        }
    }
    for name in ["steady", "scale-up", "carve"] {
        let ratio =
            |big: &str| p50[&(name, big)].as_secs_f64() / p50[&(name, "10.0.0.0/16")].as_secs_f64();
        println!(
            "{name}: /8 : /16 = {:.2}, IPv6 /64 : /16 = {:.2}",
            ratio("10.0.0.0/8"),
            ratio("fd00::/64")
        );
    }
}
