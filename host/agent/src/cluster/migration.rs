//! A KubeVirt live migration's target pod: the virtual machine's address is the target's from
//! its ADD on (the engine takes the claim over), but the guest runs on the source until the
//! migration completes. So the plugin neither probes nor announces the address at ADD
//! (`IpamResult::guest_addresses`), and this agent announces it from the target pod's
//! interface (a gratuitous ARP, an unsolicited Neighbor Advertisement) once the
//! VirtualMachineInstance's `status.nodeName` names this node, which KubeVirt sets when the
//! guest is handed over: the underlay's switches and neighbours then send its traffic here.
//!
//! KubeVirt marks the target launcher pod with the migration's UID
//! (`kubevirt.io/migrationJobUID`); a launcher pod without it is a first start or a restart,
//! whose address is probed and announced as any pod's.

use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use allot_core::policy::Labels;
use futures::StreamExt;
use kube::Api;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
use kube::runtime::{WatchStreamExt, watcher};

/// The label KubeVirt puts on a live migration's target launcher pod.
pub const MIGRATION_JOB_LABEL: &str = "kubevirt.io/migrationJobUID";

/// How long a target waits for its virtual machine to be handed over: KubeVirt's own limit
/// grows with the guest's memory (150 s per GiB by default), so a day covers any guest.
pub const WAIT_AT_MOST: Duration = Duration::from_secs(24 * 3600);

/// Whether a pod with `labels` is a live migration's target launcher pod.
pub fn is_migration_target(labels: &Labels) -> bool {
    labels
        .get(MIGRATION_JOB_LABEL)
        .is_some_and(|v| !v.is_empty())
}

/// What to announce, from where, once the VM runs on `node`.
#[derive(Clone, Debug)]
pub struct CutOver {
    pub namespace: String,
    /// The VirtualMachineInstance (named after its VirtualMachine).
    pub instance: String,
    /// The migration's UID (the target pod's `kubevirt.io/migrationJobUID`).
    pub migration: String,
    pub node: String,
    pub netns: PathBuf,
    pub interface: String,
    pub addresses: Vec<IpAddr>,
}

/// What became of the instance.
#[derive(Debug, PartialEq, Eq)]
enum Handover {
    /// It runs on this node: the migration completed.
    Here,
    /// The migration failed, or the instance is gone: nothing to announce.
    NotHere(String),
}

/// Reads what `vmi` says of migration `uid`'s handover to `node`, if anything yet. The
/// instance's `migrationState` may still be an earlier migration's (KubeVirt writes the new one
/// only once the target pod runs): only this migration's state can say it ended elsewhere.
fn handover(vmi: &DynamicObject, node: &str, uid: &str) -> Option<Handover> {
    let status = vmi.data.get("status")?;
    if status.get("nodeName").and_then(|n| n.as_str()) == Some(node) {
        return Some(Handover::Here);
    }
    let migration = status.get("migrationState")?;
    if migration.get("migrationUid").and_then(|u| u.as_str()) != Some(uid) {
        return None;
    }
    let failed = migration.get("failed").and_then(|f| f.as_bool()) == Some(true);
    let completed = migration.get("completed").and_then(|c| c.as_bool()) == Some(true);
    (failed || completed).then(|| {
        Handover::NotHere(format!(
            "the migration ended with the instance on node {}",
            status
                .get("nodeName")
                .and_then(|n| n.as_str())
                .unwrap_or("(none)")
        ))
    })
}

/// Waits for the handover of `c.instance` (a watch of that one object) and announces its
/// addresses from the target's interface when it comes here. Logs what happened; gives up
/// after `wait`.
pub async fn announce_after_cut_over(client: kube::Client, c: CutOver, wait: Duration) {
    let resource = ApiResource::from_gvk(&GroupVersionKind::gvk(
        "kubevirt.io",
        "v1",
        "VirtualMachineInstance",
    ));
    let api: Api<DynamicObject> = Api::namespaced_with(client, &c.namespace, &resource);
    let config = watcher::Config::default().fields(&format!("metadata.name={}", c.instance));
    let watched = async {
        let mut events = std::pin::pin!(watcher(api, config).default_backoff());
        let mut seen = false;
        let mut failing = false;
        while let Some(event) = events.next().await {
            match event {
                Ok(watcher::Event::Apply(o) | watcher::Event::InitApply(o)) => {
                    seen = true;
                    if let Some(h) = handover(&o, &c.node, &c.migration) {
                        return h;
                    }
                }
                Ok(watcher::Event::Delete(_)) => {
                    return Handover::NotHere("the instance was deleted".into());
                }
                Ok(watcher::Event::InitDone) if !seen => {
                    return Handover::NotHere("the instance does not exist".into());
                }
                Ok(_) => {}
                // Retried with backoff; said once (a refusal would otherwise fill the log).
                Err(e) if !failing => {
                    failing = true;
                    tracing::warn!(
                        "watching VirtualMachineInstance {}/{} failed, retrying: {e}",
                        c.namespace,
                        c.instance
                    );
                }
                Err(_) => {}
            }
        }
        Handover::NotHere("the watch ended".into())
    };
    let vm = format!("{}/{}", c.namespace, c.instance);
    match tokio::time::timeout(wait, watched).await {
        Ok(Handover::Here) => {
            let target = c.clone();
            let failures = tokio::task::spawn_blocking(move || {
                target
                    .addresses
                    .iter()
                    .filter_map(|a| {
                        allot_probe::announce(&target.netns, &target.interface, *a)
                            .err()
                            .map(|e| format!("{a}: {e}"))
                    })
                    .collect::<Vec<String>>()
            })
            .await
            .unwrap_or_else(|e| vec![format!("the announcing thread failed: {e}")]);
            if failures.is_empty() {
                tracing::info!(vm = %vm, interface = %c.interface, addresses = ?c.addresses, "live migration completed here: announced the virtual machine's addresses");
            } else {
                tracing::warn!(vm = %vm, interface = %c.interface, "live migration completed here, but announcing failed ({}); the guest's own announcement is relied on", failures.join("; "));
            }
        }
        Ok(Handover::NotHere(why)) => {
            tracing::info!(vm = %vm, "not announcing the virtual machine's addresses from this node: {why}");
        }
        Err(_) => {
            tracing::warn!(vm = %vm, "gave up waiting for the live migration to complete here after {} s", wait.as_secs());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn vmi(status: serde_json::Value) -> DynamicObject {
        serde_json::from_value(json!({
            "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
            "metadata": {"name": "db", "namespace": "vms"},
            "status": status,
        }))
        .unwrap()
    }

    #[test]
    fn the_handover_is_read_from_the_instances_status() {
        let migrating = vmi(json!({"nodeName": "node-1",
            "migrationState": {"migrationUid": "m2", "targetNode": "node-2"}}));
        assert_eq!(
            handover(&migrating, "node-2", "m2"),
            None,
            "still migrating"
        );
        let here = vmi(json!({"nodeName": "node-2",
            "migrationState": {"migrationUid": "m2", "completed": true}}));
        assert_eq!(handover(&here, "node-2", "m2"), Some(Handover::Here));
        let failed = vmi(json!({"nodeName": "node-1",
            "migrationState": {"migrationUid": "m2", "completed": true, "failed": true}}));
        assert!(matches!(
            handover(&failed, "node-2", "m2"),
            Some(Handover::NotHere(_))
        ));
        let earlier = vmi(json!({"nodeName": "node-1",
            "migrationState": {"migrationUid": "m1", "completed": true}}));
        assert_eq!(
            handover(&earlier, "node-2", "m2"),
            None,
            "an earlier migration's state says nothing of this one"
        );
        assert_eq!(handover(&vmi(json!(null)), "node-2", "m2"), None);
    }

    #[test]
    fn a_target_is_told_by_kubevirts_label() {
        let mut labels = Labels::new();
        assert!(!is_migration_target(&labels));
        labels.insert(MIGRATION_JOB_LABEL.into(), "3f2a".into());
        assert!(is_migration_target(&labels));
    }
}
