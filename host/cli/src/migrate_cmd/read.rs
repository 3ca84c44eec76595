//! What a migration reads: the peer's objects (decoded by `allot_k8s::peers`), every pod, and
//! what allot holds already (its IPPools, Subnets, ReservedIPs and Endpoints; the claims are
//! read from the store by the caller).

use std::collections::BTreeMap;

use allot_core::gc::PodPhase;
use allot_core::migrate::{
    Current, CurrentObject, LivePod, Owner, Peer, PeerObject, PeerPool, Record,
};
use allot_core::spec::{ReservedIpSpec, SubnetSpec};
use allot_k8s::openapi::api::core::v1::Pod;
use allot_k8s::peers::{PeerKind, spiderpool, whereabouts};
use allot_k8s::{Endpoint, IPPool, ReservedIP, Subnet};
use anyhow::{Context as _, bail};
use kube::api::{Api, ApiResource, DynamicObject, ListParams};
use kube::core::Resource;
use serde::de::DeserializeOwned;

/// The peer's objects in core's shapes.
#[derive(Clone, Debug, Default)]
pub struct Decoded {
    pub pools: Vec<PeerPool>,
    pub subnets: Vec<PeerObject<SubnetSpec>>,
    pub reserved: Vec<PeerObject<ReservedIpSpec>>,
    pub records: Vec<Record>,
    pub unreadable: Vec<(String, String)>,
}

pub struct Read {
    pub decoded: Decoded,
    /// Whereabouts: each network that uses it, with the allot pools of its ranges.
    pub networks: Vec<(String, Vec<String>)>,
    pub pods: Vec<LivePod>,
    /// allot's objects (claims are the store's, read by the caller).
    pub current: Current,
    /// allot's Endpoints by (namespace, name).
    pub endpoints: BTreeMap<(String, String), Endpoint>,
}

/// Every object of `kind`, in pages; a kind the cluster does not serve says so.
async fn list_peer(
    client: &kube::Client,
    peer: Peer,
    kind: PeerKind,
) -> anyhow::Result<Vec<DynamicObject>> {
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &kind.api_resource());
    let mut items = Vec::new();
    let mut params = ListParams::default().limit(500);
    loop {
        let page = match api.list(&params).await {
            Ok(page) => page,
            Err(kube::Error::Api(s)) if s.code == 404 => bail!(
                "this cluster does not serve {} ({}): is {} installed? (its CRDs must still be \
                 there to read its records)",
                kind.kind,
                kind.crd_name(),
                peer.as_str()
            ),
            Err(e) => {
                return Err(e).with_context(|| {
                    format!(
                        "cannot list {}; check that this kubeconfig may",
                        kind.crd_name()
                    )
                });
            }
        };
        items.extend(page.items);
        match page.metadata.continue_ {
            Some(token) if !token.is_empty() => params = params.continue_token(&token),
            _ => return Ok(items),
        }
    }
}

pub async fn read(client: &kube::Client, peer: Peer) -> anyhow::Result<Read> {
    let (decoded, networks) = match peer {
        Peer::Spiderpool => {
            let objects = spiderpool::Objects {
                pools: list_peer(client, peer, spiderpool::IPPOOL).await?,
                subnets: list_peer(client, peer, spiderpool::SUBNET).await?,
                reserved: list_peer(client, peer, spiderpool::RESERVED_IP).await?,
                endpoints: list_peer(client, peer, spiderpool::ENDPOINT).await?,
            };
            let d = spiderpool::decode(&objects);
            let decoded = Decoded {
                pools: d.pools,
                subnets: d.subnets,
                reserved: d.reserved,
                records: d.records,
                unreadable: d.unreadable,
            };
            (decoded, Vec::new())
        }
        Peer::Whereabouts => {
            let objects = whereabouts::Objects {
                networks: list_peer(client, peer, whereabouts::NETWORK_ATTACHMENT_DEFINITION)
                    .await?,
                pools: list_peer(client, peer, whereabouts::IPPOOL).await?,
                reservations: list_peer(client, peer, whereabouts::RESERVATION).await?,
            };
            let d = whereabouts::decode(&objects);
            let decoded = Decoded {
                pools: d.pools,
                records: d.records,
                unreadable: d.unreadable,
                ..Decoded::default()
            };
            (decoded, d.networks)
        }
    };
    let pods: Vec<Pod> =
        allot_controller::gc::report::list_all(Api::all(client.clone()), "pods").await?;
    let endpoints: Vec<Endpoint> =
        allot_controller::gc::report::list_all(Api::all(client.clone()), "endpoints.allot.dev")
            .await?;
    let current = Current {
        pools: current::<IPPool, _>(client, "ippools.allot.dev").await?,
        subnets: current::<Subnet, _>(client, "subnets.allot.dev").await?,
        reserved: current::<ReservedIP, _>(client, "reservedips.allot.dev").await?,
        claims: Vec::new(),
    };
    Ok(Read {
        decoded,
        networks,
        pods: pods.iter().map(live).collect(),
        current,
        endpoints: endpoints
            .into_iter()
            .map(|e| {
                let key = (
                    e.metadata.namespace.clone().unwrap_or_default(),
                    e.metadata.name.clone().unwrap_or_default(),
                );
                (key, e)
            })
            .collect(),
    })
}

/// allot's objects of kind `K`, read untyped (one that does not decode has no spec: it serves
/// nothing, and its name counts as taken).
async fn current<K, S>(client: &kube::Client, what: &str) -> anyhow::Result<Vec<CurrentObject<S>>>
where
    K: Resource<DynamicType = ()>,
    S: DeserializeOwned,
{
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &ApiResource::erase::<K>(&()));
    let objects = allot_controller::gc::report::list_all(api, what).await?;
    Ok(objects
        .into_iter()
        .map(|o| CurrentObject {
            name: o.metadata.name.clone().unwrap_or_default(),
            labels: o.metadata.labels.clone().unwrap_or_default(),
            spec: o
                .data
                .get("spec")
                .and_then(|s| serde_json::from_value(s.clone()).ok()),
        })
        .collect())
}

/// A pod as a migration sees it.
fn live(p: &Pod) -> LivePod {
    let spec = p.spec.as_ref();
    let phase = PodPhase::parse(p.status.as_ref().and_then(|s| s.phase.as_deref()));
    // As allot's agent records it: a KubeVirt launcher pod's VirtualMachineInstance stands for
    // its virtual machine, whose launcher pods share its addresses.
    let owner = allot_index::pod_controller(&p.metadata).map(|o| Owner {
        kind: o.kind,
        name: o.name,
    });
    LivePod {
        namespace: p.metadata.namespace.clone().unwrap_or_default(),
        name: p.metadata.name.clone().unwrap_or_default(),
        uid: p.metadata.uid.clone().unwrap_or_default(),
        node: spec.and_then(|s| s.node_name.clone()).unwrap_or_default(),
        owner,
        addresses: allot_index::multus::pod_addresses(p),
        holds: !spec.and_then(|s| s.host_network).unwrap_or(false)
            && !matches!(phase, PodPhase::Succeeded | PodPhase::Failed),
    }
}
