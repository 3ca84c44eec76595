//! StatefulSets' declared addresses (`ipam.allot.dev/ordinal-ips`): one ReservedIP per
//! StatefulSet and family, kept while the StatefulSet declares them, deleted with it
//! ([`allot_core::declared`] decides; here is only I/O). Runs in the auto-pool passes: the same
//! watches feed it (StatefulSets and ReservedIPs), under the same leadership.
//!
//! A ReservedIP is written by server-side apply (field manager `allot-controller`), and deleted
//! only when it carries the `ipam.allot.dev/reserved-for-*` labels of a StatefulSet that no
//! longer declares it: a user's own ReservedIPs are never touched.

use std::collections::BTreeMap;

use allot_core::IpFamily;
use allot_core::declared::{Action, For, Kept, plan, reserved_for};
use allot_index::{WorkloadIndex, WorkloadKind};
use allot_k8s::ReservedIP;
use allot_policy_sdk::addresses;
use allot_policy_sdk::types::Label;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use serde_json::json;

use crate::lease::Leadership;

/// The field manager of the ReservedIPs it writes.
const MANAGER: &str = "allot-controller";

/// What one pass reads, copied out of the index.
pub struct DeclaredSnapshot {
    declared: BTreeMap<For, [Vec<String>; 2]>,
    kept: Vec<Kept>,
    /// StatefulSets whose list cannot be read, and why (their ReservedIPs stay as they are).
    unreadable: Vec<(For, String)>,
}

impl DeclaredSnapshot {
    pub fn of(index: &WorkloadIndex) -> DeclaredSnapshot {
        let mut declared = BTreeMap::new();
        let mut unreadable = Vec::new();
        for ((kind, namespace, name), entry) in index.workloads() {
            if *kind != WorkloadKind::StatefulSet || entry.deleting {
                continue;
            }
            let owner = For::statefulset(namespace, name);
            let labels: Vec<Label> = entry
                .annotations
                .iter()
                .map(|(k, v)| Label {
                    key: k.clone(),
                    value: v.clone(),
                })
                .collect();
            match addresses::declared(&labels) {
                Ok(Some(lists)) => {
                    let mut per_family: [Vec<String>; 2] = Default::default();
                    for list in lists {
                        per_family[0].extend(list.ipv4);
                        per_family[1].extend(list.ipv6);
                    }
                    declared.insert(owner, per_family);
                }
                Ok(None) => {}
                Err(e) => unreadable.push((owner, e.message)),
            }
        }
        let kept = index
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
        DeclaredSnapshot {
            declared,
            kept,
            unreadable,
        }
    }
}

/// Writes what the plan says.
pub struct Keeper {
    reserved: Api<ReservedIP>,
    leadership: Leadership,
    reported: BTreeMap<For, String>,
}

impl Keeper {
    pub fn new(client: kube::Client, leadership: Leadership) -> Keeper {
        Keeper {
            reserved: Api::all(client),
            leadership,
            reported: BTreeMap::new(),
        }
    }

    /// Returns whether to pass again soon (a write failed, or leadership was lost).
    pub async fn pass(&mut self, mut snapshot: DeclaredSnapshot) -> bool {
        // A list that cannot be read keeps what is reserved for it: never free addresses
        // because of a typo (the webhook refuses such a list; this is for one written before).
        for (owner, why) in &snapshot.unreadable {
            if self.reported.get(owner) != Some(why) {
                tracing::warn!(statefulset = %format!("{}/{}", owner.namespace, owner.name), "its ipam.allot.dev/ordinal-ips cannot be read, its reserved addresses stay as they are: {why}");
                self.reported.insert(owner.clone(), why.clone());
            }
            snapshot.kept.retain(|k| &k.owner != owner);
        }
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
}
