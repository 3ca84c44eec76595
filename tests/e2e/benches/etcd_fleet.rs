//! Several nodes on one etcd, measured against etcd's own write throughput in the same run.
//!
//! 1. **Raw puts**: `ALLOT_BENCH_PARALLEL` (default 40) clients of the etcd-client crate put
//!    distinct keys with claim-sized values as fast as etcd takes them: the physical limit.
//! 2. **Ten agents**: `ALLOT_BENCH_PODS` (default 1,000) ADDs through the `allot` plugin, as
//!    many at a time, over ten agents sharing one /22 pool in that etcd: ADD/s, p50/p99, lost
//!    races per 1,000. Then the DELs.
//! 3. **Following**: one store claims, another (as another node) waits on its watch: how long
//!    until the second sees the claim, per claim.
//!
//! `cargo bench -p allot-e2e --bench etcd_fleet` (as root, after `scripts/setup.sh` and a
//! release build). Prints every figure and the ratio agents / raw puts.

use std::time::{Duration, Instant};

use allot_core::store::{Attachment, Changes, Claim, PodRef, Store};
use allot_e2e::fleet::{Fleet, percentile};
use allot_e2e::{ippool, skip};
use allot_store::etcd::testing::EtcdServer;
use allot_store::{EtcdConfig, EtcdStore};

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1e3)
}

/// What a raw-throughput client writes, one per index.
#[derive(Clone, Copy)]
enum RawWrite {
    /// One key, a claim-sized value.
    Put,
    /// A transaction shaped like a claim: one key created under `create_revision == 0` and four
    /// more written with it, as a claim and its index, release and cursor keys are.
    ClaimTxn,
}

/// Writes per second of `clients` concurrent etcd-client clients making `total` writes.
fn raw_rate(endpoint: &str, write: RawWrite, clients: usize, total: usize) -> f64 {
    use etcd_client::{Compare, CompareOp, Txn, TxnOp};
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let client = etcd_client::Client::connect([endpoint], None)
            .await
            .unwrap();
        let value = "x".repeat(250); // about a claim's JSON
        let next = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let started = Instant::now();
        let tasks: Vec<_> = (0..clients)
            .map(|_| {
                let mut kv = client.kv_client();
                let next = next.clone();
                let value = value.clone();
                tokio::spawn(async move {
                    loop {
                        let i = next.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        if i >= total {
                            return;
                        }
                        match write {
                            RawWrite::Put => {
                                kv.put(format!("/bench/raw/{i}"), value.clone(), None)
                                    .await
                                    .unwrap();
                            }
                            RawWrite::ClaimTxn => {
                                let key = format!("/bench/txn/claims/{i}");
                                let txn = Txn::new()
                                    .when([Compare::create_revision(
                                        key.clone(),
                                        CompareOp::Equal,
                                        0,
                                    )])
                                    .and_then([
                                        TxnOp::put(key, value.clone(), None),
                                        TxnOp::put(format!("/bench/txn/att/{i}"), "", None),
                                        TxnOp::put(format!("/bench/txn/pod/{i}"), "", None),
                                        TxnOp::delete(format!("/bench/txn/released/{i}"), None),
                                        TxnOp::put(
                                            format!("/bench/txn/cursor/{}", i % 8),
                                            "x",
                                            None,
                                        ),
                                    ]);
                                assert!(kv.txn(txn).await.unwrap().succeeded());
                            }
                        }
                    }
                })
            })
            .collect();
        for t in tasks {
            t.await.unwrap();
        }
        total as f64 / started.elapsed().as_secs_f64()
    })
}

/// Per claim: the time from one store's claim returning to another store's watch reporting it.
fn follow_latency(url: &str, claims: u32) -> Vec<Duration> {
    let config = EtcdConfig::from_url(url).unwrap();
    let (writer, follower) = (
        EtcdStore::connect(&config).unwrap(),
        EtcdStore::connect(&config).unwrap(),
    );
    let me = Attachment {
        container_id: "bench".into(),
        interface: "eth0".into(),
    };
    let mut seen = follower.snapshot(0).unwrap().revision;
    let mut out = Vec::new();
    for i in 0..claims {
        let claim = Claim {
            address: std::net::IpAddr::from([10, 200, (i >> 8) as u8, i as u8]),
            pool: "bench".into(),
            network: "net".into(),
            attachment: Some(me.clone()),
            pod: PodRef::default(),
            node: String::new(),
            updated_at: 1,
        };
        writer.claim(std::slice::from_ref(&claim)).unwrap();
        let claimed = Instant::now();
        assert!(
            follower.wait_for_change(seen, Duration::from_secs(5)),
            "the follower saw the claim"
        );
        out.push(claimed.elapsed());
        if let Changes::Since { revision, .. } = follower.changes_since(seen).unwrap() {
            seen = revision;
        }
    }
    out.sort();
    out
}

/// etcd's count of KV requests it answered, by method (`Range`, `Txn`, `Put`), from its
/// Prometheus endpoint on the client port.
fn etcd_requests(endpoint: &str) -> std::collections::BTreeMap<String, f64> {
    use std::io::{Read, Write};
    let mut out = std::collections::BTreeMap::new();
    let Ok(mut conn) = std::net::TcpStream::connect(endpoint) else {
        return out;
    };
    let _ = write!(conn, "GET /metrics HTTP/1.0\r\nHost: {endpoint}\r\n\r\n");
    let mut text = String::new();
    let _ = conn.read_to_string(&mut text);
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("grpc_server_handled_total{") else {
            continue;
        };
        if !rest.contains("grpc_service=\"etcdserverpb.KV\"") {
            continue;
        }
        let method = rest
            .split("grpc_method=\"")
            .nth(1)
            .and_then(|m| m.split('"').next());
        let value = line.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok());
        if let (Some(method), Some(value)) = (method, value) {
            *out.entry(method.to_string()).or_default() += value;
        }
    }
    out
}

/// Requests per ADD, by method, between two readings of [`etcd_requests`].
fn per_add(
    before: &std::collections::BTreeMap<String, f64>,
    after: &std::collections::BTreeMap<String, f64>,
    adds: usize,
) -> String {
    after
        .iter()
        .filter_map(|(method, n)| {
            let d = n - before.get(method).copied().unwrap_or(0.0);
            (d > 0.0).then(|| format!("{method} {:.2}", d / adds as f64))
        })
        .collect::<Vec<_>>()
        .join(", ")
}

fn main() {
    if skip("etcd_fleet") {
        return;
    }
    let pods = env("ALLOT_BENCH_PODS", 1000);
    let parallel = env("ALLOT_BENCH_PARALLEL", 40);
    let etcd = EtcdServer::start();
    let url = etcd.url();

    let raw = raw_rate(&etcd.endpoint(), RawWrite::Put, parallel, 20_000);
    println!("raw etcd puts, {parallel} clients: {raw:.0} puts/s");
    let raw_txns = raw_rate(&etcd.endpoint(), RawWrite::ClaimTxn, parallel, 10_000);
    println!("raw claim-shaped etcd transactions, {parallel} clients: {raw_txns:.0} txn/s");

    let pool = ippool("wide", "10.70.0.0/22", Some("10.70.0.1"), &[]);
    let fleet = Fleet::start(
        "etcd_fleet",
        10,
        &pool,
        "wide",
        &[("--store", url.as_str())],
    )
    .expect("a fleet");
    let attachments = fleet.pods(pods);
    let requests_before = etcd_requests(&etcd.endpoint());
    let (added, elapsed) = fleet.run("ADD", &attachments, parallel);
    let requests_after = etcd_requests(&etcd.endpoint());
    for out in &added {
        out.expect_ok();
    }
    let mut latencies: Vec<Duration> = added.iter().map(|o| o.elapsed).collect();
    latencies.sort();
    let rate = pods as f64 / elapsed.as_secs_f64();
    let lost = fleet.lost_races();
    println!(
        "10 agents, {pods} ADDs through the plugin, {parallel} at a time: {rate:.0} ADD/s \
         (p50 {}, p99 {}), {:.1} lost races per 1,000 ADDs",
        ms(percentile(&latencies, 0.5)),
        ms(percentile(&latencies, 0.99)),
        lost as f64 * 1000.0 / pods as f64
    );
    println!(
        "ratio ADD/s to raw puts/s: {:.3} (an ADD is a claim transaction of 4 keys plus the \
         reads around it)",
        rate / raw
    );
    println!(
        "etcd requests per ADD (all ten agents, ticks included): {}",
        per_add(&requests_before, &requests_after, pods)
    );
    let (deleted, del_elapsed) = fleet.run("DEL", &attachments, parallel);
    for out in &deleted {
        out.expect_ok();
    }
    println!(
        "{pods} DELs: {:.0} DEL/s",
        pods as f64 / del_elapsed.as_secs_f64()
    );

    // The same again straight to the agents' API: what the agents and etcd cost without a
    // plugin process per ADD.
    let attachments = fleet.pods(pods);
    let lost_before = fleet.lost_races();
    let requests_before = etcd_requests(&etcd.endpoint());
    let (api, api_elapsed) = fleet.run_api(allot_api::ADD, &attachments, parallel);
    let requests_after = etcd_requests(&etcd.endpoint());
    let api_rate = pods as f64 / api_elapsed.as_secs_f64();
    println!(
        "the same {pods} ADDs straight to the agents' API: {api_rate:.0} ADD/s (p50 {}, p99 {}), \
         {:.1} lost races per 1,000; ratio to raw puts {:.3}, to claim-shaped transactions {:.3}",
        ms(percentile(&api, 0.5)),
        ms(percentile(&api, 0.99)),
        (fleet.lost_races() - lost_before) as f64 * 1000.0 / pods as f64,
        api_rate / raw,
        api_rate / raw_txns
    );
    println!(
        "etcd requests per ADD straight to the API: {}",
        per_add(&requests_before, &requests_after, pods)
    );
    let (_, api_del) = fleet.run_api(allot_api::DEL, &attachments, parallel);
    println!(
        "{pods} DELs straight to the API: {:.0} DEL/s",
        pods as f64 / api_del.as_secs_f64()
    );

    let follow = follow_latency(&url, 500);
    println!(
        "another node's claim reaches this node's feed {} µs (p50) / {} µs (p99) after the \
         claiming call returned (500 claims, one watch event each; 0: the event came first)",
        percentile(&follow, 0.5).as_micros(),
        percentile(&follow, 0.99).as_micros()
    );
}
