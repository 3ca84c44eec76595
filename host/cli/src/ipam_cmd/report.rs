//! The report of `allotctl ipam check`: a table for people, JSON (`-o json`) for tools and for
//! `ipam release --from-report`, which reads each leaked claim back exactly as it was found.
//!
//! ```json
//! {"kind": "IPAMReport", "checkedAt": 1800000000,
//!  "counts": {"leaked-claim": 1, "unclaimed-address": 0, …},
//!  "findings": [{"kind": "leaked-claim", "message": "…", "address": "…", "reason": "pod-deleted",
//!                "claim": {"address", "pool", "network", "containerID", "interface", "node",
//!                          "updatedAt", "pod": {"namespace", "name", "uid", "ownerKind",
//!                          "ownerName"}}}, …]}
//! ```

use allot_core::audit::{Finding, HeldBy, KINDS, PodId, Report};
use allot_core::store::{Attachment, Claim, PodRef};
use anyhow::{Context as _, bail};
use serde_json::{Value, json};

pub const KIND: &str = "IPAMReport";

fn pod(p: &PodId) -> Value {
    json!({"namespace": p.namespace, "name": p.name, "uid": p.uid})
}

fn claim(c: &Claim) -> Value {
    json!({
        "address": c.address.to_string(),
        "pool": c.pool,
        "network": c.network,
        "containerID": c.attachment.as_ref().map(|a| &a.container_id),
        "interface": c.attachment.as_ref().map(|a| &a.interface),
        "node": c.node,
        "updatedAt": c.updated_at,
        "pod": {
            "namespace": c.pod.namespace,
            "name": c.pod.name,
            "uid": c.pod.uid,
            "ownerKind": c.pod.owner_kind,
            "ownerName": c.pod.owner_name,
        },
    })
}

fn finding(f: &Finding) -> Value {
    let mut v = match f {
        Finding::LeakedClaim { claim: c, why } => json!({
            "address": c.address.to_string(),
            "reason": why.as_str(),
            "claim": claim(c),
        }),
        Finding::StatusDisagrees { claim: c, reported } => json!({
            "address": c.address.to_string(),
            "reported": reported.to_string(),
            "claim": claim(c),
        }),
        Finding::UnclaimedAddress {
            address,
            pool,
            pod: p,
            interface,
        } => json!({
            "address": address.to_string(), "pool": pool, "pod": pod(p), "interface": interface,
        }),
        Finding::ClaimedTwice { address, holders } => json!({
            "address": address.to_string(),
            "holders": holders.iter().map(|h| {
                let (by, pool, interface) = match &h.by {
                    HeldBy::Claim { pool } => ("claim", Some(pool.clone()), None),
                    HeldBy::Endpoint { interface } => ("endpoint", None, Some(interface.clone())),
                    HeldBy::PodStatus { interface } => ("pod-status", None, interface.clone()),
                };
                json!({"pod": pod(&h.pod), "by": by, "pool": pool, "interface": interface})
            }).collect::<Vec<_>>(),
        }),
        Finding::EndpointWithoutClaim {
            address,
            endpoint,
            interface,
        } => json!({
            "address": address.to_string(), "endpoint": pod(endpoint), "interface": interface,
        }),
        Finding::PoolCount {
            pool,
            status_allocated,
            claims,
            status_total,
            total,
        } => json!({
            "pool": pool,
            "status": {"allocatedIPCount": status_allocated, "totalIPCount": status_total},
            "claims": claims,
            "total": total,
        }),
    };
    v["kind"] = json!(f.kind());
    v["message"] = json!(f.to_string());
    v
}

pub fn to_json(report: &Report, checked_at: u64) -> Value {
    let counts: serde_json::Map<String, Value> = KINDS
        .iter()
        .zip(report.counts())
        .map(|(k, n)| (k.to_string(), json!(n)))
        .collect();
    json!({
        "apiVersion": "allot.dev/v1alpha1",
        "kind": KIND,
        "checkedAt": checked_at,
        "counts": counts,
        "findings": report.findings.iter().map(finding).collect::<Vec<_>>(),
    })
}

pub fn print(report: &Report) {
    if report.is_clean() {
        println!(
            "no drift: every address in use is claimed for its pod, every claim has a live \
             holder, Endpoints and pool counts agree"
        );
        return;
    }
    for f in &report.findings {
        println!("{:<24} {f}", f.kind());
    }
    println!();
    let counts: Vec<String> = KINDS
        .iter()
        .zip(report.counts())
        .filter(|(_, n)| *n > 0)
        .map(|(k, n)| format!("{n} {k}"))
        .collect();
    println!(
        "{}; `allotctl ipam check -o json > report.json`, then `allotctl ipam release \
         --from-report report.json` releases the leaked claims still leaked then, once GC \
         would (its grace period after the report at least)",
        counts.join(", ")
    );
}

fn text(v: &Value, key: &str) -> anyhow::Result<String> {
    Ok(v.get(key)
        .and_then(Value::as_str)
        .with_context(|| format!("`{key}` is missing"))?
        .to_string())
}

fn optional(v: &Value, key: &str) -> Option<String> {
    v.get(key).and_then(Value::as_str).map(str::to_string)
}

/// When a report was made (`checkedAt`, unix seconds): its leaks' first sighting.
pub fn checked_at(report: &Value) -> anyhow::Result<u64> {
    report
        .get("checkedAt")
        .and_then(Value::as_u64)
        .context("`checkedAt` is missing: give the output of `allotctl ipam check -o json`")
}

/// The leaked claims a report lists, as they were found.
pub fn leaked_claims(report: &Value) -> anyhow::Result<Vec<Claim>> {
    if report.get("kind").and_then(Value::as_str) != Some(KIND) {
        bail!("its kind is not {KIND}: give the output of `allotctl ipam check -o json`");
    }
    let findings = report
        .get("findings")
        .and_then(Value::as_array)
        .context("`findings` is missing")?;
    findings
        .iter()
        .filter(|f| f.get("kind").and_then(Value::as_str) == Some(KINDS[0]))
        .enumerate()
        .map(|(i, f)| {
            let c = f
                .get("claim")
                .context("a leaked-claim finding without `claim`")?;
            let p = c.get("pod").context("`claim.pod` is missing")?;
            let attachment = match (optional(c, "containerID"), optional(c, "interface")) {
                (Some(container_id), Some(interface)) => Some(Attachment {
                    container_id,
                    interface,
                }),
                _ => None,
            };
            Ok(Claim {
                address: text(c, "address")?
                    .parse()
                    .context("`claim.address` is not an address")?,
                pool: text(c, "pool")?,
                network: optional(c, "network").unwrap_or_default(),
                attachment,
                pod: PodRef {
                    namespace: text(p, "namespace")?,
                    name: text(p, "name")?,
                    uid: text(p, "uid")?,
                    owner_kind: optional(p, "ownerKind"),
                    owner_name: optional(p, "ownerName"),
                },
                node: optional(c, "node").unwrap_or_default(),
                updated_at: c
                    .get("updatedAt")
                    .and_then(Value::as_u64)
                    .context("`claim.updatedAt` is missing")?,
            })
            .map_err(|e: anyhow::Error| e.context(format!("leaked claim #{}", i + 1)))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use allot_core::audit::LeakWhy;
    use allot_core::gc::{LeakReason, NotBefore};

    #[test]
    fn a_leaked_claim_reads_back_exactly_as_found() {
        let c = Claim {
            address: "192.0.2.12".parse().unwrap(),
            pool: "p".into(),
            network: "underlay".into(),
            attachment: Some(Attachment {
                container_id: "abc".into(),
                interface: "net1".into(),
            }),
            pod: PodRef {
                namespace: "web".into(),
                name: "gone".into(),
                uid: "u".into(),
                owner_kind: Some("StatefulSet".into()),
                owner_name: Some("db".into()),
            },
            node: "node-1".into(),
            updated_at: 1_800_000_000,
        };
        let mut detached = c.clone();
        detached.address = "192.0.2.13".parse().unwrap();
        detached.attachment = None;
        let report = Report {
            findings: vec![
                Finding::LeakedClaim {
                    claim: c.clone(),
                    why: LeakWhy::Gc {
                        reason: LeakReason::PodDeleted,
                        not_before: NotBefore::AfterFirstSighting(0),
                    },
                },
                Finding::LeakedClaim {
                    claim: detached.clone(),
                    why: LeakWhy::Gc {
                        reason: LeakReason::StatefulSetGone,
                        not_before: NotBefore::AfterFirstSighting(0),
                    },
                },
            ],
        };
        let text = serde_json::to_string(&to_json(&report, 7)).unwrap();
        let value = serde_json::from_str(&text).unwrap();
        let back = leaked_claims(&value).unwrap();
        assert_eq!(back, [c, detached]);
        assert_eq!(
            checked_at(&value).unwrap(),
            7,
            "the first sighting is read back"
        );
        let err = leaked_claims(&json!({"kind": "Pod"})).unwrap_err();
        assert!(err.to_string().contains("IPAMReport"), "{err}");
    }
}
