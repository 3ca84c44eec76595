//! Pools published to the scheduler (issue 38 item 1): one `resource.k8s.io/v1` ResourceSlice
//! per IPPool, `<pool>.ipam.allot.dev`, driver `ipam.allot.dev`, whose device's consumable
//! capacity `addresses` is what the pool can still hand out ([`allot_core::dra`]). Kept current
//! by the leader every `--resource-slices-poll-ms`; written only when its digest changed.
//!
//! The nodes a slice serves are given by `spec.nodeSelector` (or `allNodes`), never
//! `spec.nodeName`: the kubelet deletes the slices naming its node that its own DRA plugin did
//! not publish (KEP-4381, "ResourceSlice cleanup"), and allot has no kubelet plugin yet.

pub mod plan;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use allot_core::config::Object;
use allot_core::dra::{self, Attribute, NodeScope, Publication};
use allot_core::spec::SelectorOperator;
use allot_core::store::{Changes, Store, StoreError};
use allot_index::{ClusterIndex, Shared};
use allot_k8s::openapi::api::core::v1::{NodeSelector, NodeSelectorRequirement, NodeSelectorTerm};
use allot_k8s::openapi::api::resource::v1::{
    CapacityRequestPolicy, CapacityRequestPolicyRange, Device, DeviceAttribute, DeviceCapacity,
    ResourcePool, ResourceSlice, ResourceSliceSpec,
};
use allot_k8s::openapi::apimachinery::pkg::api::resource::Quantity;
use kube::Api;
use kube::api::{DeleteParams, ListParams, ObjectMeta, PostParams};
use sha2::{Digest, Sha256};

use crate::lease::Leadership;
use crate::metrics::{Metrics, VerbLabel};
use plan::{ClaimedAddresses, Existing, Write};

/// The label on every slice allot publishes: what it lists to find its own.
pub const LABEL: &str = "allot.dev/driver";
/// The annotation holding the digest of the spec allot wrote.
pub const DIGEST: &str = "allot.dev/spec-digest";
/// How often the slices are listed again even when every write succeeded: repairs a slice
/// edited or deleted by hand.
const RELIST: Duration = Duration::from_secs(30);

/// A slice as last listed or written.
struct Known {
    digest: Option<String>,
    resource_version: Option<String>,
    generation: i64,
}

/// The publisher of one controller replica.
pub struct SlicePublisher {
    client: kube::Client,
    store: Arc<dyn Store>,
    index: Arc<Shared<ClusterIndex>>,
    leadership: Leadership,
    metrics: Arc<Metrics>,
    /// allot's slices, None until listed (again, after a failed write).
    known: Option<BTreeMap<String, Known>>,
    listed: Option<Instant>,
    /// The store's claimed addresses, kept from its change feed.
    claimed: Option<ClaimedAddresses>,
}

impl SlicePublisher {
    pub fn new(
        client: kube::Client,
        store: Arc<dyn Store>,
        index: Arc<Shared<ClusterIndex>>,
        leadership: Leadership,
        metrics: Arc<Metrics>,
    ) -> SlicePublisher {
        SlicePublisher {
            client,
            store,
            index,
            leadership,
            metrics,
            known: None,
            listed: None,
            claimed: None,
        }
    }

    fn api(&self) -> Api<ResourceSlice> {
        Api::all(self.client.clone())
    }

    async fn list(&mut self) -> Result<(), kube::Error> {
        let params = ListParams::default().labels(&format!("{LABEL}={}", dra::DRIVER));
        let listed = self.api().list(&params).await?;
        let known = listed
            .items
            .into_iter()
            .filter(|s| s.spec.driver == dra::DRIVER)
            .filter_map(|s| {
                let name = s.metadata.name.clone()?;
                Some((
                    name,
                    Known {
                        digest: s
                            .metadata
                            .annotations
                            .as_ref()
                            .and_then(|a| a.get(DIGEST).cloned()),
                        resource_version: s.metadata.resource_version.clone(),
                        generation: s.spec.pool.generation,
                    },
                ))
            })
            .collect();
        self.known = Some(known);
        self.listed = Some(Instant::now());
        Ok(())
    }

    /// The claimed addresses as of now: what changed since the last round applied to what was
    /// read then (a full read at the first round, and after the store compacted its feed).
    async fn claimed(&mut self) -> Result<&ClaimedAddresses, StoreError> {
        let store = self.store.clone();
        let since = self.claimed.as_ref().map(|c| c.revision);
        let changes = match since {
            Some(rev) => Some(
                tokio::task::spawn_blocking(move || store.changes_since(rev))
                    .await
                    .map_err(|e| StoreError::backend_caused(e.to_string(), e))??,
            ),
            None => None,
        };
        match (changes, &mut self.claimed) {
            (Some(Changes::Since { changes, revision }), Some(claimed)) => {
                claimed.apply(&changes, revision);
            }
            _ => {
                let store = self.store.clone();
                let snapshot = tokio::task::spawn_blocking(move || store.snapshot(u64::MAX))
                    .await
                    .map_err(|e| StoreError::backend_caused(e.to_string(), e))??;
                self.claimed = Some(ClaimedAddresses::of(&snapshot));
            }
        }
        Ok(self.claimed.as_ref().expect("read above"))
    }

    /// What every pool wants published, from the index's pools and ReservedIPs and the
    /// store's claims.
    async fn wanted(&mut self) -> Result<Vec<Publication>, StoreError> {
        let index = self.index.clone();
        let claimed = self.claimed().await?;
        let index = index.read();
        let reserved: Vec<allot_core::Reserved> = index
            .allot_objects()
            .filter_map(|e| match &e.observed.object {
                Ok(Object::Reserved(r)) => Some(r.clone()),
                _ => None,
            })
            .collect();
        Ok(index
            .allot_objects()
            .filter_map(|e| match &e.observed.object {
                Ok(Object::Pool(p)) => {
                    Some(dra::publication(p, &reserved, claimed.of_family(p.family)))
                }
                _ => None,
            })
            .collect())
    }

    /// One round: only while this replica leads and the pools are listed. Returns the writes
    /// made.
    pub async fn round(&mut self) -> anyhow::Result<Vec<Write>> {
        if !self.leadership.is_leading() || !self.index.read().ready_for_pools() {
            return Ok(Vec::new());
        }
        if self.known.is_none() || self.listed.is_none_or(|t| t.elapsed() >= RELIST) {
            self.list().await?;
        }
        let wanted: BTreeMap<String, (ResourceSliceSpec, String)> = self
            .wanted()
            .await?
            .iter()
            .map(|p| {
                let spec = slice_spec(p);
                let digest = digest(&spec);
                (p.slice_name(), (spec, digest))
            })
            .collect();
        let known = self.known.get_or_insert_default();
        let existing: BTreeMap<String, Existing> = known
            .iter()
            .map(|(n, k)| {
                (
                    n.clone(),
                    Existing {
                        digest: k.digest.clone(),
                    },
                )
            })
            .collect();
        let digests = wanted
            .iter()
            .map(|(n, (_, d))| (n.clone(), d.clone()))
            .collect();
        let writes = plan::plan(&existing, &digests);
        let mut done = Vec::new();
        for write in writes {
            if !self.leadership.is_leading() {
                break;
            }
            match self.write(&write, &wanted).await {
                Ok(()) => done.push(write),
                Err(e) => {
                    tracing::warn!("ResourceSlice {write:?} failed: {e}; listing again");
                    self.known = None;
                    break;
                }
            }
        }
        Ok(done)
    }

    async fn write(
        &mut self,
        write: &Write,
        wanted: &BTreeMap<String, (ResourceSliceSpec, String)>,
    ) -> Result<(), kube::Error> {
        let api = self.api();
        let known = self.known.get_or_insert_default();
        let (verb, name) = match write {
            Write::Create(n) => ("create", n),
            Write::Replace(n) => ("replace", n),
            Write::Delete(n) => ("delete", n),
        };
        match write {
            Write::Delete(_) => {
                match api.delete(name, &DeleteParams::default()).await {
                    Ok(_) => {}
                    Err(kube::Error::Api(e)) if e.code == 404 => {}
                    Err(e) => return Err(e),
                }
                known.remove(name);
                tracing::info!(slice = %name, "ResourceSlice of a deleted pool deleted");
            }
            Write::Create(_) | Write::Replace(_) => {
                let (spec, digest) = &wanted[name];
                let previous = known.get(name);
                let mut spec = spec.clone();
                // The scheduler reads a pool's slices of its highest generation only; a
                // replaced slice says it is newer.
                spec.pool.generation = previous.map_or(0, |k| k.generation + 1);
                let slice = ResourceSlice {
                    metadata: ObjectMeta {
                        name: Some(name.clone()),
                        labels: Some([(LABEL.to_string(), dra::DRIVER.to_string())].into()),
                        annotations: Some([(DIGEST.to_string(), digest.clone())].into()),
                        resource_version: previous.and_then(|k| k.resource_version.clone()),
                        ..Default::default()
                    },
                    spec,
                };
                let stored = if previous.is_some() {
                    api.replace(name, &PostParams::default(), &slice).await?
                } else {
                    api.create(&PostParams::default(), &slice).await?
                };
                known.insert(
                    name.clone(),
                    Known {
                        digest: Some(digest.clone()),
                        resource_version: stored.metadata.resource_version,
                        generation: stored.spec.pool.generation,
                    },
                );
            }
        }
        self.metrics
            .resource_slice_writes
            .get_or_create(&VerbLabel {
                verb: verb.to_string(),
            })
            .inc();
        Ok(())
    }

    /// Runs a round every `interval` until `shutdown`.
    pub async fn run(
        mut self,
        interval: Duration,
        shutdown: impl std::future::Future<Output = ()>,
    ) {
        let mut shutdown = std::pin::pin!(shutdown);
        loop {
            if let Err(e) = self.round().await {
                tracing::warn!("ResourceSlice round failed: {e:#}");
                self.known = None;
            }
            tokio::select! {
                _ = &mut shutdown => return,
                _ = tokio::time::sleep(interval) => {}
            }
        }
    }
}

/// The slice spec of `publication` (generation 0; [`SlicePublisher`] sets it).
pub fn slice_spec(publication: &Publication) -> ResourceSliceSpec {
    let (all_nodes, node_selector) = match &publication.nodes {
        NodeScope::All => (Some(true), None),
        NodeScope::Selector { labels, names } => {
            let expressions: Vec<NodeSelectorRequirement> = labels
                .iter()
                .map(|r| NodeSelectorRequirement {
                    key: r.key.clone(),
                    operator: operator(r.operator).to_string(),
                    values: (!r.values.is_empty()).then(|| r.values.clone()),
                })
                .collect();
            let fields = (!names.is_empty()).then(|| {
                vec![NodeSelectorRequirement {
                    key: "metadata.name".into(),
                    operator: "In".into(),
                    values: Some(names.clone()),
                }]
            });
            let term = NodeSelectorTerm {
                match_expressions: (!expressions.is_empty()).then_some(expressions),
                match_fields: fields,
            };
            (
                None,
                Some(NodeSelector {
                    node_selector_terms: vec![term],
                }),
            )
        }
    };
    ResourceSliceSpec {
        driver: dra::DRIVER.to_string(),
        pool: ResourcePool {
            name: publication.pool.clone(),
            generation: 0,
            resource_slice_count: 1,
        },
        all_nodes,
        node_selector,
        devices: Some(publication.devices.iter().map(device).collect()),
        ..Default::default()
    }
}

fn operator(op: SelectorOperator) -> &'static str {
    match op {
        SelectorOperator::In => "In",
        SelectorOperator::NotIn => "NotIn",
        SelectorOperator::Exists => "Exists",
        SelectorOperator::DoesNotExist => "DoesNotExist",
    }
}

fn device(d: &dra::Device) -> Device {
    let attributes = d
        .attributes
        .iter()
        .map(|(k, v)| {
            let a = match v {
                Attribute::String(s) => DeviceAttribute {
                    string: Some(s.clone()),
                    ..Default::default()
                },
                Attribute::Int(i) => DeviceAttribute {
                    int: Some(*i),
                    ..Default::default()
                },
                Attribute::Bool(b) => DeviceAttribute {
                    bool: Some(*b),
                    ..Default::default()
                },
            };
            (k.clone(), a)
        })
        .collect();
    // One address per request unless a claim asks for more (KEP-5075 requestPolicy).
    let capacity = DeviceCapacity {
        value: Quantity(d.addresses.to_string()),
        request_policy: Some(CapacityRequestPolicy {
            default: Some(Quantity("1".into())),
            valid_range: Some(CapacityRequestPolicyRange {
                min: Quantity("1".into()),
                step: Some(Quantity("1".into())),
                max: None,
            }),
            valid_values: None,
        }),
    };
    Device {
        name: d.name.clone(),
        // Many pods share a pool: the device is allocated to each, each taking addresses from
        // its capacity (KEP-5075).
        allow_multiple_allocations: Some(true),
        attributes: Some(attributes),
        capacity: Some([(dra::CAPACITY.to_string(), capacity)].into()),
        ..Default::default()
    }
}

/// The digest of `spec` (generation excluded: it changes with each write, not with the pool).
pub fn digest(spec: &ResourceSliceSpec) -> String {
    let json = serde_json::to_vec(spec).expect("a ResourceSliceSpec serializes");
    let hash = Sha256::digest(&json);
    hash.iter().take(16).map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use allot_core::dra::NodeRequirement;

    fn publication(nodes: NodeScope, addresses: u64) -> Publication {
        Publication {
            pool: "p".into(),
            nodes,
            devices: vec![dra::Device {
                name: "ipv4".into(),
                attributes: [("pool".to_string(), Attribute::String("p".into()))].into(),
                addresses,
            }],
        }
    }

    #[test]
    fn a_pool_for_every_node_says_all_nodes_never_a_node_name() {
        let spec = slice_spec(&publication(NodeScope::All, 19));
        assert_eq!(spec.all_nodes, Some(true));
        assert_eq!(spec.node_name, None);
        assert_eq!(spec.node_selector, None);
        let d = &spec.devices.as_ref().unwrap()[0];
        assert_eq!(d.allow_multiple_allocations, Some(true));
        assert_eq!(d.capacity.as_ref().unwrap()["addresses"].value.0, "19");
        assert_eq!(spec.pool.resource_slice_count, 1);
    }

    #[test]
    fn node_names_are_a_field_selector_not_spec_node_name() {
        let scope = NodeScope::Selector {
            labels: vec![NodeRequirement {
                key: "zone".into(),
                operator: SelectorOperator::Exists,
                values: vec![],
            }],
            names: vec!["node-1".into()],
        };
        let spec = slice_spec(&publication(scope, 1));
        assert_eq!(spec.node_name, None);
        assert_eq!(spec.all_nodes, None);
        let term = &spec.node_selector.unwrap().node_selector_terms[0];
        let e = &term.match_expressions.as_ref().unwrap()[0];
        assert_eq!((e.key.as_str(), e.operator.as_str()), ("zone", "Exists"));
        assert_eq!(e.values, None);
        let f = &term.match_fields.as_ref().unwrap()[0];
        assert_eq!(f.key, "metadata.name");
        assert_eq!(f.values.as_deref(), Some(&["node-1".to_string()][..]));
    }

    #[test]
    fn the_digest_follows_the_capacity() {
        let a = digest(&slice_spec(&publication(NodeScope::All, 19)));
        let b = digest(&slice_spec(&publication(NodeScope::All, 18)));
        assert_ne!(a, b);
        assert_eq!(a, digest(&slice_spec(&publication(NodeScope::All, 19))));
    }
}
