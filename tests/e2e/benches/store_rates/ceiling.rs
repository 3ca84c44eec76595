//! The backends' own ceilings, with the agents' concurrency: `clients` clients (each its own
//! connection), `load.per_agent` closed loops each, every loop writing a claim, holding it,
//! and removing it, straight through the backend's client.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use allot_k8s::{BlockClaim, IPBlock, IPBlockSpec};
use futures::{StreamExt, stream};
use kube::Api;
use kube::api::PostParams;

use crate::measure::{Load, Tally};

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// A claim of realistic size (a 64-hex container ID, a UUID, a ReplicaSet pod's name).
pub fn claim(n: usize) -> BlockClaim {
    BlockClaim {
        pool: "shared".into(),
        network: "bench".into(),
        container_id: Some(format!("{:064x}", n as u128 * 0x9e37_79b9_7f4a_7c15)),
        interface: Some("eth0".into()),
        namespace: format!("team-{}", n % 200),
        pod: format!("web-{n}-7d9f8c6b5-x2x4z"),
        uid: format!("00000000-0000-4000-8000-{n:012x}"),
        owner_kind: Some("Deployment".into()),
        owner_name: Some(format!("web-{}", n % 5000)),
        node: format!("node-{}", n % 200),
        updated_at: 1_700_000_000 + n as u64,
    }
}

/// Block `k` of the ceiling's range (10.250.0.0/16), holding claims of other pods until its
/// spec is `spec_bytes` long as JSON.
fn block(k: usize, spec_bytes: usize) -> IPBlock {
    let first = u32::from(std::net::Ipv4Addr::new(10, 250, 0, 0)) + 64 * k as u32;
    let a = std::net::Ipv4Addr::from(first).octets();
    let mut spec = IPBlockSpec {
        cidr: format!("{}/26", std::net::Ipv4Addr::from(first)),
        node: Some(format!("node-{k}")),
        ..Default::default()
    };
    let mut n = 0;
    while serde_json::to_string(&spec).unwrap().len() < spec_bytes && n < 48 {
        let address = std::net::Ipv4Addr::from(first + 63 - n as u32);
        spec.claims.insert(address.to_string(), claim(k * 64 + n));
        n += 1;
    }
    IPBlock::new(&format!("v4-{}-{}-{}-{}-26", a[0], a[1], a[2], a[3]), spec)
}

/// Replaces `block` after `edit`, on the version it holds; on a conflict reads it again and
/// edits that, until written (true) or `deadline` passes (false). Counts the conflicts, and
/// errors (then retried after a pause).
async fn write(
    api: &Api<IPBlock>,
    block: &mut IPBlock,
    edit: impl Fn(&mut IPBlock),
    deadline: Instant,
    t: &mut Tally,
) -> bool {
    let name = block.metadata.name.clone().unwrap();
    loop {
        if Instant::now() > deadline {
            return false;
        }
        edit(block);
        t.requests += 1;
        match api.replace(&name, &PostParams::default(), block).await {
            Ok(written) => {
                *block = written;
                return true;
            }
            Err(kube::Error::Api(s)) if s.code == 409 => t.conflicts += 1,
            Err(e) => {
                t.error(e);
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
        t.requests += 1;
        match api.get(&name).await {
            Ok(fresh) => *block = fresh,
            Err(e) => t.error(e),
        }
    }
}

/// The API server's ceiling: each loop adds a claim to an IPBlock of `spec_bytes` and removes
/// it again, each a PUT with the resourceVersion read; every loop has a block of its own, or
/// (`shared`) all loops write one block, retrying on 409 as a store does. Returns the tally
/// (one latency per claim written) and the time measured. The blocks are deleted afterwards.
pub fn kube(
    kubeconfig: &Path,
    clients: usize,
    load: &Load,
    shared: bool,
    spec_bytes: usize,
) -> (Tally, Duration) {
    runtime().block_on(async {
        let mut apis = Vec::new();
        for _ in 0..clients {
            let client = allot_store::kube_client(Some(kubeconfig)).await.unwrap();
            apis.push(Api::<IPBlock>::all(client));
        }
        let loops = clients * load.per_agent;
        let objects = if shared { 1 } else { loops };
        let blocks: Vec<IPBlock> = (0..objects).map(|k| block(k, spec_bytes)).collect();
        let names: Vec<String> = blocks
            .iter()
            .map(|b| b.metadata.name.clone().unwrap())
            .collect();
        let pp = PostParams::default();
        let created: Vec<_> = stream::iter(blocks.iter().map(|b| apis[0].create(&pp, b)))
            .buffer_unordered(16)
            .collect()
            .await;
        for c in created {
            c.unwrap();
        }
        let started = Instant::now();
        let deadline = started + load.seconds;
        let mut tasks = Vec::new();
        for l in 0..loops {
            let api = apis[l / load.per_agent].clone();
            let name = names[if shared { 0 } else { l }].clone();
            let hold = load.hold;
            tasks.push(tokio::spawn(async move {
                let mut t = Tally::default();
                let mut block = api.get(&name).await.unwrap();
                // An address of this loop's own (the blocks' claims leave the low ones free).
                let address = format!("10.251.{}.{}", l / 256, l % 256);
                let mut n = 0;
                while Instant::now() < deadline {
                    n += 1;
                    let mine = claim(1_000_000 + l * 10_000 + n);
                    let t0 = Instant::now();
                    let add = |b: &mut IPBlock| {
                        b.spec.claims.insert(address.clone(), mine.clone());
                    };
                    if !write(&api, &mut block, add, deadline, &mut t).await {
                        break;
                    }
                    let done = Instant::now();
                    if done <= deadline {
                        t.latencies.push(done - t0);
                    }
                    tokio::time::sleep(hold).await;
                    let remove = |b: &mut IPBlock| {
                        b.spec.claims.remove(&address);
                    };
                    // Past the deadline the claim stays: the blocks are deleted afterwards.
                    write(&api, &mut block, remove, deadline, &mut t).await;
                }
                t
            }));
        }
        let mut all = Tally::default();
        for task in tasks {
            all.merge(task.await.unwrap());
        }
        let dp = Default::default();
        let _: Vec<_> = stream::iter(names.iter().map(|n| apis[0].delete(n, &dp)))
            .buffer_unordered(16)
            .collect()
            .await;
        (all, load.seconds)
    })
}

/// etcd's ceiling: each loop creates a key of its own in a transaction guarded on its
/// `create_revision == 0` (as a claim is created), holds it, and deletes it; `value` is a
/// claim's stored value.
pub fn etcd(endpoint: &str, clients: usize, load: &Load, value: &str) -> (Tally, Duration) {
    use etcd_client::{Compare, CompareOp, Txn, TxnOp};
    let value: Arc<str> = value.into();
    runtime().block_on(async {
        let mut kvs = Vec::new();
        for _ in 0..clients {
            let client = etcd_client::Client::connect([endpoint], None)
                .await
                .unwrap();
            kvs.push(client.kv_client());
        }
        let started = Instant::now();
        let deadline = started + load.seconds;
        let mut tasks = Vec::new();
        for l in 0..clients * load.per_agent {
            let mut kv = kvs[l / load.per_agent].clone();
            let (hold, value) = (load.hold, value.clone());
            tasks.push(tokio::spawn(async move {
                let mut t = Tally::default();
                let key = format!("/ceiling/claims/{l}");
                while Instant::now() < deadline {
                    let txn = Txn::new()
                        .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
                        .and_then([TxnOp::put(key.clone(), value.to_string(), None)]);
                    let t0 = Instant::now();
                    t.requests += 2;
                    match kv.txn(txn).await {
                        Ok(r) if r.succeeded() => {
                            let done = Instant::now();
                            if done <= deadline {
                                t.latencies.push(done - t0);
                            }
                        }
                        Ok(_) => t.error("the key existed"),
                        Err(e) => t.error(e),
                    }
                    tokio::time::sleep(hold).await;
                    if let Err(e) = kv.delete(key.clone(), None).await {
                        t.error(e);
                    }
                }
                t
            }));
        }
        let mut all = Tally::default();
        for task in tasks {
            all.merge(task.await.unwrap());
        }
        (all, load.seconds)
    })
}
