//! A StatefulSet's declared addresses (`ipam.allot.dev/ordinal-ips` on its pod template):
//! refused when the list cannot be read, or when an address is in a pool its pods may not use
//! (the pool's namespace and pod affinities against its namespace, the namespace's labels and
//! the template's labels: [`crate::tenancy`]), outside the pools the template allows, cannot be
//! handed out by its pool, is reserved for someone else, or is held by a pod that is not the
//! StatefulSet's own ([`allot_core::declared::refusals`] decides). The configuration matches
//! only StatefulSets carrying the annotation (a match condition), so no other StatefulSet write
//! ever waits for this webhook.
//!
//! An update that leaves the template's annotations and labels as they are (a scale, an image,
//! the garbage collector taking a finalizer off) is allowed unchecked: a pool or namespace
//! changed since must not hold up the StatefulSet's other changes or its deletion. The
//! controller judges what is declared again on every change and reserves nothing its pods may
//! not use.

use std::collections::BTreeMap;

use allot_core::declared::{Against, Barred, For, refusals};
use allot_core::{IpFamily, Pool, Reserved};
use allot_k8s::openapi::api::apps::v1::StatefulSet;
use allot_k8s::openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use allot_k8s::{IPPool, ReservedIP};
use allot_policy_sdk::annotations::{self, Selection};
use allot_policy_sdk::types::Label;
use allot_policy_sdk::{addresses, wildcard};
use kube::api::DynamicObject;
use kube::core::admission::AdmissionRequest;

use super::{Lookup, Verdict};
use crate::tenancy::Workload;

pub(super) async fn statefulset(
    request: &AdmissionRequest<DynamicObject>,
    lookup: &Lookup,
) -> Verdict {
    let Some(object) = &request.object else {
        return Verdict::default();
    };
    let decode = |o: &DynamicObject| -> Result<StatefulSet, Verdict> {
        serde_json::to_value(o)
            .and_then(serde_json::from_value)
            .map_err(|e| Verdict::refuse(format!("the StatefulSet cannot be read: {e}")))
    };
    let set = match decode(object) {
        Ok(s) => s,
        Err(refused) => return refused,
    };
    if let Some(old) = request.old_object.as_ref().and_then(|o| decode(o).ok())
        && template_metadata(&old) == template_metadata(&set)
    {
        return Verdict::default();
    }
    let template = template_metadata(&set);
    let labels: Vec<Label> = template
        .and_then(|m| m.annotations.as_ref())
        .into_iter()
        .flatten()
        .map(|(k, v)| Label {
            key: k.clone(),
            value: v.clone(),
        })
        .collect();
    let lists = match addresses::declared(&labels) {
        Ok(Some(lists)) => lists,
        Ok(None) => return Verdict::default(),
        Err(e) => return Verdict::refuse(e.message),
    };
    let mut entries: Vec<(IpFamily, Vec<String>)> =
        vec![(IpFamily::V4, vec![]), (IpFamily::V6, vec![])];
    for list in lists {
        entries[0].1.extend(list.ipv4);
        entries[1].1.extend(list.ipv6);
    }
    let named = match named_pools(&labels) {
        Ok(named) => named,
        Err(why) => return Verdict::refuse(why),
    };
    let owner = For::statefulset(
        set.metadata
            .namespace
            .as_deref()
            .unwrap_or(&request.namespace.clone().unwrap_or_default()),
        set.metadata.name.as_deref().unwrap_or(&request.name),
    );
    let read = tokio::try_join!(
        lookup.listed::<IPPool>("ippools"),
        lookup.listed::<ReservedIP>("reservedips"),
        lookup.claims(),
        lookup.namespace(&owner.namespace),
    );
    let (pools, reserved, claims, namespace) = match read {
        Ok(r) => r,
        Err(e) => return Verdict::cannot_check(&e),
    };
    let Some(namespace) = namespace else {
        return Verdict::refuse(format!(
            "namespace {} does not exist: create it first",
            owner.namespace
        ));
    };
    let pools: Vec<Pool> = pools
        .iter()
        .filter_map(|p| Pool::try_from(p).ok())
        .collect();
    let reserved: Vec<Reserved> = reserved
        .iter()
        .filter_map(|r| Reserved::try_from(r).ok())
        .collect();
    // Wildcards in the template's pool names, resolved against the pools there are.
    let allowed: Option<Vec<String>> = named.map(|names| {
        pools
            .iter()
            .map(|p| p.name().to_string())
            .filter(|p| {
                names
                    .iter()
                    .any(|n| n == p || (wildcard::is_pattern(n) && wildcard::matches(n, p)))
            })
            .collect()
    });
    let workload = Workload::new(
        &owner.namespace,
        namespace
            .metadata
            .labels
            .as_ref()
            .unwrap_or(&BTreeMap::new()),
        template
            .and_then(|m| m.labels.as_ref())
            .unwrap_or(&BTreeMap::new()),
    );
    let barred: BTreeMap<String, Barred> = pools
        .iter()
        .filter_map(|p| Some((p.name().to_string(), workload.barred(&p.spec)?)))
        .collect();
    let against = Against {
        pools: &pools,
        reserved: &reserved,
        claims: &claims,
        allowed: allowed.as_deref(),
        barred: &barred,
    };
    Verdict::refusals(
        refusals(&owner, &entries, &against)
            .into_iter()
            .map(|r| format!("{}: {r}", addresses::ORDINAL_IPS)),
    )
}

/// The pod template's metadata: what the checks read of the StatefulSet besides its name.
fn template_metadata(set: &StatefulSet) -> Option<&ObjectMeta> {
    set.spec.as_ref().and_then(|s| s.template.metadata.as_ref())
}

/// The pool names the template's `ippools` / `ippool` annotation lists (every interface), or
/// `None` when it names none.
fn named_pools(labels: &[Label]) -> Result<Option<Vec<String>>, String> {
    let selections: Vec<Selection> =
        if let Some(found) = annotations::find(labels, annotations::IPPOOLS) {
            annotations::selections(found).map_err(|e| e.message)?
        } else if let Some(found) = annotations::find(labels, annotations::IPPOOL) {
            vec![annotations::selection(found).map_err(|e| e.message)?]
        } else {
            return Ok(None);
        };
    Ok(Some(
        selections
            .into_iter()
            .flat_map(|s| s.ipv4.into_iter().chain(s.ipv6))
            .collect(),
    ))
}
