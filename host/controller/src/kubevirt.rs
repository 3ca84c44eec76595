//! KubeVirt's virtual machines, for GC: a launcher pod's address belongs to its virtual machine
//! (see `allot_core::store::PodRef::virtual_machine`) and is kept while a VirtualMachine or a
//! VirtualMachineInstance of that name exists.
//!
//! KubeVirt is optional: the API server is asked (discovery of the `kubevirt.io` group) every
//! [`DISCOVERY_EVERY`] whether it serves the two kinds. Served, both are watched (metadata
//! only) into the [`ClusterIndex`]; not served, no virtual machine exists (its CRDs took their
//! objects with them) and the index says so; while discovery fails or a kind is not listed
//! yet, nothing of a virtual machine's is taken for gone.

use std::sync::Arc;
use std::time::Duration;

use allot_index::{
    ClusterIndex, KubeVirt, Shared, VirtualMachineInstanceObject, VirtualMachineObject, feed,
};
use kube::Api;
use kube::api::{ApiResource, DynamicObject};
use kube::core::PartialObjectMeta;
use kube::discovery::Discovery;
use kube::runtime::{WatchStreamExt, watcher};
use tokio::task::JoinSet;

/// How often the API server is asked whether it serves KubeVirt's kinds.
pub const DISCOVERY_EVERY: Duration = Duration::from_secs(60);

const GROUP: &str = "kubevirt.io";

/// The served `kubevirt.io` resources named VirtualMachine and VirtualMachineInstance, if both
/// are: `Ok(None)` when the group or either kind is not served.
async fn discover(
    client: &kube::Client,
) -> Result<Option<(ApiResource, ApiResource)>, kube::Error> {
    let discovery = Discovery::new(client.clone())
        .filter(&[GROUP])
        .run()
        .await?;
    let Some(group) = discovery.groups().find(|g| g.name() == GROUP) else {
        return Ok(None);
    };
    let resources = group.recommended_resources();
    let find = |kind: &str| {
        resources
            .iter()
            .find(|(ar, _)| ar.kind == kind)
            .map(|(ar, _)| ar.clone())
    };
    Ok(find("VirtualMachine").zip(find("VirtualMachineInstance")))
}

/// Follows KubeVirt's kinds into `index` until dropped, asking discovery `every` so often.
pub async fn follow(index: Arc<Shared<ClusterIndex>>, client: kube::Client, every: Duration) {
    let mut watches: Option<JoinSet<()>> = None;
    loop {
        match discover(&client).await {
            Ok(Some((vms, vmis))) => {
                if watches.is_none() {
                    tracing::info!("KubeVirt is served: following VirtualMachines for GC");
                    index.update(|i| i.set_kubevirt(KubeVirt::Served));
                    let mut set = JoinSet::new();
                    let config = watcher::Config::default();
                    set.spawn(feed(
                        index.clone(),
                        watcher(
                            Api::<PartialObjectMeta<DynamicObject>>::all_with(client.clone(), &vms),
                            config.clone(),
                        )
                        .default_backoff(),
                        VirtualMachineObject,
                    ));
                    set.spawn(feed(
                        index.clone(),
                        watcher(
                            Api::<PartialObjectMeta<DynamicObject>>::all_with(
                                client.clone(),
                                &vmis,
                            ),
                            config,
                        )
                        .default_backoff(),
                        VirtualMachineInstanceObject,
                    ));
                    watches = Some(set);
                }
            }
            Ok(None) => {
                if watches.take().is_some() {
                    tracing::info!("KubeVirt is no longer served: its virtual machines are gone");
                }
                index.update(|i| i.set_kubevirt(KubeVirt::Absent));
            }
            Err(e) => {
                tracing::warn!(
                    "asking whether KubeVirt is served failed, keeping what is known: {e}"
                );
            }
        }
        tokio::time::sleep(every).await;
    }
}
