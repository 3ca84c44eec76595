//! The writes against the API. Every allocation and release is first one compare-and-swap on the
//! pool's record (`IPAMPool.status.allocations`, through the status subresource, carrying the
//! resourceVersion it was computed from); a writer that loses (409) waits a random moment
//! (growing with each loss), reads the pool again and decides again, up to [`MAX_ATTEMPTS`]
//! times. Only then are the `IPAMAllocation` and the
//! ConfigMap written, from the record: they are what users read, never what allocators trust.
//! A process that dies between the two leaves a record without its IPAMAllocation; the next
//! [`allocate`] for that cluster finds the record and writes it.
//!
//! An IPAMAllocation the record has no entry for (adopted, made by another tool, created
//! meanwhile) still holds addresses its cluster may use: a decision that could hand them out
//! lists the pool's IPAMAllocations and counts each as taken (`decide::holders`).

use std::collections::BTreeMap;
use std::time::Duration;

use allot_core::fleet::Allocation;
use allot_k8s::openapi::api::core::v1::ConfigMap;
use allot_k8s::{
    AllocationState, IPAMAllocation, IPAMAllocationSpec, IPAMAllocationStatus, IPAMPool,
    IPAMPoolStatus,
};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::json;

use super::decide::{Current, FleetCluster, Refusal, decide, depends_on_others, holders, records};

/// Compare-and-swap attempts on a pool's record before giving up.
pub const MAX_ATTEMPTS: usize = 16;
/// One API request's time limit.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// The ConfigMap in each cluster's namespace: `data: {POOL: "first-last,first-last"}` (or the
/// prefix's CIDR), as the multi-cluster IPAM proposal shows.
pub const CONFIG_MAP: &str = "allot-ipam-allocations";

#[derive(Debug, thiserror::Error)]
pub enum FleetApiError {
    #[error("{0}")]
    Refused(#[from] Refusal),
    #[error("IPAMPool {pool}: {attempts} record writes in a row lost to other writers; try again")]
    Contention { pool: String, attempts: usize },
    #[error("{what}: {message}")]
    Api { what: String, message: String },
}

/// What a Kubernetes API error means here, and what to do about it.
fn api_error(what: &str, e: kube::Error) -> FleetApiError {
    let message = match e {
        kube::Error::Api(s) if s.code == 403 => format!(
            "{}; the controller's ServiceAccount needs get, update on ipampools and \
             ipampools/status, and get, create, update, patch, delete on ipamallocations and \
             configmaps",
            s.message
        ),
        kube::Error::Api(s) if s.code == 404 && s.message.contains("the server could not find") => {
            "the API server does not serve ipampools.allot.dev; install allot's CRDs \
             (kubectl apply -f crds/)"
                .to_string()
        }
        kube::Error::Api(s) if s.code == 429 || s.code >= 500 => format!(
            "the API server answered {} {} ({}); retrying later may succeed",
            s.code, s.reason, s.message
        ),
        kube::Error::Api(s) => format!("{} {}: {}", s.code, s.reason, s.message),
        other => format!("{other}; is the API server reachable?"),
    };
    FleetApiError::Api {
        what: what.to_string(),
        message,
    }
}

/// Runs one request within [`REQUEST_TIMEOUT`], leaving its refusal to the caller.
async fn attempt<T>(
    what: &str,
    call: impl std::future::Future<Output = Result<T, kube::Error>>,
) -> Result<Result<T, kube::Error>, FleetApiError> {
    tokio::time::timeout(REQUEST_TIMEOUT, call)
        .await
        .map_err(|_| FleetApiError::Api {
            what: what.to_string(),
            message: format!("the API server did not answer within {REQUEST_TIMEOUT:?}"),
        })
}

async fn request<T>(
    what: &str,
    call: impl std::future::Future<Output = Result<T, kube::Error>>,
) -> Result<T, FleetApiError> {
    attempt(what, call).await?.map_err(|e| api_error(what, e))
}

/// After `lost` writes lost in a row (0: none, no wait): a random wait below 2^lost ms (capped
/// at 128 ms), so that writers that keep colliding spread out instead of colliding again in
/// lockstep.
async fn backoff(lost: usize) {
    if lost == 0 {
        return;
    }
    let cap = Duration::from_millis(1 << lost.min(7)).as_nanos() as u64;
    // Jitter from the clock's nanoseconds, mixed with a per-process counter: enough to
    // desynchronise writers without a random number generator.
    static CALLS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::from(d.subsec_nanos()));
    let seed = (nanos ^ n.wrapping_mul(0x9E37_79B9_7F4A_7C15)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    tokio::time::sleep(Duration::from_nanos((seed >> 11) % cap)).await;
}

fn is_conflict(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 409)
}

fn name(pool: &IPAMPool) -> String {
    pool.metadata.name.clone().unwrap_or_default()
}

/// Gives `cluster` its allocation from IPAMPool `pool_name` (a new one, the one it holds, or the
/// one it holds grown), recorded in the pool's status before anything else is written, and
/// returns the `IPAMAllocation` as written. An `IPAMAllocation` the pool has no record of (one
/// migrated from another allocator) is adopted when it fits the pool and overlaps nobody.
///
/// A refusal is written into the IPAMAllocation's status (created for the purpose when
/// missing) and returned; the cluster keeps whatever it held.
///
/// `allocate` adopts only this cluster's own IPAMAllocation; every other one holding addresses
/// the pool has no record of counts as taken (nobody is grown or served into it). [`sync`]
/// adopts them all.
pub async fn allocate(
    client: &Client,
    pool_name: &str,
    cluster: &FleetCluster,
) -> Result<IPAMAllocation, FleetApiError> {
    let pools: Api<IPAMPool> = Api::all(client.clone());
    let objects: Api<IPAMAllocation> = Api::namespaced(client.clone(), &cluster.namespace);
    let all_objects: Api<IPAMAllocation> = Api::all(client.clone());
    let named = ListParams::default().fields(&format!("metadata.name={pool_name}"));
    let ns = &cluster.namespace;
    let dc = &cluster.datacenter;
    let what = format!("IPAMAllocation {ns}/{pool_name}");
    let object = request(&what, objects.get_opt(pool_name)).await?;
    let adoptable = object
        .as_ref()
        .filter(|o| o.spec.dc == *dc)
        .map(|o| o.spec.allocation())
        .transpose()
        .map_err(|e| FleetApiError::Api {
            what: what.clone(),
            message: format!("{e}: fix its spec, or delete it to get a new allocation"),
        })?
        .flatten();
    for lost in 0..MAX_ATTEMPTS {
        backoff(lost).await;
        let Some(mut pool) =
            request(&format!("IPAMPool {pool_name}"), pools.get_opt(pool_name)).await?
        else {
            return refuse(
                &objects,
                pool_name,
                cluster,
                Refusal::NoPool {
                    pool: pool_name.to_string(),
                },
            )
            .await;
        };
        let Some(entry) = pool.spec.datacenters.get(dc).cloned() else {
            return refuse(
                &objects,
                pool_name,
                cluster,
                Refusal::NoDatacenter {
                    pool: pool_name.to_string(),
                    dc: dc.clone(),
                },
            )
            .await;
        };
        let mut status = pool.status.clone().unwrap_or_default();
        let held = match records(pool_name, &status.allocations) {
            Ok(held) => held,
            Err(refusal) => return refuse(&objects, pool_name, cluster, refusal).await,
        };
        // A record from another datacenter (the cluster moved) is replaced by this one.
        let recorded = held.get(ns).filter(|(d, _)| d == dc).map(|(_, a)| a);
        let current = match (recorded, &adoptable) {
            (Some(a), _) => Current::Recorded(a),
            (None, Some(a)) => Current::Adopted(a),
            (None, None) => Current::None,
        };
        let mut decision = decide(pool_name, dc, &entry, &[], ns, current);
        if depends_on_others(current, &decision) {
            // Listed after the pool was read, on every attempt. The listed IPAMAllocations
            // only add to what counts as taken, never take anything away from the record, so
            // the decision is at least as careful as one from the record alone; and the
            // record's compare-and-swap below still decides between allocators: one that
            // wrote since the pool was read makes this write fail, whatever the list showed.
            // (An allocator writes an IPAMAllocation only after its record.)
            let listed = request(
                &format!("IPAMAllocations {pool_name}"),
                all_objects.list(&named),
            )
            .await?;
            let others = listed
                .items
                .iter()
                .map(|o| (o.metadata.namespace.as_deref().unwrap_or_default(), &o.spec));
            decision = decide(
                pool_name,
                dc,
                &entry,
                &holders(&held, others, dc),
                ns,
                current,
            );
        }
        let decided = match decision {
            Ok((allocation, _)) => allocation,
            Err(refusal) => return refuse(&objects, pool_name, cluster, refusal).await,
        };
        if recorded != Some(&decided) {
            status
                .allocations
                .insert(ns.clone(), IPAMAllocationSpec::recording(&decided, dc));
            if !swap(&pools, &mut pool, status).await? {
                continue;
            }
        }
        let version = pool.status.as_ref().map_or(0, |s| s.record_version);
        let uid = pool.metadata.uid.clone();
        return project(client, pool_name, cluster, &decided, (version, uid)).await;
    }
    Err(FleetApiError::Contention {
        pool: pool_name.to_string(),
        attempts: MAX_ATTEMPTS,
    })
}

/// Writes `status` as the pool's record with a compare-and-swap on the resourceVersion `pool`
/// was read at. `false`: another writer won; read the pool again.
async fn swap(
    pools: &Api<IPAMPool>,
    pool: &mut IPAMPool,
    mut status: IPAMPoolStatus,
) -> Result<bool, FleetApiError> {
    let pool_name = name(pool);
    status.record_version += 1;
    status.clusters = Some(status.allocations.len() as u64);
    pool.status = Some(status);
    let what = format!("IPAMPool {pool_name} status");
    match attempt(
        &what,
        pools.replace_status(&pool_name, &PostParams::default(), pool),
    )
    .await?
    {
        Ok(written) => {
            *pool = written;
            Ok(true)
        }
        Err(e) if is_conflict(&e) => Ok(false),
        Err(e) => Err(api_error(&what, e)),
    }
}

/// Writes the IPAMAllocation and the ConfigMap key from the record of `version` (the record
/// version and the pool's uid).
async fn project(
    client: &Client,
    pool_name: &str,
    cluster: &FleetCluster,
    allocation: &Allocation,
    (version, pool_uid): (u64, Option<String>),
) -> Result<IPAMAllocation, FleetApiError> {
    let spec = IPAMAllocationSpec::recording(allocation, &cluster.datacenter);
    let status = IPAMAllocationStatus {
        state: Some(AllocationState::Allocated),
        message: Some(format!(
            "{} addresses from IPAMPool {pool_name}",
            allocation.len()
        )),
        record_version: Some(version),
        pool_uid,
    };
    let written = upsert(client, pool_name, cluster, spec, status).await?;
    let configmaps: Api<ConfigMap> = Api::namespaced(client.clone(), &cluster.namespace);
    let what = format!("ConfigMap {}/{CONFIG_MAP}", cluster.namespace);
    let patch = json!({"data": {pool_name: allocation.to_string()}});
    let patched = attempt(
        &what,
        configmaps.patch(CONFIG_MAP, &PatchParams::default(), &Patch::Merge(&patch)),
    )
    .await?;
    match patched {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 404 => {
            let mut cm = ConfigMap::default();
            cm.metadata.name = Some(CONFIG_MAP.to_string());
            cm.data = Some(BTreeMap::from([(
                pool_name.to_string(),
                allocation.to_string(),
            )]));
            match attempt(&what, configmaps.create(&PostParams::default(), &cm)).await? {
                Ok(_) => {}
                // Created by a writer for another pool meanwhile: add this pool's key.
                Err(e) if is_conflict(&e) => {
                    request(
                        &what,
                        configmaps.patch(
                            CONFIG_MAP,
                            &PatchParams::default(),
                            &Patch::Merge(&patch),
                        ),
                    )
                    .await?;
                }
                Err(e) => return Err(api_error(&what, e)),
            }
        }
        Err(e) => return Err(api_error(&what, e)),
    }
    Ok(written)
}

/// Creates or replaces IPAMAllocation `namespace/pool_name` with `spec` and `status`, unless it
/// already carries a newer record of the same pool (`status.recordVersion`, `status.poolUid`): a
/// slow writer never puts back an allocation that a later record changed.
async fn upsert(
    client: &Client,
    pool_name: &str,
    cluster: &FleetCluster,
    spec: IPAMAllocationSpec,
    status: IPAMAllocationStatus,
) -> Result<IPAMAllocation, FleetApiError> {
    let objects: Api<IPAMAllocation> = Api::namespaced(client.clone(), &cluster.namespace);
    let what = format!("IPAMAllocation {}/{pool_name}", cluster.namespace);
    for lost in 0..MAX_ATTEMPTS {
        backoff(lost).await;
        let existing = request(&what, objects.get_opt(pool_name)).await?;
        let mut object = match existing {
            Some(o) => {
                let newer = o.status.as_ref().is_some_and(|s| {
                    s.pool_uid == status.pool_uid && s.record_version > status.record_version
                });
                if newer || (o.spec == spec && o.status.as_ref() == Some(&status)) {
                    return Ok(o);
                }
                o
            }
            None => {
                let mut fresh = IPAMAllocation::new(pool_name, spec.clone());
                fresh.metadata.namespace = Some(cluster.namespace.clone());
                match attempt(&what, objects.create(&PostParams::default(), &fresh)).await? {
                    Ok(created) => created,
                    Err(e) if is_conflict(&e) => continue,
                    Err(e) => return Err(api_error(&what, e)),
                }
            }
        };
        if object.spec != spec {
            object.spec = spec.clone();
            object = match attempt(
                &what,
                objects.replace(pool_name, &PostParams::default(), &object),
            )
            .await?
            {
                Ok(o) => o,
                Err(e) if is_conflict(&e) => continue,
                Err(e) => return Err(api_error(&what, e)),
            };
        }
        object.status = Some(status.clone());
        match attempt(
            &what,
            objects.replace_status(pool_name, &PostParams::default(), &object),
        )
        .await?
        {
            Ok(o) => return Ok(o),
            Err(e) if is_conflict(&e) => continue,
            Err(e) => return Err(api_error(&what, e)),
        }
    }
    Err(FleetApiError::Api {
        what,
        message: format!("{MAX_ATTEMPTS} writes in a row lost to other writers; try again"),
    })
}

/// Says why in the IPAMAllocation's status (the spec is left as it is; a missing object is
/// created as a request) and returns the refusal.
async fn refuse(
    objects: &Api<IPAMAllocation>,
    pool_name: &str,
    cluster: &FleetCluster,
    refusal: Refusal,
) -> Result<IPAMAllocation, FleetApiError> {
    let what = format!("IPAMAllocation {}/{pool_name}", cluster.namespace);
    let status = json!({"status": {"state": "Refused", "message": refusal.to_string()}});
    match attempt(
        &what,
        objects.patch_status(pool_name, &PatchParams::default(), &Patch::Merge(&status)),
    )
    .await?
    {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 404 => {
            let mut request_object = IPAMAllocation::new(
                pool_name,
                IPAMAllocationSpec {
                    dc: cluster.datacenter.clone(),
                    ..IPAMAllocationSpec::default()
                },
            );
            request_object.metadata.namespace = Some(cluster.namespace.clone());
            match attempt(
                &what,
                objects.create(&PostParams::default(), &request_object),
            )
            .await?
            {
                Ok(_) | Err(kube::Error::Api(_)) => {
                    let _ = attempt(
                        &what,
                        objects.patch_status(
                            pool_name,
                            &PatchParams::default(),
                            &Patch::Merge(&status),
                        ),
                    )
                    .await?;
                }
                Err(e) => return Err(api_error(&what, e)),
            }
        }
        Err(e) => return Err(api_error(&what, e)),
    }
    Err(FleetApiError::Refused(refusal))
}

/// Releases what the cluster in `namespace` holds from IPAMPool `pool_name` (its cluster is
/// gone, or the pool no longer serves its datacenter): the record first (compare-and-swap), then
/// the IPAMAllocation and the ConfigMap key. Returns what was released (`None`: nothing was
/// recorded). Repeating it is harmless.
pub async fn release(
    client: &Client,
    pool_name: &str,
    namespace: &str,
) -> Result<Option<IPAMAllocationSpec>, FleetApiError> {
    let pools: Api<IPAMPool> = Api::all(client.clone());
    let mut released = None;
    let mut done = false;
    for lost in 0..MAX_ATTEMPTS {
        backoff(lost).await;
        let Some(mut pool) =
            request(&format!("IPAMPool {pool_name}"), pools.get_opt(pool_name)).await?
        else {
            done = true;
            break;
        };
        let mut status = pool.status.clone().unwrap_or_default();
        let Some(record) = status.allocations.remove(namespace) else {
            done = true;
            break;
        };
        if swap(&pools, &mut pool, status).await? {
            released = Some(record);
            done = true;
            break;
        }
    }
    if !done {
        return Err(FleetApiError::Contention {
            pool: pool_name.to_string(),
            attempts: MAX_ATTEMPTS,
        });
    }
    let objects: Api<IPAMAllocation> = Api::namespaced(client.clone(), namespace);
    let what = format!("IPAMAllocation {namespace}/{pool_name}");
    match attempt(&what, objects.delete(pool_name, &DeleteParams::default())).await? {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 404 => {}
        Err(e) => return Err(api_error(&what, e)),
    }
    let configmaps: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    let what = format!("ConfigMap {namespace}/{CONFIG_MAP}");
    let patch = json!({"data": {pool_name: null}});
    match attempt(
        &what,
        configmaps.patch(CONFIG_MAP, &PatchParams::default(), &Patch::Merge(&patch)),
    )
    .await?
    {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 404 => {}
        Err(e) => return Err(api_error(&what, e)),
    }
    Ok(released)
}

/// What one [`sync`] of a pool did.
#[derive(Debug, Default)]
pub struct SyncReport {
    /// Cluster namespace → its IPAMAllocation as written, or why it was refused.
    pub allocated: BTreeMap<String, Result<IPAMAllocation, FleetApiError>>,
    /// Cluster namespaces whose allocation was released.
    pub released: Vec<String>,
}

/// One reconcile of IPAMPool `pool_name` against the clusters that exist now: releases the
/// allocations of clusters that are gone or whose datacenter the pool no longer serves (an
/// IPAMAllocation holding addresses the pool has no record of and no cluster asks for too), adopts
/// IPAMAllocations the pool has no record of (first; each counts as taken for everyone else
/// either way), then allocates for every cluster that asks the pool, in namespace order (a
/// request from a datacenter the pool does not serve is refused in its status).
pub async fn sync(
    client: &Client,
    pool_name: &str,
    clusters: &[FleetCluster],
) -> Result<SyncReport, FleetApiError> {
    let pools: Api<IPAMPool> = Api::all(client.clone());
    let mut report = SyncReport::default();
    let Some(pool) = request(&format!("IPAMPool {pool_name}"), pools.get_opt(pool_name)).await?
    else {
        return Err(Refusal::NoPool {
            pool: pool_name.to_string(),
        }
        .into());
    };
    let serves = |dc: &str| pool.spec.datacenters.contains_key(dc);
    let mut asking: Vec<&FleetCluster> = clusters
        .iter()
        .filter(|c| c.asks(pool_name, serves(&c.datacenter)))
        .collect();
    asking.sort();
    let recorded = pool.status.as_ref().map(|s| &s.allocations);
    for (namespace, spec) in recorded.into_iter().flatten() {
        let wanted = asking
            .iter()
            .any(|c| c.namespace == *namespace && c.datacenter == spec.dc);
        if !wanted && release(client, pool_name, namespace).await?.is_some() {
            report.released.push(namespace.clone());
        }
    }
    // Unrecorded IPAMAllocations first.
    let all: Api<IPAMAllocation> = Api::all(client.clone());
    let named = ListParams::default().fields(&format!("metadata.name={pool_name}"));
    let unrecorded: Vec<String> =
        request(&format!("IPAMAllocations {pool_name}"), all.list(&named))
            .await?
            .items
            .into_iter()
            .filter(|o| o.spec.allocation().ok().flatten().is_some())
            .filter_map(|o| o.metadata.namespace)
            .filter(|ns| recorded.is_none_or(|r| !r.contains_key(ns)))
            .collect();
    // Holding addresses with neither a record nor a cluster: a cluster gone before it was
    // adopted, or a release that recorded but did not get to delete. Deleted, like a release.
    for ns in &unrecorded {
        if !asking.iter().any(|c| c.namespace == *ns) {
            release(client, pool_name, ns).await?;
            report.released.push(ns.clone());
        }
    }
    asking.sort_by_key(|c| !unrecorded.contains(&c.namespace));
    for cluster in asking {
        let outcome = allocate(client, pool_name, cluster).await;
        if let Err(FleetApiError::Api { .. } | FleetApiError::Contention { .. }) = &outcome {
            // The API is failing: stop here, the next reconcile resumes.
            return outcome.map(|_| report);
        }
        report.allocated.insert(cluster.namespace.clone(), outcome);
    }
    Ok(report)
}
