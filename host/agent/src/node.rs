//! The node: one agent's state (the engine and its store, the policy registry, the configuration
//! in force, the DEL journal, metrics, cluster mode's indexes, probe defaults and probing ahead)
//! and its verbs, taking the wire contract's requests (`allot_api`) and returning its answers or
//! a [`NodeError`]. The HTTP server (`server`) only decodes requests, calls a verb and encodes
//! what it returns; the verbs can be called in process, without a socket or root.
//!
//! Engine work (store I/O, fsync) runs on blocking threads; each verb of an attachment runs
//! under the attachment's lock ([`allot_engine::Engine::serialize`]), so an ADD, a DEL
//! and a DEL remembered in the journal are served one after another, in order.

mod add;
mod release;
mod reload;

use std::sync::Arc;

use allot_api::{self as api, ProbeSettings, codes};
use allot_core::PolicyErrorKind;
use allot_core::store::StoreError;
use allot_engine::AllocError;
use allot_policy::{DecisionLog, PolicyRegistry};

use crate::ahead::{AheadConfig, ProbeAhead};
use crate::cluster::Cluster;
use crate::config::{self, SharedConfig};
use crate::engine::AgentEngine;
use crate::journal::Journal;
use crate::metrics::Metrics;

/// How long a quarantined address stays out of use by default: an hour. The host that answered
/// for it is usually there to stay (a static address, an appliance, a forgotten VM), so a short
/// quarantine would only send the pool's round-robin cursor back to it soon, to find it taken
/// again at the next ADD (one more probe round); an hour bounds what a transient conflict (a
/// host that has since moved) costs the pool. When it expires the address is released, cools
/// down, and is probed again before it is handed out on any network that probes. Operators see
/// it meanwhile in `allotctl claims list` and `allot_quarantined_addresses`.
pub const DEFAULT_QUARANTINE_SECONDS: u64 = 3600;

/// Underlay safety, the agent's side: the probe defaults it hands the plugin and how long the
/// addresses the plugin found in use stay quarantined (the plugin probes: see `allot-cni`'s
/// `probe` module for why it, not the agent).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Underlay {
    /// The defaults the plugin applies to a network without a `probe` section; `None` when they
    /// probe nothing.
    pub probe: Option<ProbeSettings>,
    pub quarantine_seconds: u64,
    /// `--probe-ahead` and its settings; `None` when off.
    pub ahead: Option<AheadConfig>,
    /// `--announce-after-migration`.
    pub announce_after_migration: bool,
}

impl Default for Underlay {
    fn default() -> Self {
        Underlay {
            probe: None,
            quarantine_seconds: DEFAULT_QUARANTINE_SECONDS,
            ahead: None,
            announce_after_migration: false,
        }
    }
}

/// Why a verb was not served, with the CNI error code the plugin returns for it.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    /// The engine refused or failed: the policy, the pools, the store.
    #[error(transparent)]
    Alloc(#[from] AllocError),
    /// The pod's own objects are wrong (cluster mode: a malformed Multus annotation).
    #[error("{0}")]
    InvalidPod(String),
    /// The pod is not known or cannot be read from the API yet: the runtime retries.
    #[error("{0}")]
    PodUnknown(String),
    /// The request does not say what the verb needs.
    #[error("{0}")]
    BadRequest(String),
    /// A DEL reached under its attachment's lock after the plugin's deadline: the plugin has
    /// given up and journaled it, so nothing is done here (see `node::release`).
    #[error(
        "the DEL of {attachment} came to be served {} ms after the plugin gave up on it: \
         nothing done here; the plugin's DEL journal serves it, before any later ADD of the \
         attachment",
        late.as_millis()
    )]
    PastDeadline {
        attachment: allot_core::store::Attachment,
        late: std::time::Duration,
    },
    /// The work stopped before its end (it panicked).
    #[error("{verb} failed: {source}")]
    Aborted {
        verb: &'static str,
        #[source]
        source: tokio::task::JoinError,
    },
}

impl NodeError {
    /// The CNI error code (the spec's, or allot's own 100+).
    pub fn code(&self) -> u32 {
        self.classify().0
    }

    /// The label of `allot_errors_total`, for errors counted there.
    pub fn reason(&self) -> Option<&'static str> {
        self.classify().1
    }

    /// What the plugin shows under the message: the policy's trace of a decision that found
    /// no pool.
    pub fn details(&self) -> String {
        match self {
            NodeError::Alloc(AllocError::NoPoolFits { trace, .. }) => trace.clone(),
            _ => String::new(),
        }
    }

    fn classify(&self) -> (u32, Option<&'static str>) {
        match self {
            NodeError::Alloc(e) => {
                let (code, reason) = match e {
                    AllocError::Policy(p) => match p.kind {
                        PolicyErrorKind::InvalidInput => (codes::INVALID_POD, "invalid-pod"),
                        PolicyErrorKind::NotReady => (codes::TRY_AGAIN_LATER, "not-ready"),
                        _ => (codes::POLICY_FAILED, "policy-failed"),
                    },
                    AllocError::NoPoolFits { .. } | AllocError::NothingDecided(_) => {
                        (codes::NO_POOL_FITS, "no-pool-fits")
                    }
                    AllocError::Store(e) if matches!(e.failure(), StoreError::Backend { .. }) => {
                        (codes::STORE_FAILED, "store")
                    }
                    AllocError::Store(_) | AllocError::Contended(_) | AllocError::NotLoaded => {
                        (codes::TRY_AGAIN_LATER, "try-again")
                    }
                    AllocError::UnknownAttachment(_) => {
                        (codes::UNKNOWN_CONTAINER, "unknown-container")
                    }
                };
                (code, Some(reason))
            }
            NodeError::InvalidPod(_) => (codes::INVALID_POD, Some("invalid-pod")),
            NodeError::PodUnknown(_) => (codes::TRY_AGAIN_LATER, Some("pod-unknown")),
            NodeError::BadRequest(_) => (codes::DECODE_FAILURE, None),
            NodeError::PastDeadline { .. } => (codes::PAST_DEADLINE, Some("del-past-deadline")),
            NodeError::Aborted { .. } => (codes::IO_FAILURE, None),
        }
    }
}

/// One agent's state and verbs (see the module's documentation).
pub struct Node {
    engine: Arc<AgentEngine>,
    metrics: Arc<Metrics>,
    name: String,
    config: SharedConfig,
    /// Held by a reload from start to end: one reload at a time, so that an older observation
    /// is never installed over a newer one.
    reloading: std::sync::Mutex<()>,
    journal: Journal,
    /// Cluster mode's indexes and API client (`--kubernetes`).
    cluster: Option<Cluster>,
    underlay: Underlay,
    /// The ring of recent policy decisions (`--record-decisions`).
    decisions: Option<Arc<DecisionLog>>,
    /// `--probe-ahead`.
    ahead: Option<Arc<ProbeAhead>>,
    /// The policies, for their fault counts in the metrics.
    policies: Arc<PolicyRegistry>,
}

impl Node {
    /// A node named `name` serving with `engine`, deciding with `policies`, remembering DELs it
    /// cannot serve in `journal`; standalone, without probe defaults, until told otherwise.
    pub fn new(
        name: impl Into<String>,
        engine: Arc<AgentEngine>,
        policies: Arc<PolicyRegistry>,
        journal: Journal,
    ) -> Node {
        Node {
            engine,
            metrics: Arc::new(Metrics::new()),
            name: name.into(),
            config: SharedConfig::default(),
            reloading: std::sync::Mutex::default(),
            journal,
            cluster: None,
            underlay: Underlay::default(),
            decisions: None,
            ahead: None,
            policies,
        }
    }

    /// Cluster mode: pods, namespaces and nodes from `cluster`'s indexes, Endpoints written.
    pub fn with_cluster(mut self, cluster: Cluster) -> Node {
        self.cluster = Some(cluster);
        self
    }

    /// Probe defaults and quarantines as `underlay` says, probing ahead when it asks to.
    pub fn with_underlay(mut self, underlay: Underlay) -> Node {
        self.underlay = underlay;
        self.ahead = underlay.ahead.map(|cfg| {
            Arc::new(ProbeAhead::new(
                cfg,
                self.engine.clone(),
                self.metrics.clone(),
            ))
        });
        self
    }

    /// Recent decisions kept in `log` (the registry records into it).
    pub fn with_decisions(mut self, log: Arc<DecisionLog>) -> Node {
        self.decisions = Some(log);
        self
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn engine(&self) -> &Arc<AgentEngine> {
        &self.engine
    }

    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    pub fn cluster(&self) -> Option<&Cluster> {
        self.cluster.as_ref()
    }

    pub fn underlay(&self) -> &Underlay {
        &self.underlay
    }

    pub fn config(&self) -> &SharedConfig {
        &self.config
    }

    pub fn journal(&self) -> &Journal {
        &self.journal
    }

    /// Probing ahead, to stop its workers at shutdown.
    pub fn ahead(&self) -> Option<&Arc<ProbeAhead>> {
        self.ahead.as_ref()
    }

    /// Whether pools are loaded (`/readyz`).
    pub fn ready(&self) -> bool {
        self.engine.is_loaded()
    }

    /// `/metrics`, in Prometheus' text format.
    pub fn metrics_text(&self) -> String {
        if let Some(cluster) = &self.cluster {
            let stats = cluster.blocks.stats();
            self.metrics.ipblocks_followed.set(stats.blocks as i64);
            self.metrics
                .ipblock_regions_followed
                .set(stats.regions.map_or(-1, |r| r as i64));
        }
        self.metrics.encode(
            &self.engine.usage(),
            self.engine.lost_races(),
            &self.policies.faults(),
        )
    }

    /// Recent decisions, as scenarios (`GET /v1/decisions`).
    pub fn decisions(&self) -> api::RecordedDecisions {
        crate::recorded::recorded(self.decisions.as_deref(), &self.name)
    }

    /// `GET /v1/status`: whether pools are loaded, each pool's usage, and what of the
    /// configuration is not in force.
    pub fn status(&self) -> api::StatusResponse {
        let (degraded, problems) = {
            let config = config::lock(&self.config);
            (config.degraded(), config.listed())
        };
        let ready = self.engine.is_loaded();
        api::StatusResponse {
            ready,
            message: match (ready, problems.len()) {
                (false, _) => "pools not loaded yet".into(),
                (true, 0) => "ready".into(),
                (true, n) => format!(
                    "ready, degraded: {n} object(s) or file(s) not entirely in force: {}",
                    problems
                        .iter()
                        .map(|p| format!("{} {} {}: {}", p.kind, p.name, p.state, p.reason))
                        .collect::<Vec<_>>()
                        .join("; ")
                ),
            },
            pools: self
                .engine
                .usage()
                .into_iter()
                .map(|u| api::PoolStatus {
                    name: u.name,
                    ip_version: u.family.version(),
                    total: u.total,
                    free: u.free,
                    cooling: u.cooling,
                    state: u.state.as_str().into(),
                    claims: u.claims,
                })
                .collect(),
            degraded,
            problems,
        }
    }

    /// Runs engine work (store I/O, fsync) off the async threads; an error is counted and
    /// logged as `verb`'s.
    async fn blocking<T: Send + 'static>(
        self: &Arc<Self>,
        verb: &'static str,
        work: impl FnOnce(&Node) -> Result<T, NodeError> + Send + 'static,
    ) -> Result<T, NodeError> {
        let node = self.clone();
        tokio::task::spawn_blocking(move || work(&node))
            .await
            .map_err(|source| NodeError::Aborted { verb, source })?
            .map_err(|e| self.failed(verb, e))
    }

    /// Counts and logs `e` as `verb`'s failure, when it is one `allot_errors_total` counts.
    fn failed(&self, verb: &'static str, e: NodeError) -> NodeError {
        if let Some(reason) = e.reason() {
            self.metrics.error(reason);
            tracing::warn!(verb, reason, "{e}");
        }
        e
    }
}
