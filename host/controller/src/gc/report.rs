//! `allotctl gc --dry-run`: what the collector would release and why, from one fresh list of
//! pods, nodes and StatefulSets, without writing anything.

use std::sync::Arc;

use allot_core::gc::{LeakReason, NotBefore, Verdict, decide};
use allot_core::store::{Claim, Store};
use allot_index::{ClusterIndex, IndexResource};
use allot_k8s::openapi::api::apps::v1::StatefulSet;
use allot_k8s::openapi::api::core::v1::{Node, Pod};
use anyhow::Context as _;
use kube::api::{Api, ListParams};
use serde::de::DeserializeOwned;

use super::GcSettings;

/// One leak the table finds.
#[derive(Clone, Debug)]
pub struct Finding {
    pub claim: Claim,
    pub reason: LeakReason,
    /// From when the collector may release it.
    pub not_before: NotBefore,
}

/// Lists every object of a kind in pages of 500 (one snapshot, as kubectl does); `what` names
/// the kind in the error.
pub async fn list_all<K>(api: Api<K>, what: &str) -> anyhow::Result<Vec<K>>
where
    K: Clone + DeserializeOwned + std::fmt::Debug,
{
    let mut items = Vec::new();
    let mut params = ListParams::default().limit(500);
    loop {
        let page = api
            .list(&params)
            .await
            .with_context(|| format!("cannot list {what}; check that this kubeconfig may"))?;
        items.extend(page.items);
        match page.metadata.continue_ {
            Some(token) if !token.is_empty() => params = params.continue_token(&token),
            _ => return Ok(items),
        }
    }
}

/// The index of one fresh list of pods, nodes and StatefulSets: what GC's decision table
/// reads (`gc --dry-run`), and the start of the audit's (`ipam check`).
pub async fn fresh_workload_index(client: &kube::Client) -> anyhow::Result<ClusterIndex> {
    let mut index = ClusterIndex::new();
    IndexResource::<Pod>::reset(
        &mut index,
        list_all(Api::all(client.clone()), "pods").await?,
    );
    IndexResource::<Node>::reset(
        &mut index,
        list_all(Api::all(client.clone()), "nodes").await?,
    );
    IndexResource::<StatefulSet>::reset(
        &mut index,
        list_all(Api::all(client.clone()), "statefulsets").await?,
    );
    Ok(index)
}

/// Decides every claim of `store` against freshly listed pods, nodes and StatefulSets.
pub async fn dry_run(
    client: kube::Client,
    store: Arc<dyn Store>,
    settings: &GcSettings,
) -> anyhow::Result<Vec<Finding>> {
    let index = fresh_workload_index(&client).await?;
    let claims = tokio::task::spawn_blocking(move || store.all())
        .await?
        .context("cannot read the claims")?;
    let mut findings: Vec<Finding> = claims
        .into_iter()
        .filter_map(|claim| {
            let pod = index.pod_state(&claim.pod.namespace, &claim.pod.name);
            match decide(
                &claim,
                pod.as_ref(),
                index.owner_state(&claim),
                &settings.table,
            ) {
                Verdict::Leak { reason, not_before } => Some(Finding {
                    claim,
                    reason,
                    not_before,
                }),
                Verdict::Keep(_) => None,
            }
        })
        .collect();
    findings.sort_by(|a, b| {
        (&a.claim.pod.namespace, &a.claim.pod.name, a.claim.address).cmp(&(
            &b.claim.pod.namespace,
            &b.claim.pod.name,
            b.claim.address,
        ))
    });
    Ok(findings)
}

/// When a finding would be released, in words: the collector still needs its two sightings
/// `grace` seconds apart and a fresh read of the pod.
pub fn when(f: &Finding, now: u64, settings: &GcSettings) -> String {
    let grace = settings.grace;
    match f.not_before {
        NotBefore::At(t) if t > now => format!(
            "in {} s (then after a second sighting, {grace} s after the first)",
            t - now
        ),
        NotBefore::AfterFirstSighting(d) if d > grace => {
            format!("{d} s after it is first seen")
        }
        _ => format!("at its second sighting, {grace} s after the first"),
    }
}
