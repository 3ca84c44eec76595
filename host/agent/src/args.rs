//! Flags, and the wiring of store, policy, engine, reloads and server.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use allot_core::engine::Engine;
use allot_policy::{
    ClusterHandle, Limits, OnFailure, PolicyEngine, PolicyRegistry, PolicySource, PrecompiledCache,
};
use allot_store::SqliteStore;
use anyhow::{Context as _, bail};
use clap::{Parser, ValueEnum};

use crate::metrics::Metrics;
use crate::server::{self, Shared};
use crate::standalone;

/// The registry key of the one cluster a standalone agent serves.
pub const STANDALONE_CLUSTER: &str = "standalone";

#[derive(Parser, Debug)]
#[command(
    name = "allot-agent",
    version,
    about = "allot's node agent: allocates addresses for the allot CNI plugin"
)]
pub struct Args {
    /// Serve pools, subnets and reserved addresses from the YAML files of this directory
    /// (reloaded when they change), without Kubernetes.
    #[arg(long, value_name = "DIR")]
    standalone: Option<PathBuf>,
    /// The unix socket the plugin talks to.
    #[arg(long, value_name = "PATH", default_value = allot_api::DEFAULT_SOCKET)]
    socket: PathBuf,
    /// The claim store (a SQLite file; inspect it with sqlite3).
    #[arg(long, value_name = "FILE", default_value = "/var/lib/allot/allot.db")]
    state: PathBuf,
    /// This node's name, as pools' nodeName and nodeAffinity see it (default: the hostname).
    #[arg(long)]
    node_name: Option<String>,
    /// How often the standalone directory is checked for changes.
    #[arg(long, default_value_t = 1000)]
    reload_interval_ms: u64,
    /// A pool-selection policy component to use instead of the embedded default.
    #[arg(long, value_name = "FILE.wasm")]
    policy: Option<PathBuf>,
    /// Refuse the policy unless its sha256 is this (hex).
    #[arg(long, value_name = "HEX", requires = "policy")]
    policy_sha256: Option<String>,
    /// What to do when the policy faults (traps, deadline, memory cap, bogus output).
    #[arg(long, value_enum, default_value_t = FailureMode::Fail)]
    policy_on_failure: FailureMode,
    /// Wall-clock budget of one policy call.
    #[arg(long, default_value_t = 100)]
    policy_deadline_ms: u64,
    /// Memory a policy instance may use, in MiB.
    #[arg(long, default_value_t = 64)]
    policy_memory_mib: usize,
    /// Where compiled policies are cached (default: $ALLOT_CACHE_DIR, else /var/cache/allot
    /// when root, else ~/.cache/allot/policies).
    #[arg(long, value_name = "DIR")]
    cache_dir: Option<PathBuf>,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum FailureMode {
    /// Fail the ADD with the policy's error.
    Fail,
    /// Decide with the embedded default policy instead.
    Fallback,
}

pub type AgentEngine = Engine<Arc<SqliteStore>, ClusterHandle>;

pub fn run(args: Args) -> anyhow::Result<()> {
    let Some(dir) = args.standalone.clone() else {
        bail!(
            "cluster mode is not available yet: run with --standalone DIR (pools from YAML files)"
        );
    };
    if !dir.is_dir() {
        bail!(
            "--standalone {}: not a directory of pool YAML files",
            dir.display()
        );
    }
    let node_name = match &args.node_name {
        Some(n) => n.clone(),
        None => hostname(),
    };

    let store = Arc::new(SqliteStore::open(&args.state).map_err(|e| anyhow::anyhow!("{e}"))?);
    let limits = Limits {
        memory_bytes: args.policy_memory_mib << 20,
        deadline: Duration::from_millis(args.policy_deadline_ms),
        ..Limits::default()
    };
    let cache = match &args.cache_dir {
        Some(d) => Some(PrecompiledCache::new(d)),
        None if std::env::var_os("ALLOT_CACHE_DIR").is_none()
            && unsafe { libc::geteuid() } == 0 =>
        {
            Some(PrecompiledCache::new("/var/cache/allot/policies"))
        }
        None => PrecompiledCache::default_location(),
    };
    let policies = PolicyEngine::new(limits, cache)?;
    let default = Arc::new(policies.load(&PolicySource::embedded_default())?);
    let registry = Arc::new(PolicyRegistry::new(default));
    if let Some(path) = &args.policy {
        let mut source = PolicySource::file(path)?;
        if let Some(hex) = &args.policy_sha256 {
            source = source.with_sha256(hex);
        }
        let policy = Arc::new(policies.load(&source)?);
        let on_failure = match args.policy_on_failure {
            FailureMode::Fail => OnFailure::Fail,
            FailureMode::Fallback => OnFailure::FallBackToDefault,
        };
        registry.install(STANDALONE_CLUSTER, policy, on_failure);
    }
    let engine: Arc<AgentEngine> =
        Arc::new(Engine::new(store, registry.for_cluster(STANDALONE_CLUSTER)));
    let metrics = Arc::new(Metrics::new());
    let shared = Arc::new(Shared {
        engine,
        metrics,
        node_name,
        config_errors: std::sync::Mutex::new(Vec::new()),
    });

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .worker_threads(2)
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(async move {
        reload(&shared, &dir).await;
        let watcher = tokio::spawn(watch(
            shared.clone(),
            dir,
            Duration::from_millis(args.reload_interval_ms.max(100)),
        ));
        let served = server::serve(shared, &args.socket).await;
        watcher.abort();
        served
    })
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".into())
}

/// Loads the directory and installs what is valid.
async fn reload(shared: &Arc<Shared>, dir: &std::path::Path) {
    let dir = dir.to_path_buf();
    let s = shared.clone();
    let result = tokio::task::spawn_blocking(move || -> anyhow::Result<usize> {
        let loaded =
            standalone::load(&dir).with_context(|| format!("reading {}", dir.display()))?;
        for e in &loaded.errors {
            tracing::error!("left out: {e}");
        }
        let count = loaded.pools.len();
        s.metrics.config_errors.set(loaded.errors.len() as i64);
        *s.config_errors.lock().unwrap_or_else(|p| p.into_inner()) = loaded.errors;
        s.engine
            .load(loaded.pools, loaded.subnets, loaded.reserved)
            .map_err(|e| anyhow::anyhow!("reading claims: {e}"))?;
        Ok(count)
    })
    .await;
    match result {
        Ok(Ok(count)) => tracing::info!(pools = count, "inventory loaded"),
        Ok(Err(e)) => tracing::error!("could not load the inventory: {e:#}"),
        Err(e) => tracing::error!("inventory load task failed: {e}"),
    }
}

async fn watch(shared: Arc<Shared>, dir: PathBuf, every: Duration) {
    let mut last = standalone::fingerprint(&dir).ok();
    let mut tick = tokio::time::interval(every);
    loop {
        tick.tick().await;
        let now = standalone::fingerprint(&dir).ok();
        if now != last {
            tracing::info!(dir = %dir.display(), "pool files changed; reloading");
            reload(&shared, &dir).await;
            last = now;
        }
    }
}
