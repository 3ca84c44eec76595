//! Choosing a store from the command line: `--store` and the etcd options, shared by the agent
//! and `allotctl`.

use std::path::PathBuf;
use std::sync::Arc;

use allot_core::store::{Store, StoreError};

use crate::etcd::{DEFAULT_PREFIX, EtcdConfig, EtcdStore};
use crate::kubernetes::{KubeConfig, KubeStore};
use crate::sqlite::SqliteStore;

/// Where claims are kept.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct StoreArgs {
    /// The claim store: `etcd://HOST:PORT[,HOST:PORT…]` to share claims between nodes,
    /// `kubernetes` for the IPBlocks of a cluster (the agent's `--kubernetes` mode), or the path
    /// of the embedded SQLite file (the default; one node only).
    #[arg(long, value_name = "URL|FILE")]
    pub store: Option<String>,
    /// Key prefix in etcd: several installations can share one etcd.
    #[arg(long, value_name = "PREFIX", default_value = DEFAULT_PREFIX)]
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

/// `--store kubernetes`.
pub const KUBERNETES: &str = "kubernetes";

/// A store opened from [`StoreArgs`], keeping its concrete kind for what only one kind does.
#[derive(Clone)]
pub enum OpenedStore {
    Sqlite(Arc<SqliteStore>),
    Etcd(Arc<EtcdStore>),
    Kubernetes(Arc<KubeStore>),
}

impl OpenedStore {
    pub fn shared(&self) -> Arc<dyn Store> {
        match self {
            OpenedStore::Sqlite(s) => s.clone(),
            OpenedStore::Etcd(s) => s.clone(),
            OpenedStore::Kubernetes(s) => s.clone(),
        }
    }

    /// What the store is, for logs: `sqlite /var/lib/allot/allot.db`, `etcd 10.0.0.1:2379 /allot`.
    pub fn describe(&self) -> String {
        match self {
            OpenedStore::Sqlite(s) => format!("sqlite {}", s.path().display()),
            OpenedStore::Etcd(s) => format!("etcd {s:?}"),
            OpenedStore::Kubernetes(_) => "the cluster's IPBlocks".into(),
        }
    }
}

impl StoreArgs {
    /// The etcd configuration, when `--store` names etcd.
    pub fn etcd(&self) -> Result<Option<EtcdConfig>, String> {
        let Some(url) = self.store.as_deref().filter(|s| s.starts_with("etcd://")) else {
            if self.etcd_ca.is_some() || self.etcd_cert.is_some() {
                return Err("--etcd-ca, --etcd-cert and --etcd-key need --store etcd://…".into());
            }
            return Ok(None);
        };
        if !self.etcd_prefix.starts_with('/') || self.etcd_prefix.trim_end_matches('/').is_empty() {
            return Err(format!(
                "--etcd-prefix {:?}: write an absolute key prefix other than \"/\", like /allot",
                self.etcd_prefix
            ));
        }
        Ok(Some(EtcdConfig {
            prefix: self.etcd_prefix.clone(),
            ca: self.etcd_ca.clone(),
            cert: self.etcd_cert.clone(),
            key: self.etcd_key.clone(),
            ..EtcdConfig::from_url(url)?
        }))
    }

    /// Opens the store: etcd when `--store etcd://…`, else the SQLite file `--store FILE`, else
    /// `default_file`.
    pub fn open(&self, default_file: &std::path::Path) -> Result<OpenedStore, StoreError> {
        if let Some(config) = self.etcd().map_err(StoreError::Backend)? {
            return Ok(OpenedStore::Etcd(Arc::new(EtcdStore::connect(&config)?)));
        }
        if self.store.as_deref() == Some(KUBERNETES) {
            return Ok(OpenedStore::Kubernetes(Arc::new(KubeStore::connect(
                &KubeConfig {
                    kubeconfig: self.kubeconfig.clone(),
                    ..KubeConfig::default()
                },
            )?)));
        }
        if self.kubeconfig.is_some() {
            return Err(StoreError::Backend(
                "--kubeconfig needs --store kubernetes (allotctl) or --kubernetes (allot-agent)"
                    .into(),
            ));
        }
        let file = match self.store.as_deref() {
            Some(s) if s.contains("://") => {
                return Err(StoreError::Backend(format!(
                    "--store {s:?}: allot stores claims in etcd (etcd://HOST:PORT), in a \
                     cluster's IPBlocks (kubernetes) or in a SQLite file (a path)"
                )));
            }
            Some(path) => PathBuf::from(path),
            None => default_file.to_path_buf(),
        };
        Ok(OpenedStore::Sqlite(Arc::new(SqliteStore::open(file)?)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(store: Option<&str>) -> StoreArgs {
        StoreArgs {
            store: store.map(str::to_string),
            etcd_prefix: DEFAULT_PREFIX.into(),
            ..StoreArgs::default()
        }
    }

    #[test]
    fn etcd_urls_and_options() {
        let c = args(Some("etcd://127.0.0.1:2379")).etcd().unwrap().unwrap();
        assert_eq!(c.endpoints, ["127.0.0.1:2379"]);
        assert_eq!(c.prefix, "/allot");
        assert_eq!(args(Some("/tmp/x.db")).etcd(), Ok(None));
        let mut tls = args(None);
        tls.etcd_ca = Some("/ca.pem".into());
        assert!(tls.etcd().unwrap_err().contains("need --store etcd://"));
        for bad in ["allot", "/", ""] {
            let mut a = args(Some("etcd://127.0.0.1:2379"));
            a.etcd_prefix = bad.into();
            assert!(a.etcd().unwrap_err().contains("--etcd-prefix"), "{bad}");
        }
    }

    #[test]
    fn unknown_schemes_are_refused() {
        let err = args(Some("consul://x:1"))
            .open(std::path::Path::new("/nonexistent"))
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("etcd://HOST:PORT"), "{err}");
    }
}
