//! ADD, and the ADD served again after the plugin found some of its addresses in use on the
//! pod's link (quarantine): one request built from the plugin's and, in cluster mode, from the
//! indexes; one tail that records what was served.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Instant;

use allot_api as api;
use allot_core::policy::{CniDefaults, NamespaceInfo, NodeInfo, Owner, PodInfo};
use allot_core::store::{Attachment, VIRTUAL_MACHINE_KIND};
use allot_engine::{AddOutcome, AddRequest};
use allot_index::PodRequest;

use super::{Node, NodeError};
use crate::cluster::{LookupError, migration};
use crate::wire;

/// Which ADD a served outcome answers.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Serving {
    /// The plugin's ADD (or its retry, which claims nothing new).
    Add,
    /// The ADD served again in place of quarantined addresses.
    Replacement,
}

impl Node {
    /// ADD: the addresses `r`'s attachment holds, claiming them when it holds none. A DEL of
    /// the attachment remembered in the journal is served first: it was issued before.
    pub async fn add(self: &Arc<Self>, r: api::AddRequest) -> Result<api::IpamResult, NodeError> {
        let started = Instant::now();
        let (request, found) = self.add_request("add", &r).await?;
        let virtual_machine = request
            .pod
            .owner
            .as_ref()
            .filter(|o| o.kind == VIRTUAL_MACHINE_KIND)
            .map(|o| (request.pod.namespace.clone(), o.name.clone()));
        let migration_uid = request
            .pod
            .labels
            .get(migration::MIGRATION_JOB_LABEL)
            .cloned()
            .unwrap_or_default();
        let (netns, interface) = (r.netns.clone(), r.if_name.clone());
        let served = self
            .blocking("add", move |node| {
                let lock = node.engine.serialize(&request.attachment);
                // A DEL of this attachment remembered while it could not be served was issued
                // before this ADD: it comes first (see the journal module).
                node.settle(&lock)?;
                let out = node.engine.add_serialized(&lock, &request)?;
                drop(lock);
                Ok(node.served(&r, &request, found.as_ref(), &out, Serving::Add))
            })
            .await;
        self.metrics
            .add_seconds
            .observe(started.elapsed().as_secs_f64());
        if let (Ok(result), Some(cluster), Some((namespace, instance))) =
            (&served, &self.cluster, virtual_machine)
            && !result.guest_addresses.is_empty()
        {
            if !self.underlay.announce_after_migration {
                tracing::info!(vm = %format!("{namespace}/{instance}"), "live migration target: the guest's addresses are not announced from here after the handover (--announce-after-migration is off); the guest's own announcement is relied on");
                return served;
            }
            tokio::spawn(migration::announce_after_cut_over(
                cluster.client.clone(),
                migration::CutOver {
                    namespace,
                    instance,
                    migration: migration_uid,
                    node: self.name.clone(),
                    netns: netns.into(),
                    interface,
                    addresses: result
                        .guest_addresses
                        .iter()
                        .filter_map(|a| a.parse().ok())
                        .collect(),
                },
                migration::WAIT_AT_MOST,
            ));
        }
        served
    }

    /// Quarantines the addresses `r` names (another host answered for them on the pod's link)
    /// and, when `r.replace`, serves the ADD again with other addresses in their place.
    pub async fn quarantine(
        self: &Arc<Self>,
        r: api::QuarantineRequest,
    ) -> Result<Option<api::IpamResult>, NodeError> {
        let mut conflicts = Vec::with_capacity(r.conflicts.len());
        for c in &r.conflicts {
            let Ok(address) = c.address.parse::<IpAddr>() else {
                return Err(NodeError::BadRequest(format!(
                    "conflict address {:?} is not an address",
                    c.address
                )));
            };
            conflicts.push((address, c.mac.clone(), c.contested));
        }
        if conflicts.is_empty() {
            return Err(NodeError::BadRequest(
                "a quarantine request names no conflict".into(),
            ));
        }
        let (request, found) = self.add_request("quarantine", &r.add).await?;
        self.blocking("quarantine", move |node| {
            let pairs: Vec<(IpAddr, String)> =
                conflicts.iter().map(|(a, m, _)| (*a, m.clone())).collect();
            let (quarantined, outcome) = node.engine.quarantine(&request, &pairs, r.replace)?;
            node.metrics.conflicts.inc_by(quarantined.len() as u64);
            node.metrics.quarantined.inc_by(quarantined.len() as i64);
            for (address, mac, contested) in &conflicts {
                tracing::warn!(
                    %address,
                    %mac,
                    contested,
                    container = %request.attachment,
                    pod = %format!("{}/{}", request.pod.namespace, request.pod.name),
                    quarantine_seconds = node.underlay.quarantine_seconds,
                    "address conflict: another host answered for the address on the pod's link; quarantined"
                );
            }
            Ok(outcome.map(|out| {
                node.served(&r.add, &request, found.as_ref(), &out, Serving::Replacement)
            }))
        })
        .await
    }

    /// What is done with every outcome an ADD serves, the first answer or a replacement: the
    /// pod's Endpoint written (cluster mode), new addresses counted and logged, and the answer
    /// with the probe defaults and which addresses were probed ahead.
    fn served(
        &self,
        r: &api::AddRequest,
        request: &AddRequest,
        found: Option<&PodRequest>,
        out: &AddOutcome,
        serving: Serving,
    ) -> api::IpamResult {
        // A replacement's Endpoint replaces the one the first answer wrote, which names the
        // quarantined address.
        if let (Some(cluster), Some(pod)) = (&self.cluster, found) {
            cluster
                .endpoints
                .added(pod, &request.attachment.interface, out);
        }
        let pod = format!("{}/{}", request.pod.namespace, request.pod.name);
        match serving {
            Serving::Add if !out.repeated => {
                self.metrics
                    .allocations
                    .inc_by(out.allocations.len() as u64);
                for a in &out.allocations {
                    tracing::info!(address = %a.cidr(), pool = %a.pool, container = %request.attachment, pod = %pod, "allocated");
                }
            }
            Serving::Add => {}
            Serving::Replacement => {
                self.metrics.allocations.inc_by(out.claimed.len() as u64);
                for a in out
                    .allocations
                    .iter()
                    .filter(|a| out.claimed.contains(&a.address))
                {
                    tracing::info!(address = %a.cidr(), pool = %a.pool, container = %request.attachment, pod = %pod, "allocated in place of a quarantined address");
                }
            }
        }
        // The plugin probes with these unless the network's config says otherwise.
        let probe = self.underlay.probe;
        let preprobed = self
            .ahead
            .as_ref()
            .and_then(|a| a.served(r, r.probe.or(probe), out));
        // A live migration's target: what the guest still uses from the source is announced
        // here at the handover, not probed or announced by the plugin now.
        let migrating = found.is_some_and(|p| {
            p.pod
                .owner
                .as_ref()
                .is_some_and(|o| o.kind == VIRTUAL_MACHINE_KIND)
                && migration::is_migration_target(&p.pod.labels)
        });
        let guest_addresses = if migrating {
            out.allocations
                .iter()
                .filter(|a| !out.claimed.contains(&a.address))
                .map(|a| a.address.to_string())
                .collect()
        } else {
            Vec::new()
        };
        api::IpamResult {
            probe,
            preprobed,
            guest_addresses,
            ..wire::result(out)
        }
    }

    /// The engine's ADD for the plugin's request. In cluster mode the pod, its namespace, the
    /// node and the interface's Multus network come from the indexes (returned too, for the
    /// pod's Endpoint).
    async fn add_request(
        &self,
        verb: &'static str,
        r: &api::AddRequest,
    ) -> Result<(AddRequest, Option<PodRequest>), NodeError> {
        let mut request = AddRequest {
            attachment: Attachment {
                container_id: r.container_id.clone(),
                interface: r.if_name.clone(),
            },
            network: r.network.clone(),
            pod: PodInfo {
                namespace: r.pod.namespace.clone(),
                name: r.pod.name.clone(),
                uid: r.pod.uid.clone(),
                owner: match (&r.pod.owner_kind, &r.pod.owner_name) {
                    (Some(kind), Some(name)) => Some(Owner {
                        kind: kind.clone(),
                        name: name.clone(),
                    }),
                    _ => None,
                },
                ..Default::default()
            },
            namespace: NamespaceInfo {
                name: r.pod.namespace.clone(),
                ..Default::default()
            },
            node: NodeInfo {
                name: self.name.clone(),
                ..Default::default()
            },
            multus_name: r.multus_name.clone(),
            cni_defaults: CniDefaults {
                ipv4: r.default_ipv4_pools.clone(),
                ipv6: r.default_ipv6_pools.clone(),
            },
        };
        let Some(cluster) = &self.cluster else {
            return Ok((request, None));
        };
        let pod = cluster
            .request(&r.pod.namespace, &r.pod.name, &r.pod.uid, &r.if_name)
            .await
            .map_err(|e| {
                self.failed(
                    verb,
                    match e {
                        LookupError::Invalid(why) => NodeError::InvalidPod(why),
                        LookupError::Unavailable(why) => NodeError::PodUnknown(why),
                    },
                )
            })?;
        request.pod = pod.pod.clone();
        request.namespace = pod.namespace.clone();
        request.node = pod.node.clone();
        request.multus_name = pod.multus_name.clone();
        Ok((request, Some(pod)))
    }
}
