//! One reconcile pass: the index's view becomes core's plan ([`allot_core::autopool::plan`]),
//! and the plan becomes API writes. Decisions are core's; here is only I/O:
//!
//! - a new pool is created if absent (`AlreadyExists` means the watch has not shown it yet);
//! - a resize is a merge patch carrying the resourceVersion it was planned from, of the fields
//!   the controller owns (its labels, `ipVersion`, `subnet`, `ips`, `gateway`, `routes`), so a
//!   user's other fields and the pool's finalizers stay;
//! - a deletion carries a resourceVersion precondition (the pool lifecycle's finalizer keeps a
//!   pool whose addresses are still claimed until they are released);
//! - a refusal is a Warning Event on the workload and a log line, once per reason.
//!
//! Every write first checks [`Leadership::is_leading`]. A lost compare-and-swap or a write the
//! watch has not shown yet is not an error: the pass says to retry, and the next one plans from
//! fresh state. Addresses written but not yet seen by the watch stay "pending" and are never
//! carved again meanwhile.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use allot_core::autopool::{Action, Inputs, PoolView, Workload, plan};
use allot_core::policy::Application;
use allot_core::spec::IpPoolSpec;
use allot_core::store::Store;
use allot_core::{AddrSet, IpFamily, Subnet};
use allot_index::WorkloadIndex;
use allot_k8s::openapi::api::core::v1::ObjectReference;
use allot_k8s::{IPPool, IpPoolSpec as IpPoolSpecObject};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::events::{Event, EventType};

use crate::events::Events;
use serde_json::{Value, json};

use super::wants::wants;
use crate::lease::Leadership;

/// How long a write may stay unseen by the watch before it is no longer held apart.
const PENDING_FOR: Duration = Duration::from_secs(60);

/// What one pass reads, copied out of the index.
pub struct Snapshot {
    workloads: Vec<Workload>,
    /// Each workload's API version and UID, for the Events on it.
    refs: BTreeMap<Application, (String, String)>,
    subnets: BTreeMap<String, Result<Subnet, String>>,
    pools: Vec<PoolView>,
    reserved: [AddrSet; 2],
    followed_kinds: BTreeSet<String>,
}

impl Snapshot {
    pub fn of(index: &WorkloadIndex) -> Snapshot {
        let mut workloads = Vec::new();
        let mut refs = BTreeMap::new();
        for ((kind, namespace, name), entry) in index.workloads() {
            let app = Application {
                kind: kind.as_str().to_string(),
                namespace: namespace.clone(),
                name: name.clone(),
            };
            refs.insert(
                app.clone(),
                (kind.api_version().to_string(), entry.uid.clone()),
            );
            workloads.push(Workload {
                app,
                replicas: entry.replicas,
                deleting: entry.deleting,
                wants: wants(&entry.annotations).map_err(|e| e.to_string()),
            });
        }
        for ((kind, namespace, name), entry, unread) in index.scalable_workloads() {
            let app = Application {
                kind: kind.kind.clone(),
                namespace: namespace.clone(),
                name: name.clone(),
            };
            refs.insert(app.clone(), (kind.api_version(), entry.uid.clone()));
            workloads.push(Workload {
                app,
                replicas: entry.replicas,
                deleting: entry.deleting,
                // Without its count, its pools stay exactly as they are.
                wants: match unread {
                    Some(why) => Err(why.to_string()),
                    None => wants(&entry.annotations).map_err(|e| e.to_string()),
                },
            });
        }
        let pools = index
            .pools()
            .map(|(name, p)| PoolView {
                name: name.clone(),
                resource_version: p.resource_version.clone(),
                labels: p.labels.clone(),
                terminating: p.deleting,
                addresses: p.addresses.clone(),
                spec: p.spec.clone(),
            })
            .collect();
        Snapshot {
            workloads,
            refs,
            subnets: index
                .subnets()
                .into_iter()
                .map(|(name, subnet)| (name, subnet.map_err(|e| e.to_string())))
                .collect(),
            pools,
            reserved: [index.reserved(IpFamily::V4), index.reserved(IpFamily::V6)],
            followed_kinds: index.followed_kinds(),
        }
    }
}

impl Snapshot {
    /// What a pass would do if no address were claimed and nothing were pending (for
    /// examples and inspection; a real pass reads the claims).
    pub fn dry_run(&self) -> Vec<Action> {
        let inputs = Inputs {
            workloads: &self.workloads,
            subnets: &self.subnets,
            pools: &self.pools,
            reserved_v4: &self.reserved[0],
            reserved_v6: &self.reserved[1],
            pending: &[],
            followed_kinds: &self.followed_kinds,
        };
        plan(&inputs, &mut |current| AddrSet::empty(current.family()))
    }
}

/// A write the watch may not have shown yet.
struct Pending {
    name: String,
    resource_version: String,
    addresses: AddrSet,
    at: Instant,
}

/// What a pass did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Outcome {
    pub created: usize,
    pub updated: usize,
    pub deleted: usize,
    pub refused: usize,
    /// Something could not be done now (a lost compare-and-swap, the API or the store
    /// unavailable, leadership lost): pass again soon.
    pub retry: bool,
}

/// Carries plans out. Lives as long as the controller: it remembers pending writes and the
/// refusals already reported.
pub struct Reconciler {
    pools: Api<IPPool>,
    recorder: Events,
    leadership: Leadership,
    store: Arc<dyn Store>,
    pending: Vec<Pending>,
    reported: BTreeMap<(Application, Option<String>), String>,
}

impl Reconciler {
    pub fn new(
        client: kube::Client,
        recorder: Events,
        leadership: Leadership,
        store: Arc<dyn Store>,
    ) -> Reconciler {
        Reconciler {
            pools: Api::all(client),
            recorder,
            leadership,
            store,
            pending: Vec::new(),
            reported: BTreeMap::new(),
        }
    }

    /// Plans from `snapshot` and carries the plan out while this replica leads.
    pub async fn pass(&mut self, snapshot: Snapshot) -> Outcome {
        let mut outcome = Outcome::default();
        if !self.leadership.is_leading() {
            outcome.retry = true;
            return outcome;
        }
        let seen: BTreeMap<&str, &str> = snapshot
            .pools
            .iter()
            .map(|p| (p.name.as_str(), p.resource_version.as_str()))
            .collect();
        self.pending.retain(|p| {
            seen.get(p.name.as_str()) != Some(&p.resource_version.as_str())
                && p.at.elapsed() < PENDING_FOR
        });
        let pending: Vec<AddrSet> = self.pending.iter().map(|p| p.addresses.clone()).collect();
        let store = self.store.clone();
        let planned = tokio::task::spawn_blocking(move || {
            let mut claims: Option<Result<[AddrSet; 2], String>> = None;
            let mut claimed =
                |current: &AddrSet| match claims.get_or_insert_with(|| claimed_sets(&*store)) {
                    Ok(sets) => {
                        current.intersection(&sets[usize::from(current.family() == IpFamily::V6)])
                    }
                    // Unknown: count everything as claimed, so nothing is given back.
                    Err(_) => current.clone(),
                };
            let inputs = Inputs {
                workloads: &snapshot.workloads,
                subnets: &snapshot.subnets,
                pools: &snapshot.pools,
                reserved_v4: &snapshot.reserved[0],
                reserved_v6: &snapshot.reserved[1],
                pending: &pending,
                followed_kinds: &snapshot.followed_kinds,
            };
            let actions = plan(&inputs, &mut claimed);
            let store_error = match claims {
                Some(Err(e)) => Some(e),
                _ => None,
            };
            (actions, store_error, snapshot.refs)
        })
        .await;
        let (actions, store_error, refs) = match planned {
            Ok(p) => p,
            Err(e) => {
                tracing::error!("the auto-pool plan panicked: {e}");
                outcome.retry = true;
                return outcome;
            }
        };
        if let Some(e) = store_error {
            tracing::warn!(
                "cannot read claims ({e}): auto pools are not shrunk until the store answers"
            );
            outcome.retry = true;
        }
        let mut refused_now = BTreeMap::new();
        for action in actions {
            if !self.leadership.is_leading() {
                tracing::info!(
                    "no longer leading: the rest of the auto-pool pass is left to the leader"
                );
                outcome.retry = true;
                break;
            }
            match action {
                Action::Create {
                    app,
                    name,
                    labels,
                    spec,
                } => match self.create(&name, labels, spec).await {
                    Ok(()) => {
                        tracing::info!(pool = %name, workload = %describe(&app), "created auto pool");
                        outcome.created += 1;
                    }
                    Err(again) => outcome.retry |= again,
                },
                Action::Update {
                    app,
                    name,
                    resource_version,
                    labels,
                    spec,
                    added,
                    removed,
                    unreturned,
                } => match self.update(&name, &resource_version, labels, &spec).await {
                    Ok(()) => {
                        tracing::info!(pool = %name, workload = %describe(&app), added, removed, unreturned, size = spec.ips.len(), "resized auto pool");
                        outcome.updated += 1;
                    }
                    Err(again) => outcome.retry |= again,
                },
                Action::Delete {
                    app,
                    name,
                    resource_version,
                } => match self.delete(&name, &resource_version).await {
                    Ok(()) => {
                        tracing::info!(pool = %name, workload = %describe(&app), "deleted auto pool");
                        outcome.deleted += 1;
                    }
                    Err(again) => outcome.retry |= again,
                },
                Action::Refuse {
                    app,
                    subnet,
                    reason,
                } => {
                    outcome.refused += 1;
                    let key = (app.clone(), subnet);
                    if self.reported.get(&key) != Some(&reason) {
                        tracing::warn!(workload = %describe(&app), "{reason}");
                        self.publish(&app, refs.get(&app), &reason).await;
                    }
                    refused_now.insert(key, reason);
                }
                Action::Wait { app, reason } => {
                    tracing::debug!(workload = %describe(&app), "{reason}");
                }
                Action::WaitForRelease { app, name, held } => {
                    tracing::debug!(pool = %name, workload = %describe(&app), "deleted once its {held} claimed address(es) are released");
                    outcome.retry = true;
                }
            }
        }
        // A refusal that went away and comes back is reported again.
        self.reported = refused_now;
        outcome
    }

    async fn create(
        &mut self,
        name: &str,
        labels: BTreeMap<String, String>,
        spec: IpPoolSpec,
    ) -> Result<(), bool> {
        let mut pool = IPPool::new(name, IpPoolSpecObject(spec));
        pool.metadata.labels = Some(labels);
        match self.pools.create(&PostParams::default(), &pool).await {
            Ok(created) => {
                self.remember(name, &created);
                Ok(())
            }
            Err(e) => Err(refused("create", name, e)),
        }
    }

    async fn update(
        &mut self,
        name: &str,
        resource_version: &str,
        labels: BTreeMap<String, String>,
        spec: &IpPoolSpec,
    ) -> Result<(), bool> {
        let absent_is_null = |v: Value| match &v {
            Value::Array(a) if a.is_empty() => Value::Null,
            _ => v,
        };
        let patch = json!({
            "metadata": {"resourceVersion": resource_version, "labels": labels},
            "spec": {
                "ipVersion": spec.ip_version,
                "subnet": spec.subnet,
                "ips": spec.ips,
                "gateway": spec.gateway,
                "routes": absent_is_null(json!(spec.routes)),
            },
        });
        match self
            .pools
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(patched) => {
                self.remember(name, &patched);
                Ok(())
            }
            Err(e) => Err(refused("resize", name, e)),
        }
    }

    async fn delete(&mut self, name: &str, resource_version: &str) -> Result<(), bool> {
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                resource_version: Some(resource_version.to_string()),
                uid: None,
            }),
            ..DeleteParams::default()
        };
        match self.pools.delete(name, &params).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
            Err(e) => Err(refused("delete", name, e)),
        }
    }

    /// Holds a written pool's addresses apart until the watch shows this version.
    fn remember(&mut self, name: &str, written: &IPPool) {
        let spec = &written.spec.0;
        let family = IpFamily::from_version(spec.ip_version.unwrap_or(4)).unwrap_or(IpFamily::V4);
        let addresses = AddrSet::parse_entries_lenient(family, &spec.ips).0;
        self.pending.push(Pending {
            name: name.to_string(),
            resource_version: written
                .metadata
                .resource_version
                .clone()
                .unwrap_or_default(),
            addresses,
            at: Instant::now(),
        });
    }

    /// A Warning Event on the workload.
    async fn publish(&self, app: &Application, reference: Option<&(String, String)>, reason: &str) {
        let reference = ObjectReference {
            api_version: reference.map(|(v, _)| v.clone()),
            kind: Some(app.kind.clone()),
            namespace: Some(app.namespace.clone()),
            name: Some(app.name.clone()),
            uid: reference.map(|(_, uid)| uid.clone()),
            ..ObjectReference::default()
        };
        let event = Event {
            type_: EventType::Warning,
            reason: "AutoPoolRefused".into(),
            note: Some(allot_k8s::event_note(reason)),
            action: "CarveAutoPool".into(),
            secondary: None,
        };
        if let Err(e) = self.recorder.publish(&event, &reference).await {
            tracing::warn!(workload = %describe(app), "cannot record an Event: {e}");
        }
    }
}

fn describe(app: &Application) -> String {
    format!("{} {}/{}", app.kind, app.namespace, app.name)
}

/// Every claimed address, per family.
fn claimed_sets(store: &dyn Store) -> Result<[AddrSet; 2], String> {
    let claims = store.all().map_err(|e| e.to_string())?;
    let of = |family| AddrSet::from_addresses(family, claims.iter().map(|c| c.address));
    Ok([of(IpFamily::V4), of(IpFamily::V6)])
}

/// Logs a refused write and says whether trying again later may succeed.
fn refused(what: &str, name: &str, e: kube::Error) -> bool {
    match e {
        kube::Error::Api(s) if s.code == 409 => {
            tracing::debug!(pool = %name, "{what}: {} (the watch is behind; planning again)", s.message);
            true
        }
        kube::Error::Api(s) if s.code == 403 => {
            tracing::error!(pool = %name, "{what}: {}. allot-controller's ServiceAccount needs create, patch and delete on ippools.allot.dev", s.message);
            true
        }
        kube::Error::Api(s) if s.code == 422 || s.code == 400 => {
            tracing::error!(pool = %name, "{what}: the API server refused the pool: {}", s.message);
            false
        }
        other => {
            tracing::warn!(pool = %name, "{what}: {other}; retrying");
            true
        }
    }
}
