//! StatefulSets' declared addresses (`ipam.allot.dev/ordinal-ips`): one ReservedIP per
//! StatefulSet and family, kept while the StatefulSet declares them, deleted with it
//! ([`allot_core::declared`] decides; here is only I/O). Runs in the auto-pool passes: the same
//! watches feed it (StatefulSets, ReservedIPs, IPPools, Namespaces), under the same leadership.
//!
//! A ReservedIP is written by server-side apply (field manager `allot-controller`), and deleted
//! only when it carries the `ipam.allot.dev/reserved-for-*` labels of a StatefulSet that no
//! longer declares it: a user's own ReservedIPs are never touched.
//!
//! Only addresses in pools the StatefulSet's pods may use are reserved ([`crate::tenancy`],
//! [`allot_core::declared::reservable`]): admission refuses a list naming others, and this
//! holds for one that got past it (the webhook down, a list older than the check, a pool or
//! namespace changed since). What is left out is a Warning Event on the StatefulSet
//! (`DeclaredAddressesRefused`) and a log line, once per reason.

use std::collections::BTreeMap;

use allot_core::IpFamily;
use allot_core::declared::{Action, For, Judged, Kept, Tenancy, plan, reservable, reserved_for};
use allot_index::{WorkloadIndex, WorkloadKind};
use allot_k8s::ReservedIP;
use allot_k8s::openapi::api::core::v1::ObjectReference;
use allot_policy_sdk::addresses;
use allot_policy_sdk::types::Label;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::runtime::events::{Event, EventType};
use serde_json::json;

use crate::events::Events;
use crate::lease::Leadership;
use crate::tenancy::Workload;

/// The field manager of the ReservedIPs it writes.
const MANAGER: &str = "allot-controller";

/// What one pass reads, copied out of the index.
pub struct DeclaredSnapshot {
    /// What each StatefulSet declares that may be reserved for it, per family.
    declared: BTreeMap<For, [Vec<String>; 2]>,
    kept: Vec<Kept>,
    /// StatefulSets whose list cannot be read, and why (their ReservedIPs stay as they are).
    unreadable: Vec<(For, String)>,
    /// StatefulSets whose namespace is not known yet (their ReservedIPs stay as they are).
    unjudged: Vec<For>,
    /// StatefulSets with declared addresses left out of their reservation, and why.
    withheld: Vec<(For, String)>,
    /// Each StatefulSet's UID, for the Events on it.
    uids: BTreeMap<For, String>,
}

impl DeclaredSnapshot {
    pub fn of(index: &WorkloadIndex) -> DeclaredSnapshot {
        let kept: Vec<Kept> = index
            .reserved_objects()
            .filter_map(|(name, reserved, labels, deleting)| {
                Some(Kept {
                    name: name.clone(),
                    owner: reserved_for(labels)?,
                    ips: reserved.map(|r| r.ips.clone()),
                    deleting,
                })
            })
            .collect();
        let mut snapshot = DeclaredSnapshot {
            declared: BTreeMap::new(),
            kept: Vec::new(),
            unreadable: Vec::new(),
            unjudged: Vec::new(),
            withheld: Vec::new(),
            uids: BTreeMap::new(),
        };
        for ((kind, namespace, name), entry) in index.workloads() {
            if *kind != WorkloadKind::StatefulSet || entry.deleting {
                continue;
            }
            let owner = For::statefulset(namespace, name);
            snapshot.uids.insert(owner.clone(), entry.uid.clone());
            let annotations: Vec<Label> = entry
                .annotations
                .iter()
                .map(|(k, v)| Label {
                    key: k.clone(),
                    value: v.clone(),
                })
                .collect();
            let lists = match addresses::declared(&annotations) {
                Ok(Some(lists)) => lists,
                Ok(None) => continue,
                Err(e) => {
                    snapshot.unreadable.push((owner, e.message));
                    continue;
                }
            };
            let Some(namespace_labels) = index.namespace_labels(namespace) else {
                snapshot.unjudged.push(owner);
                continue;
            };
            let mut per_family: [Vec<String>; 2] = Default::default();
            for list in lists {
                per_family[0].extend(list.ipv4);
                per_family[1].extend(list.ipv6);
            }
            let workload = Workload::new(namespace, namespace_labels, &entry.labels);
            let pools: Vec<Judged> = index
                .pools()
                .filter_map(|(name, pool)| {
                    Some(Judged {
                        name,
                        addresses: pool.addresses.as_ref()?,
                        tenancy: match &pool.spec {
                            Ok(spec) => workload
                                .barred(spec)
                                .map_or(Tenancy::Usable, Tenancy::Barred),
                            Err(error) => Tenancy::Unknown(error.clone()),
                        },
                    })
                })
                .collect();
            let reservable = reservable(&owner, &per_family, &pools, &kept);
            if !reservable.withheld.is_empty() {
                snapshot
                    .withheld
                    .push((owner.clone(), reservable.withheld.join("; ")));
            }
            snapshot.declared.insert(owner, reservable.entries);
        }
        snapshot.kept = kept;
        snapshot
    }
}

/// Writes what the plan says.
pub struct Keeper {
    reserved: Api<ReservedIP>,
    leadership: Leadership,
    recorder: Events,
    /// What was last reported per StatefulSet, so that each problem is told once.
    reported: BTreeMap<For, String>,
}

impl Keeper {
    pub fn new(client: kube::Client, leadership: Leadership, recorder: Events) -> Keeper {
        Keeper {
            reserved: Api::all(client),
            leadership,
            recorder,
            reported: BTreeMap::new(),
        }
    }

    /// Returns whether to pass again soon (a write failed, or leadership was lost).
    pub async fn pass(&mut self, mut snapshot: DeclaredSnapshot) -> bool {
        let mut reported_now = BTreeMap::new();
        // A list that cannot be read keeps what is reserved for it: never free addresses
        // because of a typo (the webhook refuses such a list; this is for one written before).
        for (owner, why) in &snapshot.unreadable {
            if self.reported.get(owner) != Some(why) {
                tracing::warn!(statefulset = %format!("{}/{}", owner.namespace, owner.name), "its ipam.allot.dev/ordinal-ips cannot be read, its reserved addresses stay as they are: {why}");
            }
            reported_now.insert(owner.clone(), why.clone());
            snapshot.kept.retain(|k| &k.owner != owner);
        }
        // Nor is anything decided from a namespace not seen yet.
        for owner in &snapshot.unjudged {
            tracing::debug!(statefulset = %format!("{}/{}", owner.namespace, owner.name), "its namespace is not known yet; its reserved addresses stay as they are");
            snapshot.kept.retain(|k| &k.owner != owner);
        }
        for (owner, why) in &snapshot.withheld {
            if self.reported.get(owner) != Some(why) {
                tracing::warn!(statefulset = %format!("{}/{}", owner.namespace, owner.name), "declared addresses: {why}");
                self.publish(owner, snapshot.uids.get(owner), why).await;
            }
            reported_now.insert(owner.clone(), why.clone());
        }
        // A problem that went away and comes back is reported again.
        self.reported = reported_now;
        let mut retry = false;
        for action in plan(&snapshot.declared, &snapshot.kept) {
            if !self.leadership.is_leading() {
                return true;
            }
            let done = match &action {
                Action::Apply(w) => {
                    let object = json!({
                        "apiVersion": "allot.dev/v1alpha1",
                        "kind": "ReservedIP",
                        "metadata": {"name": w.name, "labels": w.owner.labels()},
                        "spec": {
                            "ipVersion": match w.family { IpFamily::V4 => 4, IpFamily::V6 => 6 },
                            "ips": w.ips,
                        },
                    });
                    self.reserved
                        .patch(
                            &w.name,
                            &PatchParams::apply(MANAGER).force(),
                            &Patch::Apply(&object),
                        )
                        .await
                        .map(drop)
                }
                Action::Delete { name, .. } => {
                    match self.reserved.delete(name, &DeleteParams::default()).await {
                        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
                        other => other.map(drop),
                    }
                }
            };
            match done {
                Ok(()) => tracing::info!(?action, "declared addresses"),
                Err(e) => {
                    tracing::warn!(?action, "declared addresses: {e}");
                    retry = true;
                }
            }
        }
        retry
    }

    /// A Warning Event on the StatefulSet.
    async fn publish(&self, owner: &For, uid: Option<&String>, why: &str) {
        let reference = ObjectReference {
            api_version: Some("apps/v1".into()),
            kind: Some(owner.kind.clone()),
            namespace: Some(owner.namespace.clone()),
            name: Some(owner.name.clone()),
            uid: uid.cloned(),
            ..ObjectReference::default()
        };
        let event = Event {
            type_: EventType::Warning,
            reason: "DeclaredAddressesRefused".into(),
            note: Some(allot_k8s::event_note(why)),
            action: "ReserveDeclaredAddresses".into(),
            secondary: None,
        };
        if let Err(e) = self.recorder.publish(&event, &reference).await {
            tracing::warn!(statefulset = %format!("{}/{}", owner.namespace, owner.name), "cannot record an Event: {e}");
        }
    }
}
