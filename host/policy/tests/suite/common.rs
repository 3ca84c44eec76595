//! Builders for inventories and requests shared by the policy host's tests.
#![allow(dead_code)]

use std::sync::Arc;

use allot_core::Pool;
use allot_core::policy::{CniDefaults, Inventory, Nic, PodInfo, Request};
use allot_core::spec::{IpPoolSpec, ObjectMeta};

pub fn pool(name: &str, subnet: &str, default: bool) -> Pool {
    Pool::from_spec(
        ObjectMeta {
            name: name.into(),
            ..Default::default()
        },
        IpPoolSpec {
            subnet: subnet.into(),
            default,
            ..Default::default()
        },
    )
    .unwrap()
}

/// `n` IPv4 default pools named p0000.. with /24 subnets.
pub fn inventory(n: usize) -> Arc<Inventory> {
    let pools: Vec<Pool> = (0..n)
        .map(|i| {
            pool(
                &format!("p{i:04}"),
                &format!("10.{}.{}.0/24", i / 256, i % 256),
                true,
            )
        })
        .collect();
    Arc::new(Inventory::build(1, &pools, &[], &[]))
}

pub fn request(inv: &Inventory) -> Request {
    Request {
        pod: PodInfo {
            namespace: "default".into(),
            name: "web-0".into(),
            uid: "uid-1".into(),
            ..Default::default()
        },
        nics: vec![Nic {
            interface: "eth0".into(),
            multus_name: String::new(),
        }],
        cni_defaults: CniDefaults::default(),
        free_counts: vec![10; inv.pools.len()],
        ..Default::default()
    }
}

/// The hostile fixture component, built by `make policies` (see the Makefile).
pub fn hostile_wasm() -> Vec<u8> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let path = root.join("target/wasm-policies/wasm32-wasip2/release/hostile_policy.wasm");
    std::fs::read(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e}; build the test policies first with `make policies`",
            path.display()
        )
    })
}
