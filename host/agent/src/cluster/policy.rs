//! The agent follows the cluster's `Policy` object: when its source, digest or limits change,
//! the new component is fetched, checked against the digest, compiled and tried on a smoke
//! decision before it replaces the serving one in the registry (an atomic swap: calls in
//! flight finish on the old component, none is dropped). A component that fails any step
//! leaves the serving one in place; the reason goes to the Policy's status and to an Event.

use std::sync::Arc;

use allot_core::policy::{Inventory, Nic, PodInfo, Policy as _, PolicyError, Request};
use allot_k8s::openapi::api::core::v1::{ConfigMap, ObjectReference};
use allot_k8s::{PolicyLocation, PolicySpec};
use allot_policy::{
    Limits, LoadedPolicy, OnFailure, PolicyEngine, PolicyRegistry, PolicySource, PrecompiledCache,
};
use futures::StreamExt;
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::json;

/// What the agent needs to follow one Policy object.
pub struct PolicyFollower {
    pub client: kube::Client,
    pub registry: Arc<PolicyRegistry>,
    /// The registry key the engine decides with.
    pub cluster: String,
    /// The Policy object's name.
    pub name: String,
    pub node: String,
    /// Limits when the Policy sets none (the agent's flags).
    pub base_limits: Limits,
    pub cache: Option<PrecompiledCache>,
    /// What serves when no Policy object exists (the embedded default, or `--policy`).
    pub base: Option<(Arc<LoadedPolicy>, OnFailure)>,
    /// How to reach the registries of `oci://` sources.
    pub oci: allot_oci::Options,
}

/// A refusal: the digest of what was refused, when known, and why.
struct Refusal {
    digest: Option<String>,
    reason: String,
}

impl PolicyFollower {
    /// Follows the Policy until the runtime stops.
    pub async fn run(self) {
        let resource = ApiResource::erase::<allot_k8s::Policy>(&());
        let api = Api::<DynamicObject>::all_with(self.client.clone(), &resource);
        let config = watcher::Config::default().fields(&format!("metadata.name={}", self.name));
        let recorder = Recorder::new(
            self.client.clone(),
            Reporter {
                controller: "allot-agent".into(),
                instance: Some(self.node.clone()),
            },
        );
        let mut applied: Option<String> = None;
        let mut listed_one = false;
        let mut events = std::pin::pin!(watcher(api.clone(), config).default_backoff());
        while let Some(event) = events.next().await {
            let object = match event {
                Ok(watcher::Event::Apply(o) | watcher::Event::InitApply(o)) => {
                    listed_one = true;
                    o
                }
                Ok(watcher::Event::Init) => {
                    listed_one = false;
                    continue;
                }
                // No Policy (deleted, or never created): what served before one existed.
                Ok(watcher::Event::Delete(_)) => {
                    self.restore_base(&mut applied);
                    continue;
                }
                Ok(watcher::Event::InitDone) => {
                    if !listed_one {
                        self.restore_base(&mut applied);
                    }
                    continue;
                }
                Err(e) => {
                    tracing::warn!(policy = %self.name, "watching the Policy: {e}");
                    continue;
                }
            };
            if object.metadata.deletion_timestamp.is_some() {
                continue;
            }
            let spec_json = object.data.get("spec").cloned().unwrap_or_default();
            let key = spec_json.to_string();
            if applied.as_deref() == Some(key.as_str()) {
                continue;
            }
            applied = Some(key);
            let outcome = match serde_json::from_value::<PolicySpec>(spec_json) {
                Ok(spec) => self.load(&spec).await,
                Err(e) => Err(Refusal {
                    digest: None,
                    reason: format!("the Policy's spec cannot be read: {e}"),
                }),
            };
            self.report(&api, &recorder, &object, outcome).await;
        }
    }

    fn restore_base(&self, applied: &mut Option<String>) {
        if applied.take().is_none() {
            return;
        }
        match &self.base {
            Some((policy, on_failure)) => {
                self.registry
                    .install(&self.cluster, policy.clone(), *on_failure);
            }
            None => {
                self.registry.remove(&self.cluster);
            }
        }
        tracing::info!(policy = %self.name, "the Policy is gone; serving the agent's own policy again");
    }

    /// Fetches, verifies, compiles, smoke-tests and installs the component `spec` names.
    async fn load(&self, spec: &PolicySpec) -> Result<String, Refusal> {
        let refuse = |digest: Option<String>, reason: String| Refusal { digest, reason };
        let location = spec
            .source
            .location()
            .map_err(|e| refuse(None, e.to_string()))?;
        let (name, bytes) = match location {
            PolicyLocation::File(path) => {
                let path = path.to_string();
                let bytes = read_component(&path).await.map_err(|e| {
                    refuse(
                        None,
                        format!("cannot read {path} on node {}: {e}", self.node),
                    )
                })?;
                (path, bytes)
            }
            PolicyLocation::ConfigMap(key) => {
                let what = format!("ConfigMap {}/{} key {}", key.namespace, key.name, key.key);
                let cm = Api::<ConfigMap>::namespaced(self.client.clone(), &key.namespace)
                    .get(&key.name)
                    .await
                    .map_err(|e| refuse(None, format!("cannot read {what}: {e}")))?;
                let bytes = cm
                    .binary_data
                    .and_then(|mut d| d.remove(&key.key))
                    .map(|b| b.0)
                    .ok_or_else(|| refuse(None, format!("{what}: no such binaryData key")))?;
                (what, bytes)
            }
            PolicyLocation::Oci(reference) => {
                let source = allot_oci::OciSource::parse(reference)
                    .map_err(|e| refuse(None, e.to_string()))?;
                if source.digest().is_none() && spec.sha256.is_none() {
                    tracing::warn!(policy = %self.name, %reference, "the Policy names an OCI tag and no sha256: nodes that pull at different times may get different components; pin it with @sha256:… or spec.sha256");
                }
                let pulled = allot_oci::pull(&source, &self.oci)
                    .await
                    .map_err(|e| refuse(None, e.to_string()))?;
                (reference.to_string(), pulled.component)
            }
        };
        let digest = format!("sha256:{}", allot_policy::sha256_hex(&bytes));
        let mut source = PolicySource::bytes(name, bytes);
        if let Some(expected) = &spec.sha256 {
            source = source.with_sha256(expected.trim_start_matches("sha256:"));
        }
        let limits = Limits {
            memory_bytes: spec
                .memory_mib
                .map_or(self.base_limits.memory_bytes, |m| (m as usize) << 20),
            deadline: spec.deadline_ms.map_or(self.base_limits.deadline, |d| {
                std::time::Duration::from_millis(d.into())
            }),
            ..self.base_limits
        };
        let cache = self.cache.clone();
        let on_failure = match spec.on_failure {
            allot_k8s::OnFailure::Fail => OnFailure::Fail,
            allot_k8s::OnFailure::Fallback => OnFailure::FallBackToDefault,
        };
        let loaded = tokio::task::spawn_blocking(move || {
            let engine = PolicyEngine::new(limits, cache).map_err(|e| e.to_string())?;
            let policy = engine.load(&source).map_err(|e| e.to_string())?;
            smoke(&policy).map_err(|e| e.to_string())?;
            Ok::<_, String>(policy)
        })
        .await
        .map_err(|e| refuse(Some(digest.clone()), format!("loading failed: {e}")))?
        .map_err(|reason| refuse(Some(digest.clone()), reason))?;
        self.registry
            .install(&self.cluster, Arc::new(loaded), on_failure);
        Ok(digest)
    }

    /// Writes the outcome to the Policy's status and as an Event on it.
    async fn report(
        &self,
        api: &Api<DynamicObject>,
        recorder: &Recorder,
        object: &DynamicObject,
        outcome: Result<String, Refusal>,
    ) {
        let name = &self.name;
        // Every agent writes the same status; only refusals become Events (one per node),
        // so that a rollout to a thousand nodes does not add a thousand Normal events.
        let (status, event) = match &outcome {
            Ok(digest) => {
                tracing::info!(policy = %name, %digest, "serving the Policy's component");
                (
                    json!({"servingDigest": digest, "refusedDigest": null, "refusedReason": null}),
                    None,
                )
            }
            Err(refusal) => {
                let serving = self
                    .registry
                    .get(&self.cluster)
                    .map(|p| format!("sha256:{}", p.policy.sha256()))
                    .unwrap_or_else(|| "the embedded default".into());
                tracing::error!(policy = %name, reason = %refusal.reason, %serving, "refused the Policy's component; the serving one stays");
                (
                    json!({"refusedDigest": refusal.digest, "refusedReason": refusal.reason}),
                    Some(Event {
                        type_: EventType::Warning,
                        reason: "PolicyRefused".into(),
                        note: Some(allot_k8s::event_note(&format!(
                            "node {}: {}; still serving {serving}",
                            self.node, refusal.reason
                        ))),
                        action: "LoadPolicy".into(),
                        secondary: None,
                    }),
                )
            }
        };
        let patch = Patch::Merge(json!({"status": status}));
        if let Err(e) = api
            .patch_status(name, &PatchParams::default(), &patch)
            .await
        {
            tracing::warn!(policy = %name, "cannot write the Policy's status: {e}");
        }
        let Some(event) = event else {
            return;
        };
        let reference = ObjectReference {
            api_version: Some(format!("{}/{}", allot_k8s::GROUP, allot_k8s::VERSION)),
            kind: Some("Policy".into()),
            name: object.metadata.name.clone(),
            uid: object.metadata.uid.clone(),
            resource_version: object.metadata.resource_version.clone(),
            ..Default::default()
        };
        if let Err(e) = recorder.publish(&event, &reference).await {
            tracing::warn!(policy = %name, "cannot record an Event: {e}");
        }
    }
}

/// The largest component the agent reads from a node file (the default policy is well under
/// 1 MiB; a ConfigMap cannot hold more than 1 MiB anyway).
const MAX_COMPONENT_BYTES: u64 = 64 << 20;

/// Reads a component file named by the Policy: a regular file of at most
/// [`MAX_COMPONENT_BYTES`], so that a path like `/dev/zero` or a FIFO can neither exhaust the
/// agent's memory nor block the follower forever.
async fn read_component(path: &str) -> std::io::Result<Vec<u8>> {
    let path = path.to_string();
    tokio::task::spawn_blocking(move || {
        use std::io::Read as _;
        let invalid = |why: String| std::io::Error::new(std::io::ErrorKind::InvalidData, why);
        if !std::fs::metadata(&path)?.is_file() {
            return Err(invalid("not a regular file".into()));
        }
        let mut bytes = Vec::new();
        std::fs::File::open(&path)?
            .take(MAX_COMPONENT_BYTES + 1)
            .read_to_end(&mut bytes)?;
        if bytes.len() as u64 > MAX_COMPONENT_BYTES {
            return Err(invalid(format!(
                "larger than {} MiB",
                MAX_COMPONENT_BYTES >> 20
            )));
        }
        Ok(bytes)
    })
    .await
    .map_err(std::io::Error::other)?
}

/// A component that faulted on the smoke decision: `source` says how (its kind: trap,
/// deadline, memory limit, bad output).
#[derive(Debug, thiserror::Error)]
#[error("the smoke decision failed: {source}")]
pub struct SmokeError {
    #[source]
    pub source: PolicyError,
}

/// One decision on an empty inventory: a component that traps, loops past its deadline,
/// exhausts its memory or returns bogus output here is refused before it serves a pod. A
/// verdict about the input ("no pool fits") is a decision, not a fault.
pub fn smoke(policy: &LoadedPolicy) -> Result<(), SmokeError> {
    let request = Request {
        pod: PodInfo {
            namespace: "allot-smoke-test".into(),
            name: "smoke".into(),
            uid: "00000000-0000-0000-0000-000000000000".into(),
            ..Default::default()
        },
        nics: vec![Nic {
            interface: "eth0".into(),
            multus_name: String::new(),
        }],
        ..Default::default()
    };
    match policy.decide(&Arc::new(Inventory::default()), &request) {
        Err(source) if source.kind.is_fault() => Err(SmokeError { source }),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_component_path_that_is_no_regular_file_is_refused_without_reading_it() {
        for path in ["/dev/zero", "/proc/self"] {
            let err = read_component(path).await.unwrap_err();
            assert!(
                err.to_string().contains("not a regular file"),
                "{path}: {err}"
            );
        }
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("policy.wasm");
        std::fs::write(&file, b"\0asm").unwrap();
        assert_eq!(
            read_component(file.to_str().unwrap()).await.unwrap(),
            b"\0asm"
        );
    }

    #[test]
    fn the_embedded_default_passes_the_smoke_decision() {
        let engine = PolicyEngine::new(Limits::default(), None).unwrap();
        let policy = engine.load(&PolicySource::embedded_default()).unwrap();
        smoke(&policy).unwrap();
    }
}
