//! Policies per cluster, hot-swapped atomically: a call takes a reference to the current policy
//! and finishes on it even if a new one is installed meanwhile.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, RwLock};

use allot_core::PolicyError;
use allot_core::policy::{Decision, Inventory, Policy, Request};

use crate::LoadedPolicy;
use crate::record::{DecisionLog, Recorded};

/// What a cluster wants when its policy faults (traps, deadline, memory cap, bogus output).
/// A policy's verdict about the input (e.g. a malformed annotation) is never overridden.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum OnFailure {
    /// Fail the allocation with the policy's error.
    #[default]
    Fail,
    /// Decide with the embedded default policy instead.
    FallBackToDefault,
}

#[derive(Debug)]
pub struct ClusterPolicy {
    pub policy: Arc<LoadedPolicy>,
    pub on_failure: OnFailure,
}

/// A decision and which policy made it.
#[derive(Debug)]
pub struct Outcome {
    pub decision: Decision,
    /// Name of the policy whose decision this is.
    pub decided_by: String,
    /// The cluster's policy faulted with this error and the default decided instead.
    pub fallback_from: Option<PolicyError>,
}

pub struct PolicyRegistry {
    default: Arc<LoadedPolicy>,
    clusters: RwLock<HashMap<String, Arc<ClusterPolicy>>>,
    log: Option<Arc<DecisionLog>>,
    faults: Mutex<BTreeMap<FaultKey, u64>>,
}

/// Faults counted since the registry was made, by kind (`trap`, `deadline`, …, as
/// [`allot_core::PolicyErrorKind::as_str`] names them) and by whether the default policy decided
/// instead. Verdicts about the input are not faults and are not counted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct FaultKey {
    pub kind: &'static str,
    pub fell_back: bool,
}

impl PolicyRegistry {
    pub fn new(default: Arc<LoadedPolicy>) -> Self {
        PolicyRegistry {
            default,
            clusters: RwLock::new(HashMap::new()),
            log: None,
            faults: Mutex::new(BTreeMap::new()),
        }
    }

    /// Every policy fault so far, by kind and outcome (for the agent's metrics).
    pub fn faults(&self) -> Vec<(FaultKey, u64)> {
        let faults = self.faults.lock().unwrap_or_else(|p| p.into_inner());
        faults.iter().map(|(k, n)| (*k, *n)).collect()
    }

    fn count_fault(&self, error: &PolicyError, fell_back: bool) {
        if !error.kind.is_fault() {
            return;
        }
        let key = FaultKey {
            kind: error.kind.as_str(),
            fell_back,
        };
        *self
            .faults
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(key)
            .or_default() += 1;
    }

    /// Records every decision (and error) into `log`, for `allotctl policy record`.
    pub fn with_decision_log(mut self, log: Arc<DecisionLog>) -> Self {
        self.log = Some(log);
        self
    }

    pub fn decision_log(&self) -> Option<&Arc<DecisionLog>> {
        self.log.as_ref()
    }

    pub fn default_policy(&self) -> &Arc<LoadedPolicy> {
        &self.default
    }

    /// Installs (or replaces) a cluster's policy; returns the previous one.
    pub fn install(
        &self,
        cluster: &str,
        policy: Arc<LoadedPolicy>,
        on_failure: OnFailure,
    ) -> Option<Arc<ClusterPolicy>> {
        let entry = Arc::new(ClusterPolicy { policy, on_failure });
        self.clusters
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(cluster.to_string(), entry)
    }

    /// Removes a cluster's policy: it then uses the default.
    pub fn remove(&self, cluster: &str) -> Option<Arc<ClusterPolicy>> {
        self.clusters
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .remove(cluster)
    }

    /// The cluster's current policy, or None when it uses the default.
    pub fn get(&self, cluster: &str) -> Option<Arc<ClusterPolicy>> {
        self.clusters
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(cluster)
            .cloned()
    }

    pub fn decide(
        &self,
        cluster: &str,
        inventory: &Arc<Inventory>,
        request: &Request,
    ) -> Result<Outcome, PolicyError> {
        let entry = self.get(cluster);
        let asked = entry.as_ref().map_or(&self.default, |e| &e.policy);
        let result = match &entry {
            None => self.decide_with_default(inventory, request, None),
            Some(entry) => match entry.policy.decide(inventory, request) {
                Ok(decision) => Ok(Outcome {
                    decision,
                    decided_by: entry.policy.name().to_string(),
                    fallback_from: None,
                }),
                Err(e) if e.kind.is_fault() && entry.on_failure == OnFailure::FallBackToDefault => {
                    tracing::warn!(cluster, policy = entry.policy.name(), error = %e, "policy faulted; deciding with the default policy");
                    self.count_fault(&e, true);
                    self.decide_with_default(inventory, request, Some(e))
                }
                Err(e) => Err(e),
            },
        };
        if let Err(e) = &result {
            self.count_fault(e, false);
        }
        if let Some(log) = &self.log {
            let (policy, fallback_from) = match &result {
                Ok(Outcome {
                    fallback_from: Some(e),
                    ..
                }) => (&self.default, Some(e.clone())),
                _ => (asked, None),
            };
            log.push(|seq| Recorded {
                seq,
                at: std::time::SystemTime::now(),
                policy: policy.name().to_string(),
                sha256: policy.sha256().to_string(),
                fallback_from,
                inventory: inventory.clone(),
                request: request.clone(),
                result: result
                    .as_ref()
                    .map(|o| o.decision.clone())
                    .map_err(Clone::clone),
            });
        }
        result
    }

    fn decide_with_default(
        &self,
        inventory: &Arc<Inventory>,
        request: &Request,
        fallback_from: Option<PolicyError>,
    ) -> Result<Outcome, PolicyError> {
        let decision = self.default.decide(inventory, request)?;
        Ok(Outcome {
            decision,
            decided_by: self.default.name().to_string(),
            fallback_from,
        })
    }

    /// A [`Policy`] bound to one cluster, for the allocation engine.
    pub fn for_cluster(self: &Arc<Self>, cluster: &str) -> ClusterHandle {
        ClusterHandle {
            registry: self.clone(),
            cluster: cluster.to_string(),
        }
    }
}

pub struct ClusterHandle {
    registry: Arc<PolicyRegistry>,
    cluster: String,
}

impl Policy for ClusterHandle {
    fn decide(
        &self,
        inventory: &Arc<Inventory>,
        request: &Request,
    ) -> Result<Decision, PolicyError> {
        self.registry
            .decide(&self.cluster, inventory, request)
            .map(|o| o.decision)
    }

    /// The cluster's current policy, or the default when it has none.
    fn name(&self) -> String {
        match self.registry.get(&self.cluster) {
            Some(entry) => entry.policy.name().to_string(),
            None => self.registry.default.name().to_string(),
        }
    }

    /// Every policy of the registry (the cluster's and the default) is a component, whose
    /// answers the runtime checks.
    fn validates(&self) -> bool {
        true
    }
}
