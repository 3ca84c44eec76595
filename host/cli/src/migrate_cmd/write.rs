//! Writing a migration plan: each object created if absent (the plan left out what is in place
//! already), claims through the store's atomic create-if-absent, Endpoints as the agent writes
//! them. A write the API refuses (the admission webhook's checks, RBAC) stops the run with the
//! API's words: what was written stays, and the next run goes on from there.

use std::collections::BTreeMap;

use allot_core::migrate::{EndpointRecord, Plan, Write};
use allot_core::store::{Store, StoreError};
use allot_k8s::openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use allot_k8s::{
    Endpoint, EndpointInterface, EndpointSpec, IPPool, IpPoolSpec, OwnerRef, ReservedIP,
    ReservedIpSpec, Subnet, SubnetSpec,
};
use anyhow::{Context as _, bail};
use kube::api::{Api, PostParams};
use serde::Serialize;
use serde::de::DeserializeOwned;

/// Claims per store call (each call is all or nothing).
const CLAIM_BATCH: usize = 100;

/// What happens to a pod's Endpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Change {
    Create,
    Update,
    Same,
    /// A later pod of the name holds it (the agent wrote it): left alone.
    Later,
}

impl Change {
    pub fn as_str(self) -> &'static str {
        match self {
            Change::Create => "create",
            Change::Update => "update (interfaces added)",
            Change::Same => "in place",
            Change::Later => "left alone (a later pod of this name holds it)",
        }
    }
}

pub struct EndpointChange {
    pub record: EndpointRecord,
    pub change: Change,
    /// The Endpoint to write (`Create`, `Update`).
    pub object: Option<Endpoint>,
}

/// What each planned Endpoint needs, given those stored.
pub fn endpoint_changes(
    plan: &Plan,
    stored: &BTreeMap<(String, String), Endpoint>,
) -> Vec<EndpointChange> {
    plan.endpoints
        .iter()
        .map(|record| {
            let key = (record.namespace.clone(), record.name.clone());
            let (change, object) = match stored.get(&key) {
                None => (Change::Create, Some(new_endpoint(record))),
                Some(e) if e.spec.uid != record.uid => (Change::Later, None),
                Some(e) => {
                    // Only interfaces it lacks are added (another peer's migration of the pod's
                    // other NIC): an interface it records is allot's word, written by the agent
                    // for the pod's sandbox (a pod started since the switch) or by an earlier
                    // run, and never replaced by what the peer recorded.
                    let mut next = e.clone();
                    for nic in interfaces(record) {
                        if !next.spec.interfaces.iter().any(|i| i.ifname == nic.ifname) {
                            next.spec.interfaces.push(nic);
                        }
                    }
                    next.spec.interfaces.sort_by(|a, b| a.ifname.cmp(&b.ifname));
                    if next.spec == e.spec {
                        (Change::Same, None)
                    } else {
                        (Change::Update, Some(next))
                    }
                }
            };
            EndpointChange {
                record: record.clone(),
                change,
                object,
            }
        })
        .collect()
}

fn interfaces(record: &EndpointRecord) -> Vec<EndpointInterface> {
    record
        .interfaces
        .iter()
        .map(|n| EndpointInterface {
            ifname: n.ifname.clone(),
            ipv4: n.ipv4.clone(),
            ipv6: n.ipv6.clone(),
            pools: n.pools.clone(),
            gateways: n.gateways.clone(),
            routes: n.routes.clone(),
        })
        .collect()
}

/// The Endpoint the agent would have written: owned by its pod (deleted with it), except a
/// StatefulSet pod's, whose addresses outlive the pod object.
fn new_endpoint(record: &EndpointRecord) -> Endpoint {
    let stateful = record
        .owner
        .as_ref()
        .is_some_and(|o| o.kind == "StatefulSet");
    let owners = (!stateful && !record.uid.is_empty()).then(|| {
        vec![OwnerReference {
            api_version: "v1".into(),
            kind: "Pod".into(),
            name: record.name.clone(),
            uid: record.uid.clone(),
            ..OwnerReference::default()
        }]
    });
    let mut e = Endpoint::new(
        &record.name,
        EndpointSpec {
            uid: record.uid.clone(),
            node: record.node.clone(),
            interfaces: interfaces(record),
            owner: record.owner.as_ref().map(|o| OwnerRef {
                kind: o.kind.clone(),
                name: o.name.clone(),
            }),
        },
    );
    e.metadata.namespace = Some(record.namespace.clone());
    e.metadata.owner_references = owners;
    e
}

/// Creates `object` unless it exists; one created meanwhile stops the run (the next plans
/// against it).
async fn create<K>(api: &Api<K>, object: &K, what: &str) -> anyhow::Result<()>
where
    K: Clone + DeserializeOwned + Serialize + std::fmt::Debug,
{
    match api.create(&PostParams::default(), object).await {
        Ok(_) => {
            println!("{what}: created");
            Ok(())
        }
        Err(kube::Error::Api(s)) if s.code == 409 => bail!(
            "{what} was created by someone else meanwhile: run `allotctl migrate` again, it plans \
             against it"
        ),
        Err(kube::Error::Api(s)) => bail!(
            "{what}: the API server refused it ({} {}): {}",
            s.code,
            s.reason,
            s.message
        ),
        Err(e) => Err(e).with_context(|| format!("{what}: cannot create it")),
    }
}

fn meta<S>(w: &Write<S>) -> ObjectMeta {
    ObjectMeta {
        name: Some(w.name.clone()),
        labels: (!w.labels.is_empty()).then(|| w.labels.clone()),
        ..ObjectMeta::default()
    }
}

pub async fn reserved(client: &kube::Client, plan: &Plan) -> anyhow::Result<()> {
    let api: Api<ReservedIP> = Api::all(client.clone());
    for w in plan.reserved.iter().filter(|w| !w.exists) {
        let object = ReservedIP {
            metadata: meta(w),
            spec: ReservedIpSpec(w.spec.clone()),
        };
        create(&api, &object, &format!("ReservedIP {}", w.name)).await?;
    }
    Ok(())
}

pub async fn subnets(client: &kube::Client, plan: &Plan) -> anyhow::Result<()> {
    let api: Api<Subnet> = Api::all(client.clone());
    for w in plan.subnets.iter().filter(|w| !w.exists) {
        let object = Subnet {
            metadata: meta(w),
            spec: SubnetSpec(w.spec.clone()),
            status: None,
        };
        create(&api, &object, &format!("Subnet {}", w.name)).await?;
    }
    Ok(())
}

/// The claims, in batches, each all or nothing: an address claimed meanwhile (an agent handed
/// it out, another run) stops here, and the next run says by whom.
pub fn claims(store: &dyn Store, plan: &Plan) -> anyhow::Result<()> {
    for batch in plan.claims.chunks(CLAIM_BATCH) {
        match store.claim(batch) {
            Ok(()) => println!("{} claim(s): created", batch.len()),
            Err(StoreError::Conflict(a)) => bail!(
                "address {a} was claimed by someone else meanwhile: nothing of its batch was \
                 written; run `allotctl migrate` again to see by whom"
            ),
            Err(e) => bail!("cannot write the claims: {e}; run `allotctl migrate` again"),
        }
    }
    Ok(())
}

pub async fn endpoints(client: &kube::Client, changes: &[EndpointChange]) -> anyhow::Result<()> {
    for c in changes {
        let Some(object) = &c.object else { continue };
        let api: Api<Endpoint> = Api::namespaced(client.clone(), &c.record.namespace);
        let what = format!("Endpoint {}/{}", c.record.namespace, c.record.name);
        match c.change {
            Change::Create => create(&api, object, &what).await?,
            Change::Update => {
                api.replace(&c.record.name, &PostParams::default(), object)
                    .await
                    .with_context(|| {
                        format!("{what} changed meanwhile: run `allotctl migrate` again")
                    })?;
                println!("{what}: updated");
            }
            Change::Same | Change::Later => {}
        }
    }
    Ok(())
}

pub async fn pools(client: &kube::Client, plan: &Plan) -> anyhow::Result<()> {
    let api: Api<IPPool> = Api::all(client.clone());
    for w in plan.pools.iter().filter(|w| !w.exists) {
        let object = IPPool {
            metadata: meta(w),
            spec: IpPoolSpec(w.spec.clone()),
            status: None,
        };
        create(&api, &object, &format!("IPPool {}", w.name)).await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use allot_core::migrate::{EndpointNic, EndpointRecord};

    fn record(ifname: &str, ipv4: &str) -> EndpointRecord {
        EndpointRecord {
            namespace: "shop".into(),
            name: "db-0".into(),
            uid: "uid-new".into(),
            node: "node-2".into(),
            owner: None,
            interfaces: vec![EndpointNic {
                ifname: ifname.into(),
                ipv4: Some(ipv4.into()),
                pools: vec!["sp-v4".into()],
                ..EndpointNic::default()
            }],
        }
    }

    /// The agent wrote db-0's Endpoint after the switch (its restart): a rerun whose plan
    /// records less of eth0 (the peer knew only its IPv4 address) leaves it as it is, and only
    /// adds an interface it lacks.
    #[test]
    fn an_endpoint_the_agent_wrote_is_never_replaced() {
        let mut agents = new_endpoint(&record("eth0", "198.51.100.200/24"));
        agents.spec.interfaces[0].ipv6 = Some("2001:db8:1ab::5:3/64".into());
        agents.spec.interfaces[0].pools.push("sp-v6".into());
        let stored = BTreeMap::from([(("shop".to_string(), "db-0".to_string()), agents.clone())]);
        let plan = Plan {
            endpoints: vec![record("eth0", "198.51.100.200/24")],
            ..Plan::default()
        };
        let changes = endpoint_changes(&plan, &stored);
        assert_eq!(changes[0].change, Change::Same);

        let plan = Plan {
            endpoints: vec![record("net1", "198.51.100.230/24")],
            ..Plan::default()
        };
        let changes = endpoint_changes(&plan, &stored);
        assert_eq!(changes[0].change, Change::Update);
        let written = changes[0].object.as_ref().unwrap();
        assert_eq!(written.spec.interfaces[0], agents.spec.interfaces[0]);
        assert_eq!(written.spec.interfaces[1].ifname, "net1");
    }
}
