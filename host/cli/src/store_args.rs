//! `--store` and the etcd flags, as allotctl parses them into allot-store's [`StoreOptions`]
//! (the agent has the same flags in its `args`; clap stays in the binaries).

use std::path::{Path, PathBuf};

use allot_core::store::StoreError;
use allot_store::{OpenedStore, StoreOptions};

/// Where claims are kept.
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
