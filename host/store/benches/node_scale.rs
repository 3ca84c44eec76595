//! The node path at scale, on the embedded SQLite store: what a request costs with 100,000
//! claims in the store, how long installing a /8 pool takes, and what GC of 3,000 leaks costs.
//!
//! `cargo bench -p allot-store --bench node_scale` (results: docs/benchmarks.md). The policy is
//! a minimal native one (the CNI defaults in order), so the figures are the engine's and the
//! store's, not the policy runtime's.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use allot_core::store::{Attachment, Claim, PodRef, Store, system_clock};
use allot_engine::testing::{CniDefaultsPolicy, pool, request};
use allot_engine::{Engine, EngineConfig};
use allot_store::SqliteStore;

const CLAIMS: usize = 100_000;

/// 100,000 claims of other pods in pool `big` (10.0.0.0/8), written in batches.
fn fill(store: &SqliteStore) {
    let claims: Vec<Claim> = (0..CLAIMS)
        .map(|i| Claim {
            address: IpAddr::from(std::net::Ipv4Addr::from(
                u32::from_be_bytes([10, 1, 0, 0]) + i as u32,
            )),
            pool: "big".into(),
            network: "bench".into(),
            attachment: Some(Attachment {
                container_id: format!("other-{i}"),
                interface: "eth0".into(),
            }),
            pod: PodRef {
                namespace: "ns".into(),
                name: format!("other-{i}"),
                uid: format!("u{i}"),
                ..Default::default()
            },
            node: String::new(),
            updated_at: 1,
        })
        .collect();
    for batch in claims.chunks(5000) {
        store.claim(batch).expect("fill");
    }
}

fn percentile(samples: &mut [Duration], p: f64) -> Duration {
    samples.sort();
    samples[((samples.len() - 1) as f64 * p) as usize]
}

fn report(what: &str, samples: &mut [Duration]) {
    let p50 = percentile(samples, 0.5);
    let p99 = percentile(samples, 0.99);
    println!(
        "{what:<48} p50 {:>9.3} ms   p99 {:>9.3} ms   ({} runs)",
        p50.as_secs_f64() * 1e3,
        p99.as_secs_f64() * 1e3,
        samples.len()
    );
}

fn main() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = Arc::new(SqliteStore::open(dir.path().join("claims.db")).expect("open"));
    let t = Instant::now();
    fill(&store);
    println!(
        "wrote {CLAIMS} claims in {:.1} s",
        t.elapsed().as_secs_f64()
    );

    let config = EngineConfig {
        cooldown: 0,
        gc_grace: 0,
        ..EngineConfig::default()
    };
    let engine = Engine::with_config(store.clone(), CniDefaultsPolicy, config, system_clock());
    let t = Instant::now();
    engine
        .load(vec![pool("big", "10.0.0.0/8")], vec![], vec![])
        .expect("load");
    println!(
        "{:<48} {:>9.1} ms",
        "install a /8 pool over 100,000 claims",
        t.elapsed().as_secs_f64() * 1e3
    );
    let t = Instant::now();
    engine.resync().expect("resync");
    println!(
        "{:<48} {:>9.1} ms",
        "resync (snapshot + rebuild of the /8's index)",
        t.elapsed().as_secs_f64() * 1e3
    );

    let runs = 200;
    let mut plain = Vec::with_capacity(runs);
    let mut stateful_fresh = Vec::with_capacity(runs);
    let mut stateful_back = Vec::with_capacity(runs);
    let mut del = Vec::with_capacity(runs);
    for i in 0..runs {
        let t = Instant::now();
        engine
            .add(&request(
                &format!("plain-{i}"),
                &format!("plain-{i}"),
                false,
            ))
            .expect("add");
        plain.push(t.elapsed());
        let t = Instant::now();
        engine
            .add(&request(&format!("s1-{i}"), &format!("web-{i}"), true))
            .expect("stateful add");
        stateful_fresh.push(t.elapsed());
        let t = Instant::now();
        engine
            .del(&Attachment {
                container_id: format!("s1-{i}"),
                interface: "eth0".into(),
            })
            .expect("del");
        del.push(t.elapsed());
        let t = Instant::now();
        engine
            .add(&request(&format!("s2-{i}"), &format!("web-{i}"), true))
            .expect("stateful add back");
        stateful_back.push(t.elapsed());
    }
    report("ADD (100,000 claims in the store)", &mut plain);
    report("StatefulSet ADD, new pod", &mut stateful_fresh);
    report("StatefulSet DEL (address kept)", &mut del);
    report(
        "StatefulSet ADD, pod back (takes its address)",
        &mut stateful_back,
    );

    // GC: 3,000 attachments of this network are gone; two looks release them.
    let leaked: Vec<Claim> = (0..3000)
        .map(|i| Claim {
            address: IpAddr::from([10, 200, (i >> 8) as u8, i as u8]),
            pool: "big".into(),
            network: "leaky".into(),
            attachment: Some(Attachment {
                container_id: format!("gone-{i}"),
                interface: "eth0".into(),
            }),
            pod: PodRef::default(),
            node: String::new(),
            updated_at: 1,
        })
        .collect();
    store.claim(&leaked).expect("leaks");
    let valid = BTreeSet::new();
    let t = Instant::now();
    let first = engine.gc("leaky", &valid).expect("gc");
    let look = t.elapsed();
    let t = Instant::now();
    let second = engine.gc("leaky", &valid).expect("gc");
    let release = t.elapsed();
    assert_eq!((first.suspects, second.released.len()), (3000, 3000));
    println!(
        "{:<48} {:>9.1} ms",
        "GC first look (3,000 suspects)",
        look.as_secs_f64() * 1e3
    );
    println!(
        "{:<48} {:>9.1} ms",
        "GC second look, releasing 3,000",
        release.as_secs_f64() * 1e3
    );
}
