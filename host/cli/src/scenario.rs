//! Policy scenarios: an inventory, a pod on a node, and the decision expected of the policy
//! (format: examples/scenarios/README.md).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use allot_core::policy::{
    CniDefaults, Inventory, Labels, NamespaceInfo, Nic, NodeInfo, Owner, PodInfo, Request,
};
use allot_core::pool::reserved_set;
use allot_core::spec::{IpPoolSpec, ObjectMeta, ReservedIpSpec, RouteSpec, SubnetSpec};
use allot_core::{IpFamily, Pool, Reserved, SpecError, Subnet};
use anyhow::{Context as _, bail};
use serde::{Deserialize, Deserializer};

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Scenario {
    #[serde(default)]
    pub description: Option<String>,
    #[serde(default)]
    pub pools: Vec<Object<IpPoolSpec>>,
    #[serde(default)]
    pub subnets: Vec<Object<SubnetSpec>>,
    #[serde(default, rename = "reservedIPs")]
    pub reserved_ips: Vec<Object<ReservedIpSpec>>,
    #[serde(default)]
    pub namespace: NamespaceInput,
    #[serde(default)]
    pub node: NodeInput,
    #[serde(default)]
    pub pod: PodInput,
    #[serde(default)]
    pub nics: Vec<NicInput>,
    #[serde(default)]
    pub cni_defaults: CniDefaultsInput,
    pub expect: Expect,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Object<S> {
    #[serde(default)]
    pub api_version: Option<String>,
    #[serde(default)]
    pub kind: Option<String>,
    pub metadata: ObjectMeta,
    pub spec: S,
    #[serde(default)]
    pub status: Status,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Status {
    /// Addresses of the pool already in use.
    #[serde(default, rename = "allocatedIPCount")]
    pub allocated_ip_count: u64,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NamespaceInput {
    #[serde(default = "default_namespace")]
    pub name: String,
    #[serde(default)]
    pub labels: Labels,
    #[serde(default)]
    pub annotations: Labels,
}

fn default_namespace() -> String {
    "default".into()
}

impl Default for NamespaceInput {
    fn default() -> Self {
        NamespaceInput {
            name: default_namespace(),
            labels: Labels::new(),
            annotations: Labels::new(),
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeInput {
    #[serde(default = "default_node")]
    pub name: String,
    #[serde(default)]
    pub labels: Labels,
}

fn default_node() -> String {
    "node-1".into()
}

impl Default for NodeInput {
    fn default() -> Self {
        NodeInput {
            name: default_node(),
            labels: Labels::new(),
        }
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PodInput {
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub namespace: Option<String>,
    #[serde(default)]
    pub uid: Option<String>,
    #[serde(default)]
    pub labels: Labels,
    #[serde(default)]
    pub annotations: Labels,
    #[serde(default)]
    pub owner: Option<OwnerInput>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OwnerInput {
    pub kind: String,
    pub name: String,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NicInput {
    pub interface: String,
    #[serde(default)]
    pub multus_name: String,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CniDefaultsInput {
    #[serde(default)]
    pub ipv4: Vec<String>,
    #[serde(default)]
    pub ipv6: Vec<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Expect {
    #[serde(default)]
    pub error: Option<String>,
    #[serde(default)]
    pub error_kind: Option<String>,
    #[serde(default)]
    pub nics: BTreeMap<String, NicExpect>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NicExpect {
    /// The NIC fails with an error containing this text (the request's other NICs decide).
    #[serde(default)]
    pub error: Option<String>,
    #[serde(default)]
    pub error_kind: Option<String>,
    #[serde(default)]
    pub families: Option<Vec<String>>,
    #[serde(default)]
    pub clean_gateway: Option<bool>,
    #[serde(default)]
    pub routes: Option<Vec<RouteSpec>>,
    #[serde(default)]
    pub ipv4: Option<FamilyExpect>,
    #[serde(default)]
    pub ipv6: Option<FamilyExpect>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FamilyExpect {
    #[serde(default)]
    pub rule: Option<String>,
    #[serde(default)]
    pub source: Option<String>,
    #[serde(default)]
    pub candidates: Option<Vec<String>>,
    #[serde(default)]
    pub order: Option<Vec<String>>,
    /// Absent: not checked; null: no pool left; a name: the first of the order.
    #[serde(default, deserialize_with = "present")]
    pub chosen: Option<Option<String>>,
    #[serde(default)]
    pub dropped: Option<BTreeMap<String, String>>,
    /// Absent: not checked; null: the policy names no address (the host picks); an address:
    /// the one the policy names for this family (contract 0.3.0).
    #[serde(default, deserialize_with = "present")]
    pub address: Option<Option<String>>,
}

fn present<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Option<String>>, D::Error> {
    Option::<String>::deserialize(d).map(Some)
}

impl Expect {
    fn is_empty(&self) -> bool {
        self.error.is_none() && self.error_kind.is_none() && self.nics.is_empty()
    }
}

/// One scenario read from a file, with where it came from.
#[derive(Debug)]
pub struct Loaded {
    /// `path` or `path#N` for the N-th document of a multi-document file.
    pub label: String,
    pub scenario: Result<Scenario, String>,
}

/// Reads the scenario files under `paths` (files or directories, recursively, `.yaml`/`.yml`),
/// in path order. A file that fails to parse yields an entry whose scenario is the error.
pub fn load_all(paths: &[PathBuf]) -> anyhow::Result<Vec<Loaded>> {
    let mut files = Vec::new();
    for p in paths {
        collect(p, &mut files).with_context(|| format!("reading {}", p.display()))?;
    }
    if files.is_empty() {
        bail!("no scenario files (*.yaml, *.yml) under {}", join(paths));
    }
    let mut out = Vec::new();
    for file in files {
        out.extend(load_file(&file));
    }
    Ok(out)
}

fn join(paths: &[PathBuf]) -> String {
    paths
        .iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

fn collect(path: &Path, files: &mut Vec<PathBuf>) -> anyhow::Result<()> {
    let meta = std::fs::metadata(path)?;
    if meta.is_file() {
        files.push(path.to_path_buf());
        return Ok(());
    }
    let mut entries: Vec<PathBuf> = std::fs::read_dir(path)?
        .map(|e| e.map(|e| e.path()))
        .collect::<Result<_, _>>()?;
    entries.sort();
    for entry in entries {
        if entry.is_dir() {
            collect(&entry, files)?;
        } else if matches!(
            entry.extension().and_then(|e| e.to_str()),
            Some("yaml" | "yml")
        ) {
            files.push(entry);
        }
    }
    Ok(())
}

pub fn load_file(path: &Path) -> Vec<Loaded> {
    let label = path.display().to_string();
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) => {
            return vec![Loaded {
                label,
                scenario: Err(format!("cannot read: {e}")),
            }];
        }
    };
    // serde_yaml's document iterator yields errors forever after a syntax error: stop at the
    // first document that fails.
    let mut scenarios = Vec::new();
    for doc in serde_yaml::Deserializer::from_str(&text) {
        let scenario = Scenario::deserialize(doc)
            .map_err(|e| format!("not a valid scenario: {e}"))
            .and_then(|s| {
                if s.expect.is_empty() {
                    Err(
                        "the scenario expects nothing: give expect.nics or expect.error"
                            .to_string(),
                    )
                } else {
                    Ok(s)
                }
            });
        let failed = scenario.is_err();
        scenarios.push(scenario);
        if failed {
            break;
        }
    }
    let many = scenarios.len() > 1;
    scenarios
        .into_iter()
        .enumerate()
        .map(|(i, scenario)| Loaded {
            label: if many {
                format!("{label}#{}", i + 1)
            } else {
                label.clone()
            },
            scenario,
        })
        .collect()
}

/// Why a scenario's objects make no inventory.
#[derive(Debug, thiserror::Error)]
pub enum InputsError {
    /// An object under the wrong list (`pools`, `subnets`, `reservedIPs`).
    #[error("{name} is a {kind} where a {expected} belongs")]
    WrongKind {
        name: String,
        kind: String,
        expected: &'static str,
    },
    #[error("{name}: apiVersion {api_version} is not allot.dev/v1alpha1")]
    WrongApiVersion { name: String, api_version: String },
    /// An object that fails the checks the agent applies.
    #[error("{0}")]
    Invalid(#[source] SpecError),
}

/// A scenario turned into the policy's inputs.
pub struct Inputs {
    pub inventory: Arc<Inventory>,
    pub request: Request,
}

impl Scenario {
    /// Checks the objects (as the agent would) and builds the inventory and request.
    pub fn inputs(&self, generation: u64) -> Result<Inputs, InputsError> {
        let mut pools = Vec::new();
        let mut allocated = BTreeMap::new();
        for o in &self.pools {
            check_kind(o, "IPPool")?;
            let pool = Pool::from_spec(o.metadata.clone(), o.spec.clone())
                .map_err(InputsError::Invalid)?;
            allocated.insert(pool.meta.name.clone(), o.status.allocated_ip_count);
            pools.push(pool);
        }
        let subnets = self
            .subnets
            .iter()
            .map(|o| {
                check_kind(o, "Subnet")?;
                Subnet::from_spec(o.metadata.clone(), o.spec.clone()).map_err(InputsError::Invalid)
            })
            .collect::<Result<Vec<_>, _>>()?;
        let reserved = self
            .reserved_ips
            .iter()
            .map(|o| {
                check_kind(o, "ReservedIP")?;
                Reserved::from_spec(o.metadata.clone(), o.spec.clone())
                    .map_err(InputsError::Invalid)
            })
            .collect::<Result<Vec<_>, _>>()?;
        let inventory = Inventory::build(generation, &pools, &subnets, &reserved);
        let reserved_v4 = reserved_set(IpFamily::V4, &reserved);
        let reserved_v6 = reserved_set(IpFamily::V6, &reserved);
        let by_name: BTreeMap<&str, &Pool> = pools.iter().map(|p| (p.name(), p)).collect();
        let free_counts = inventory
            .pools
            .iter()
            .map(|ip| {
                let pool = by_name[ip.name.as_str()];
                let reserved = match pool.family {
                    IpFamily::V4 => &reserved_v4,
                    IpFamily::V6 => &reserved_v6,
                };
                pool.facts(reserved, allocated[ip.name.as_str()]).free
            })
            .collect();
        let pod_name = self.pod.name.clone().unwrap_or_else(|| "pod-0".into());
        let request = Request {
            pod: PodInfo {
                namespace: self
                    .pod
                    .namespace
                    .clone()
                    .unwrap_or_else(|| self.namespace.name.clone()),
                uid: self
                    .pod
                    .uid
                    .clone()
                    .unwrap_or_else(|| format!("uid-{pod_name}")),
                name: pod_name,
                labels: self.pod.labels.clone(),
                annotations: self.pod.annotations.clone(),
                owner: self.pod.owner.as_ref().map(|o| Owner {
                    kind: o.kind.clone(),
                    name: o.name.clone(),
                }),
            },
            namespace: NamespaceInfo {
                name: self.namespace.name.clone(),
                labels: self.namespace.labels.clone(),
                annotations: self.namespace.annotations.clone(),
            },
            node: NodeInfo {
                name: self.node.name.clone(),
                labels: self.node.labels.clone(),
            },
            nics: if self.nics.is_empty() {
                vec![Nic {
                    interface: "eth0".into(),
                    multus_name: String::new(),
                }]
            } else {
                self.nics
                    .iter()
                    .map(|n| Nic {
                        interface: n.interface.clone(),
                        multus_name: n.multus_name.clone(),
                    })
                    .collect()
            },
            cni_defaults: CniDefaults {
                ipv4: self.cni_defaults.ipv4.clone(),
                ipv6: self.cni_defaults.ipv6.clone(),
            },
            free_counts,
        };
        Ok(Inputs {
            inventory: Arc::new(inventory),
            request,
        })
    }
}

fn check_kind<S>(o: &Object<S>, expected: &'static str) -> Result<(), InputsError> {
    if let Some(k) = &o.kind
        && k != expected
    {
        return Err(InputsError::WrongKind {
            name: o.metadata.name.clone(),
            kind: k.clone(),
            expected,
        });
    }
    if let Some(v) = &o.api_version
        && v != "allot.dev/v1alpha1"
    {
        return Err(InputsError::WrongApiVersion {
            name: o.metadata.name.clone(),
            api_version: v.clone(),
        });
    }
    Ok(())
}
