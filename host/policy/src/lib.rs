//! The wasmtime host of allot's pool-selection policies.
//!
//! * [`PolicyEngine`] compiles components (or reloads them precompiled from a cache keyed by
//!   digest and engine) and enforces [`Limits`]: a memory cap and an epoch deadline.
//! * [`LoadedPolicy`] keeps warm instances, pushes the inventory into each once per generation,
//!   and discards an instance after any trap. It implements [`allot_core::Policy`].
//! * [`PolicyRegistry`] maps clusters to policies with atomic hot swap and a per-cluster
//!   failure behaviour: fail, or fall back to the default policy embedded in every host binary.

mod cache;
mod contract;
mod record;
mod registry;
mod runtime;
mod slots;
pub mod workload;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use allot_core::policy::{Decision, Inventory, Policy, Request};
use allot_core::{PolicyError, PolicyErrorKind};
use sha2::{Digest, Sha256};
use wasmtime::Engine;
use wasmtime::component::Component;

pub use cache::PrecompiledCache;
pub use record::{DecisionLog, Recorded};
pub use registry::{ClusterHandle, ClusterPolicy, FaultKey, OnFailure, Outcome, PolicyRegistry};

/// The default policy (`policies/default`), built by this crate's build script.
pub static DEFAULT_POLICY_WASM: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/allot_policy_default.wasm"));

/// The name the embedded default policy goes by.
pub const DEFAULT_POLICY_NAME: &str = "default";

/// What a policy may use per call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Linear memory a policy instance may grow to.
    pub memory_bytes: usize,
    /// Wall-clock budget of one call (load-inventory included when it runs).
    pub deadline: Duration,
    /// Instances alive at once across all policies of an engine (warm ones included). A quarter
    /// (at least one) is reserved for the embedded default, so that a custom policy under load
    /// can never keep the fallback from instantiating; custom policies share the rest.
    pub max_instances: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            memory_bytes: 64 << 20,
            deadline: Duration::from_millis(100),
            max_instances: 64,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("reading policy {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "policy {name} has sha256 {actual}, but {expected} was configured: refusing to load it"
    )]
    DigestMismatch {
        name: String,
        expected: String,
        actual: String,
    },
    #[error("policy {name} is not a valid component: {reason}")]
    Compile { name: String, reason: String },
    #[error(
        "policy {name} does not fit the allot:policy contract (0.3.0, or the older 0.2.0 or 0.1.0): {reason}"
    )]
    Contract { name: String, reason: String },
    #[error("creating the policy engine: {0}")]
    Engine(String),
}

/// Where a policy comes from, and the digest it must have.
#[derive(Clone, Debug)]
pub struct PolicySource {
    pub name: String,
    pub bytes: Arc<[u8]>,
    /// Hex sha256 the component must have, when configured.
    pub expected_sha256: Option<String>,
    /// The embedded default draws from the pool's reserved share (see `slots`).
    share: slots::Share,
}

impl PolicySource {
    pub fn bytes(name: impl Into<String>, bytes: impl Into<Arc<[u8]>>) -> Self {
        PolicySource {
            name: name.into(),
            bytes: bytes.into(),
            expected_sha256: None,
            share: slots::Share::Custom,
        }
    }

    pub fn file(path: impl AsRef<Path>) -> Result<Self, LoadError> {
        let path = path.as_ref();
        let bytes = std::fs::read(path).map_err(|source| LoadError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Ok(PolicySource::bytes(path.display().to_string(), bytes))
    }

    /// The embedded default policy.
    pub fn embedded_default() -> Self {
        PolicySource {
            share: slots::Share::Default,
            ..PolicySource::bytes(DEFAULT_POLICY_NAME, DEFAULT_POLICY_WASM)
        }
    }

    pub fn with_sha256(mut self, hex: impl Into<String>) -> Self {
        self.expected_sha256 = Some(hex.into());
        self
    }
}

pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// Compiles and caches policies; one per process is enough.
#[derive(Clone)]
pub struct PolicyEngine {
    engine: Engine,
    ticker: Arc<runtime::EpochTicker>,
    slots: Arc<slots::InstanceSlots>,
    limits: Limits,
    cache: Option<PrecompiledCache>,
}

impl PolicyEngine {
    pub fn new(limits: Limits, cache: Option<PrecompiledCache>) -> Result<Self, LoadError> {
        let (engine, ticker) =
            runtime::new_engine(&limits).map_err(|e| LoadError::Engine(format!("{e:#}")))?;
        Ok(PolicyEngine {
            engine,
            ticker,
            slots: slots::InstanceSlots::new(limits.max_instances),
            limits,
            cache,
        })
    }

    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// Verifies, compiles (or reloads from the cache) and links a policy.
    pub fn load(&self, source: &PolicySource) -> Result<LoadedPolicy, LoadError> {
        let started = Instant::now();
        let digest = sha256_hex(&source.bytes);
        if let Some(expected) = &source.expected_sha256
            && !expected.trim().eq_ignore_ascii_case(&digest)
        {
            return Err(LoadError::DigestMismatch {
                name: source.name.clone(),
                expected: expected.trim().to_string(),
                actual: digest,
            });
        }
        let (component, from_cache) = self.compile(&source.name, &digest, &source.bytes)?;
        let foreign = runtime::Prepared::foreign_imports(&self.engine, &component);
        if !foreign.is_empty() {
            tracing::debug!(policy = %source.name, ?foreign, "imports beyond the contract trap when called");
        }
        let prepared = runtime::Prepared::new(
            &self.engine,
            &self.ticker,
            &self.slots,
            source.share,
            &component,
            &source.name,
            self.limits,
        )
        .map_err(|e| LoadError::Contract {
            name: source.name.clone(),
            reason: format!("{e:#}"),
        })?;
        tracing::info!(policy = %source.name, %digest, from_cache, elapsed_ms = started.elapsed().as_secs_f64() * 1e3, "policy loaded");
        Ok(LoadedPolicy {
            name: source.name.clone(),
            digest,
            from_cache,
            prepared,
        })
    }

    fn compile(
        &self,
        name: &str,
        digest: &str,
        bytes: &[u8],
    ) -> Result<(Component, bool), LoadError> {
        if let Some(cache) = &self.cache
            && let Some(component) = cache.get(&self.engine, digest)
        {
            return Ok((component, true));
        }
        let component = Component::new(&self.engine, bytes).map_err(|e| LoadError::Compile {
            name: name.to_string(),
            reason: format!("{e:#}"),
        })?;
        if let Some(cache) = &self.cache {
            cache.put(&self.engine, digest, &component);
        }
        Ok((component, false))
    }
}

/// A loaded policy with its warm instances.
pub struct LoadedPolicy {
    name: String,
    digest: String,
    from_cache: bool,
    prepared: runtime::Prepared,
}

impl LoadedPolicy {
    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn sha256(&self) -> &str {
        &self.digest
    }

    /// Whether the compiled code came from the precompiled cache.
    pub fn from_cache(&self) -> bool {
        self.from_cache
    }

    pub fn warm_instances(&self) -> usize {
        self.prepared.warm_instances()
    }

    /// The version of the `allot:policy` contract the component was built against ("0.3.0",
    /// or "0.2.0" / "0.1.0" for an older component, which the host keeps running unchanged).
    pub fn contract_version(&self) -> &'static str {
        self.prepared.contract_version()
    }
}

impl std::fmt::Debug for LoadedPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoadedPolicy")
            .field("name", &self.name)
            .field("sha256", &self.digest)
            .finish()
    }
}

impl Policy for LoadedPolicy {
    fn decide(
        &self,
        inventory: &Arc<Inventory>,
        request: &Request,
    ) -> Result<Decision, PolicyError> {
        if request.free_counts.len() != inventory.pools.len() {
            return Err(PolicyError::new(
                PolicyErrorKind::Internal,
                format!(
                    "request carries {} free counts for an inventory of {} pools",
                    request.free_counts.len(),
                    inventory.pools.len()
                ),
            ));
        }
        self.prepared.decide(inventory, request)
    }

    fn name(&self) -> String {
        self.name.clone()
    }

    /// The runtime checks every answer before returning it.
    fn validates(&self) -> bool {
        true
    }
}
