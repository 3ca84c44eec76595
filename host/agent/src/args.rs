//! The agent's flags (`allot-agent --help`), checked into the settings the node runs with.

use std::path::{Path, PathBuf};
use std::time::Duration;

use allot_api::ProbeSettings;
use allot_core::store::StoreError;
use allot_engine::EngineConfig;
use allot_store::{OpenedStore, StoreOptions};
use anyhow::bail;
use clap::{Parser, ValueEnum};

use crate::ahead::AheadConfig;
use crate::node::{DEFAULT_QUARANTINE_SECONDS, Underlay};

#[derive(Parser, Debug)]
#[command(
    name = "allot-agent",
    version,
    about = "allot's node agent: allocates addresses for the allot CNI plugin"
)]
pub struct Args {
    /// Serve pools, subnets and reserved addresses from the YAML files of this directory
    /// (reloaded when they change), without Kubernetes. Without it, `--store etcd://…` serves
    /// the pools kept in etcd (`allotctl pool apply`).
    #[arg(long, value_name = "DIR", conflicts_with = "kubernetes")]
    pub standalone: Option<PathBuf>,
    /// Cluster mode: claims in the cluster's IPBlocks, pools from its IPPools, Subnets and
    /// ReservedIPs, each pod's labels, annotations and owner from watches, the policy from the
    /// cluster's Policy object. Uses the in-cluster ServiceAccount unless --kubeconfig is given.
    #[arg(long, conflicts_with = "store")]
    pub kubernetes: bool,
    /// Cluster mode: how long an ADD waits for its pod to reach the agent's watch before it
    /// reads the pod from the API once.
    #[arg(
        long,
        value_name = "MS",
        default_value_t = 2000,
        requires = "kubernetes"
    )]
    pub pod_wait_ms: u64,
    /// Cluster mode: the name of the cluster-scoped Policy object the agent follows.
    #[arg(
        long,
        value_name = "NAME",
        default_value = "default",
        requires = "kubernetes"
    )]
    pub policy_object: String,
    /// The unix socket the plugin talks to.
    #[arg(long, value_name = "PATH", default_value = allot_api::DEFAULT_SOCKET)]
    pub socket: PathBuf,
    /// The embedded claim store, a SQLite file (inspect it with sqlite3), used unless --store
    /// names another.
    #[arg(long, value_name = "FILE", default_value = "/var/lib/allot/allot.db")]
    pub state: PathBuf,
    #[command(flatten)]
    pub store: StoreArgs,
    /// This node's name, as pools' nodeName and nodeAffinity see it, and the node its claims
    /// record (the CNI GC verb judges those alone): give each node sharing a store a name of
    /// its own. Default: the hostname; with --store etcd://… the claims then record an
    /// identity generated once and kept in the directory of --state (`node-id`), since hosts
    /// sharing etcd may share a hostname.
    #[arg(long)]
    pub node_name: Option<String>,
    /// How often the agent checks the standalone directory for changes and follows the store's
    /// change feed; a degraded configuration (an invalid object, a failed reload) is reloaded
    /// this often until it is fixed. With --kubernetes, pools are reloaded as the watches
    /// deliver their changes too.
    #[arg(long, default_value_t = 1000)]
    pub reload_interval_ms: u64,
    /// A pool-selection policy component to use instead of the embedded default: a file, or an
    /// OCI artifact (`oci://HOST/REPO@sha256:…`, pushed with `allotctl policy push`; every digest
    /// is verified, and a tag instead of a digest is pulled as it is now).
    #[arg(long, value_name = "FILE.wasm|oci://HOST/REPO@sha256:HEX")]
    pub policy: Option<String>,
    /// Refuse the policy unless its sha256 is this (hex).
    #[arg(long, value_name = "HEX", requires = "policy")]
    pub policy_sha256: Option<String>,
    /// What to do when the policy faults (traps, deadline, memory cap, bogus output).
    #[arg(long, value_enum, default_value_t = FailureMode::Fail)]
    pub policy_on_failure: FailureMode,
    /// Wall-clock budget of one policy call.
    #[arg(long, default_value_t = 100)]
    pub policy_deadline_ms: u64,
    /// Memory a policy instance may use, in MiB.
    #[arg(long, default_value_t = 64)]
    pub policy_memory_mib: usize,
    /// An OCI registry (`HOST` or `HOST:PORT`) to pull policies from over plain HTTP (loopback
    /// registries always are); may be repeated.
    #[arg(long, value_name = "HOST[:PORT]")]
    pub registry_plain_http: Vec<String>,
    /// How many recent policy decisions the agent keeps for `allotctl policy record` (served on
    /// its socket, GET /v1/decisions). They hold what the policy saw, pod labels and annotations
    /// included; 0 keeps none.
    #[arg(long, value_name = "N", default_value_t = 64)]
    pub record_decisions: usize,
    /// Seconds a released address stays out of use before it is handed out again (neighbours'
    /// ARP caches may still point at the old pod).
    #[arg(long, value_name = "SECONDS", default_value_t = EngineConfig::default().cooldown)]
    pub cooldown_seconds: u64,
    /// GC releases a leaked claim only after seeing it leaked twice at least this far apart,
    /// and never a claim younger than this.
    #[arg(long, value_name = "SECONDS", default_value_t = EngineConfig::default().gc_grace)]
    pub gc_grace_seconds: u64,
    /// A StatefulSet pod's address kept after DEL is released when the pod has not been added
    /// again within this time.
    #[arg(long, value_name = "SECONDS", default_value_t = EngineConfig::default().stateful_keep)]
    pub statefulset_keep_seconds: u64,
    /// The free indexes are rebuilt from the store this often, whatever its change feed said.
    #[arg(long, value_name = "SECONDS", default_value_t = EngineConfig::default().resync)]
    pub resync_seconds: u64,
    /// Where the plugin remembers DELs it could not deliver (its ipam `journal`); the agent
    /// replays them.
    #[arg(long, value_name = "DIR", default_value = allot_api::DEFAULT_JOURNAL)]
    pub journal: PathBuf,
    /// Where compiled policies are cached (default: $ALLOT_CACHE_DIR, else /var/cache/allot
    /// when root, else ~/.cache/allot/policies).
    #[arg(long, value_name = "DIR")]
    pub cache_dir: Option<PathBuf>,
    /// Also serve `/metrics`, `/healthz` and `/readyz` over plain HTTP on this TCP address
    /// (`[::]:9401` answers IPv6 and IPv4), for Prometheus and the kubelet's probes. Only those
    /// three: the plugin API, status and recorded decisions stay on the unix socket.
    #[arg(long, value_name = "ADDR")]
    pub metrics_address: Option<std::net::SocketAddr>,
    #[command(flatten)]
    pub underlay: UnderlayArgs,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum FailureMode {
    /// Fail the ADD with the policy's error.
    Fail,
    /// Decide with the embedded default policy instead.
    Fallback,
}

/// The agent's probe and quarantine flags (flattened into its `Args`).
#[derive(clap::Args, Debug, Clone)]
pub struct UnderlayArgs {
    /// Probe every address of an ADD for conflicts on the pod's link (ARP / NDP duplicate
    /// address detection), for networks whose config has no ipam `probe` section.
    #[arg(long)]
    probe_conflict: bool,
    /// Check that each gateway answers on the pod's link, for networks whose config has no
    /// ipam `probe` section.
    #[arg(long)]
    probe_gateway: bool,
    /// Requests per probe (with --probe-conflict / --probe-gateway).
    #[arg(long, value_name = "N", default_value_t = 3)]
    probe_tries: u32,
    /// How long each probe request waits for an answer, in milliseconds.
    #[arg(long, value_name = "MS", default_value_t = 100)]
    probe_timeout_ms: u64,
    /// How long an address found in use by another host stays quarantined before it is
    /// released (and, after its cool-down, handed out again, probed first).
    #[arg(long, value_name = "SECONDS", default_value_t = DEFAULT_QUARANTINE_SECONDS)]
    quarantine_seconds: u64,
    /// Probe the next addresses of each pool (and its gateway) ahead of time from the node-side
    /// parent link of the networks that probe (a bridge; a macvlan master, through a macvlan
    /// sibling the agent creates), so that an ADD handed one of them skips the wait in the
    /// pod's namespace. Sends frames on those links on its own: off unless given.
    #[arg(long)]
    probe_ahead: bool,
    /// Addresses per pool and link kept probed ahead (with --probe-ahead).
    #[arg(long, value_name = "N", default_value_t = 2)]
    probe_ahead_candidates: usize,
    /// How long a verdict found ahead may be used; candidates are probed again after half of
    /// it (with --probe-ahead).
    #[arg(long, value_name = "SECONDS", default_value_t = 10)]
    probe_ahead_fresh_seconds: u64,
    /// Probe requests one link may send per second when probing ahead, at most.
    #[arg(long, value_name = "N", default_value_t = 20)]
    probe_ahead_rate: u32,
    /// Cluster mode: once a KubeVirt live migration to this node completes (its
    /// VirtualMachineInstance's status.nodeName names this node), announce the VM's addresses
    /// from the target launcher pod's interface (gratuitous ARP, unsolicited Neighbor
    /// Advertisement). Enters pods' network namespaces: needs CAP_SYS_ADMIN and CAP_NET_RAW,
    /// and the host's network namespace directory (CNI_NETNS) at the same path.
    #[arg(long)]
    announce_after_migration: bool,
}

impl UnderlayArgs {
    pub fn underlay(&self) -> anyhow::Result<Underlay> {
        let settings = ProbeSettings {
            conflict: self.probe_conflict,
            gateway: self.probe_gateway,
            tries: self.probe_tries,
            timeout_ms: self.probe_timeout_ms,
        };
        let cfg = allot_probe::ProbeConfig {
            tries: settings.tries,
            timeout: Duration::from_millis(settings.timeout_ms),
            ..allot_probe::ProbeConfig::default()
        };
        if let Err(e) = cfg.validate() {
            bail!("--probe-tries / --probe-timeout-ms: {e}");
        }
        if self.quarantine_seconds == 0 {
            bail!(
                "--quarantine-seconds 0 would hand a conflicting address out again at once: use \
                 at least 1 (default {DEFAULT_QUARANTINE_SECONDS})"
            );
        }
        if !(1..=64).contains(&self.probe_ahead_candidates) {
            bail!(
                "--probe-ahead-candidates {}: use 1 to 64",
                self.probe_ahead_candidates
            );
        }
        if !(1..=3600).contains(&self.probe_ahead_fresh_seconds) {
            bail!(
                "--probe-ahead-fresh-seconds {}: use 1 to 3600",
                self.probe_ahead_fresh_seconds
            );
        }
        if !(1..=1000).contains(&self.probe_ahead_rate) {
            bail!(
                "--probe-ahead-rate {}: use 1 to 1000",
                self.probe_ahead_rate
            );
        }
        Ok(Underlay {
            probe: settings.enabled().then_some(settings),
            quarantine_seconds: self.quarantine_seconds,
            ahead: self.probe_ahead.then_some(AheadConfig {
                candidates: self.probe_ahead_candidates,
                fresh: Duration::from_secs(self.probe_ahead_fresh_seconds),
                rate: self.probe_ahead_rate,
            }),
            announce_after_migration: self.announce_after_migration,
        })
    }
}

/// Where claims are kept: `--store` and the etcd flags (allotctl has the same ones), parsed
/// here into allot-store's [`StoreOptions`].
#[derive(clap::Args, Clone, Debug, Default)]
pub struct StoreArgs {
    /// The claim store: `etcd://HOST:PORT[,HOST:PORT…]` to share claims between nodes,
    /// `kubernetes` for the IPBlocks of a cluster (the agent's `--kubernetes` mode), or the path
    /// of the embedded SQLite file (the default; one node only).
    #[arg(long, value_name = "URL|FILE")]
    pub store: Option<String>,
    /// Key prefix in etcd: several installations can share one etcd.
    #[arg(long, value_name = "PREFIX", default_value = allot_store::etcd::DEFAULT_PREFIX)]
    pub etcd_prefix: String,
    /// The CA certificate (PEM) that signed etcd's server certificate: talk TLS to etcd.
    #[arg(long, value_name = "FILE")]
    pub etcd_ca: Option<PathBuf>,
    /// This client's certificate (PEM), for an etcd that requires client certificates.
    #[arg(long, value_name = "FILE", requires = "etcd_key")]
    pub etcd_cert: Option<PathBuf>,
    /// The key (PEM) of --etcd-cert.
    #[arg(long, value_name = "FILE", requires = "etcd_cert")]
    pub etcd_key: Option<PathBuf>,
    /// The kubeconfig of `--store kubernetes` (and of the agent's `--kubernetes`); default:
    /// $KUBECONFIG, ~/.kube/config, or the in-cluster ServiceAccount.
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
}

impl StoreArgs {
    /// The flags as the store crate takes them.
    pub fn options(&self) -> StoreOptions {
        StoreOptions {
            store: self.store.clone(),
            etcd_prefix: self.etcd_prefix.clone(),
            etcd_ca: self.etcd_ca.clone(),
            etcd_cert: self.etcd_cert.clone(),
            etcd_key: self.etcd_key.clone(),
            kubeconfig: self.kubeconfig.clone(),
        }
    }

    /// Opens the store the flags name ([`StoreOptions::open`]).
    pub fn open(&self, default_file: &Path) -> Result<OpenedStore, StoreError> {
        self.options().open(default_file)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        underlay: UnderlayArgs,
    }

    fn parse(args: &[&str]) -> anyhow::Result<Underlay> {
        let mut argv = vec!["allot-agent"];
        argv.extend_from_slice(args);
        Cli::try_parse_from(argv)?.underlay.underlay()
    }

    #[test]
    fn off_by_default() {
        assert_eq!(
            parse(&[]).unwrap(),
            Underlay {
                probe: None,
                quarantine_seconds: DEFAULT_QUARANTINE_SECONDS,
                ahead: None,
                announce_after_migration: false,
            }
        );
        // Tries and timeout alone turn nothing on.
        assert_eq!(parse(&["--probe-tries", "5"]).unwrap().probe, None);
    }

    #[test]
    fn flags_become_the_plugins_defaults() {
        let u = parse(&[
            "--probe-conflict",
            "--probe-tries",
            "2",
            "--probe-timeout-ms",
            "50",
            "--quarantine-seconds",
            "60",
        ])
        .unwrap();
        assert_eq!(
            u.probe,
            Some(ProbeSettings {
                conflict: true,
                gateway: false,
                tries: 2,
                timeout_ms: 50
            })
        );
        assert_eq!(u.quarantine_seconds, 60);
        assert_eq!(u.ahead, None, "probing ahead is a flag of its own");
        let u = parse(&["--probe-ahead", "--probe-ahead-fresh-seconds", "4"]).unwrap();
        assert_eq!(
            u.ahead,
            Some(AheadConfig {
                candidates: 2,
                fresh: Duration::from_secs(4),
                rate: 20
            })
        );
    }

    #[test]
    fn bad_values_are_refused_with_the_bounds() {
        for (args, says) in [
            (
                &["--probe-conflict", "--probe-tries", "0"][..],
                "use 1 to 100",
            ),
            (&["--probe-timeout-ms", "0"][..], "use 1 ms to 10 s"),
            (&["--quarantine-seconds", "0"][..], "at least 1"),
            (&["--probe-ahead-candidates", "0"][..], "use 1 to 64"),
            (&["--probe-ahead-fresh-seconds", "0"][..], "use 1 to 3600"),
            (&["--probe-ahead-rate", "0"][..], "use 1 to 1000"),
        ] {
            let e = parse(args).unwrap_err().to_string();
            assert!(e.contains(says), "{args:?}: {e}");
        }
    }
}
