//! The agent's recent decisions as scenarios (`GET /v1/decisions`, `allotctl policy record`):
//! each is the inventory, pod, namespace, node and NICs the policy saw, with the decision it
//! made as the expectation, so that `allotctl policy test` against the same policy passes it
//! and `allotctl policy diff` shows what a new policy would decide differently.
//!
//! The inventory is written back as IPPool, Subnet and ReservedIP objects that rebuild it
//! exactly: each pool's free count becomes `status.allocatedIPCount` (its allocatable addresses
//! minus the free ones), and a pool whose every address was reserved gets a ReservedIP covering
//! them (the only reservation fact a policy sees is `all-reserved`).

use std::collections::BTreeMap;

use allot_api::{RecordedDecision, RecordedDecisions};
use allot_core::PolicyError;
use allot_core::policy::{Decision, FamilyDecision, Inventory, PoolRef, Request};
use allot_core::pool::Pool;
use allot_core::spec::{ObjectMeta, ReservedIpSpec};
use allot_policy::{DecisionLog, Recorded};
use serde_json::{Value, json};

pub fn recorded(log: Option<&DecisionLog>, node: &str) -> RecordedDecisions {
    let Some(log) = log else {
        return RecordedDecisions::default();
    };
    RecordedDecisions {
        capacity: log.capacity(),
        decisions: log.snapshot().iter().map(|r| decision(r, node)).collect(),
    }
}

fn decision(r: &Recorded, node: &str) -> RecordedDecision {
    let at =
        r.at.duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
    let req = &r.request;
    let pod = format!("{}/{}", req.pod.namespace, req.pod.name);
    let mut description = format!(
        "Recorded by allot-agent on node {node} (decision {} at unix time {at}): pod {pod}, \
         decided by policy {} (sha256 {}).",
        r.seq, r.policy, r.sha256
    );
    if let Some(e) = &r.fallback_from {
        description.push_str(&format!(
            " The cluster's policy faulted ({e}); the embedded default decided."
        ));
    }
    let mut scenario = inputs(&r.inventory, req);
    scenario["description"] = json!(description);
    scenario["expect"] = expect(&r.inventory, &r.result);
    RecordedDecision {
        seq: r.seq,
        at,
        policy: r.policy.clone(),
        sha256: r.sha256.clone(),
        fallback_from: r.fallback_from.as_ref().map(|e| e.to_string()),
        pod,
        scenario,
    }
}

fn object(kind: &str, meta: Value, spec: Value) -> Value {
    json!({"apiVersion": "allot.dev/v1alpha1", "kind": kind, "metadata": meta, "spec": spec})
}

fn inputs(inv: &Inventory, req: &Request) -> Value {
    let mut pools = Vec::new();
    let mut reserved = Vec::new();
    for (i, p) in inv.pools.iter().enumerate() {
        let free = req.free_counts.get(i).copied().unwrap_or(0);
        let meta = ObjectMeta {
            name: p.name.clone(),
            labels: p.labels.clone(),
            annotations: BTreeMap::new(),
            // Only its presence matters: the pool is being deleted.
            deletion_timestamp: p.terminating.then(|| "1970-01-01T00:00:00Z".to_string()),
        };
        if p.all_reserved
            && let Ok(pool) = Pool::from_spec(meta.clone(), p.spec.clone())
        {
            let ips = pool
                .allocatable()
                .ranges()
                .map(|(a, b)| {
                    if a == b {
                        a.to_string()
                    } else {
                        format!("{a}-{b}")
                    }
                })
                .collect();
            let spec = ReservedIpSpec {
                ip_version: Some(p.family.version()),
                ips,
            };
            reserved.push(object(
                "ReservedIP",
                json!({"name": format!("recorded-reserve-{}", p.name)}),
                serde_json::to_value(spec).unwrap_or_default(),
            ));
        }
        let allocated = if p.all_reserved {
            0
        } else {
            p.total_count.saturating_sub(free)
        };
        let mut pool = object(
            "IPPool",
            serde_json::to_value(&meta).unwrap_or_default(),
            serde_json::to_value(&p.spec).unwrap_or_default(),
        );
        pool["status"] = json!({"allocatedIPCount": allocated});
        pools.push(pool);
    }
    let subnets: Vec<Value> = inv
        .subnets
        .iter()
        .map(|s| {
            object(
                "Subnet",
                json!({"name": s.name}),
                serde_json::to_value(&s.spec).unwrap_or_default(),
            )
        })
        .collect();
    let mut pod = json!({
        "name": req.pod.name,
        "namespace": req.pod.namespace,
        "uid": req.pod.uid,
        "labels": req.pod.labels,
        "annotations": req.pod.annotations,
    });
    if let Some(owner) = &req.pod.owner {
        pod["owner"] = json!({"kind": owner.kind, "name": owner.name});
    }
    json!({
        "pools": pools,
        "subnets": subnets,
        "reservedIPs": reserved,
        "namespace": {
            "name": req.namespace.name,
            "labels": req.namespace.labels,
            "annotations": req.namespace.annotations,
        },
        "node": {"name": req.node.name, "labels": req.node.labels},
        "pod": pod,
        "nics": req.nics.iter().map(|n| json!({"interface": n.interface, "multusName": n.multus_name})).collect::<Vec<_>>(),
        "cniDefaults": {"ipv4": req.cni_defaults.ipv4, "ipv6": req.cni_defaults.ipv6},
    })
}

fn error(e: &PolicyError) -> Value {
    // A fault's message carries timings and the like: expect only its kind.
    if e.kind.is_fault() {
        json!({"errorKind": e.kind.as_str()})
    } else {
        json!({"error": e.message, "errorKind": e.kind.as_str()})
    }
}

fn expect(inv: &Inventory, result: &Result<Decision, PolicyError>) -> Value {
    let decision = match result {
        Ok(d) => d,
        Err(e) => return error(e),
    };
    let mut nics = serde_json::Map::new();
    for nic in &decision.nics {
        let value = match &nic.error {
            Some(e) => json!({"error": e.message, "errorKind": e.kind.as_str()}),
            None => {
                let mut v = json!({
                    "families": nic.families.iter().map(|f| f.family.to_string()).collect::<Vec<_>>(),
                    "cleanGateway": nic.clean_gateway,
                    "routes": nic.routes,
                });
                for f in &nic.families {
                    v[f.family.to_string()] = family(inv, f);
                }
                v
            }
        };
        nics.insert(nic.interface.clone(), value);
    }
    json!({"nics": nics})
}

fn family(inv: &Inventory, f: &FamilyDecision) -> Value {
    let name = |i: &u32| {
        inv.pools
            .get(*i as usize)
            .map_or_else(|| format!("#{i}"), |p| p.name.clone())
    };
    let mut v = json!({
        "rule": f.rule.as_str(),
        "source": f.source,
        "candidates": f.candidates.iter().map(name).collect::<Vec<_>>(),
        "order": f.order.iter().map(name).collect::<Vec<_>>(),
        "chosen": f.order.first().map(name),
    });
    let dropped: Vec<(String, &str)> = f
        .dropped
        .iter()
        .map(|d| {
            let pool = match &d.pool {
                PoolRef::Index(i) => name(i),
                PoolRef::Missing(n) => n.clone(),
            };
            (pool, d.reason.as_str())
        })
        .collect();
    let map: BTreeMap<&str, &str> = dropped.iter().map(|(n, r)| (n.as_str(), *r)).collect();
    // A name dropped twice (a pattern listed twice) cannot be said as a map: leave it unchecked.
    if map.len() == dropped.len() {
        v["dropped"] = json!(map);
    }
    v
}
