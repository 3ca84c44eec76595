//! Opening the store the command line names: `--store` and the etcd options of the agent and
//! `allotctl`, which each parse them (clap stays in the binaries) into [`StoreOptions`].

use std::path::PathBuf;
use std::sync::Arc;

use allot_core::store::{Store, StoreError};

use crate::etcd::{EtcdConfig, EtcdStore, UrlError};
use crate::kubernetes::{KubeConfig, KubeStore};
use crate::sqlite::SqliteStore;

/// Where claims are kept, as the `--store` and etcd flags of the agent and `allotctl` say it.
/// Plain data: each binary parses its own flags (clap stays in the binaries) and hands them
/// over as these options.
#[derive(Clone, Debug, Default)]
pub struct StoreOptions {
    /// `--store`: `etcd://HOST:PORT[,HOST:PORT…]`, `kubernetes`, or the SQLite file's path.
    pub store: Option<String>,
    /// `--etcd-prefix`: key prefix in etcd.
    pub etcd_prefix: String,
    /// `--etcd-ca`: the CA certificate (PEM) that signed etcd's server certificate.
    pub etcd_ca: Option<PathBuf>,
    /// `--etcd-cert`: this client's certificate (PEM).
    pub etcd_cert: Option<PathBuf>,
    /// `--etcd-key`: the key (PEM) of `etcd_cert`.
    pub etcd_key: Option<PathBuf>,
    /// `--kubeconfig`: the kubeconfig of `--store kubernetes`.
    pub kubeconfig: Option<PathBuf>,
}

/// `--store kubernetes`.
pub const KUBERNETES: &str = "kubernetes";

/// A store opened from [`StoreOptions`], keeping its concrete kind for what only one kind does.
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

/// Why the etcd flags name no etcd store.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EtcdOptionsError {
    /// TLS flags without `--store etcd://…`.
    TlsWithoutEtcd,
    /// `--etcd-prefix` is not an absolute prefix other than `/`.
    Prefix(String),
    /// `--store etcd://…` names no etcd cluster.
    Url(UrlError),
}

impl std::fmt::Display for EtcdOptionsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EtcdOptionsError::TlsWithoutEtcd => {
                f.write_str("--etcd-ca, --etcd-cert and --etcd-key need --store etcd://…")
            }
            EtcdOptionsError::Prefix(prefix) => write!(
                f,
                "--etcd-prefix {prefix:?}: write an absolute key prefix other than \"/\", like /allot"
            ),
            EtcdOptionsError::Url(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for EtcdOptionsError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            EtcdOptionsError::Url(e) => Some(e),
            _ => None,
        }
    }
}

impl StoreOptions {
    /// The etcd configuration, when `--store` names etcd.
    pub fn etcd(&self) -> Result<Option<EtcdConfig>, EtcdOptionsError> {
        let Some(url) = self.store.as_deref().filter(|s| s.starts_with("etcd://")) else {
            if self.etcd_ca.is_some() || self.etcd_cert.is_some() {
                return Err(EtcdOptionsError::TlsWithoutEtcd);
            }
            return Ok(None);
        };
        if !self.etcd_prefix.starts_with('/') || self.etcd_prefix.trim_end_matches('/').is_empty() {
            return Err(EtcdOptionsError::Prefix(self.etcd_prefix.clone()));
        }
        Ok(Some(EtcdConfig {
            prefix: self.etcd_prefix.clone(),
            ca: self.etcd_ca.clone(),
            cert: self.etcd_cert.clone(),
            key: self.etcd_key.clone(),
            ..EtcdConfig::from_url(url).map_err(EtcdOptionsError::Url)?
        }))
    }

    /// Opens the store: etcd when `--store etcd://…`, else the SQLite file `--store FILE`, else
    /// `default_file`.
    pub fn open(&self, default_file: &std::path::Path) -> Result<OpenedStore, StoreError> {
        if let Some(config) = self
            .etcd()
            .map_err(|e| StoreError::backend_caused(e.to_string(), e))?
        {
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
            return Err(StoreError::backend(
                "--kubeconfig needs --store kubernetes (allotctl) or --kubernetes (allot-agent)",
            ));
        }
        let file = match self.store.as_deref() {
            Some(s) if s.contains("://") => {
                return Err(StoreError::backend(format!(
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
    use crate::etcd::DEFAULT_PREFIX;

    fn args(store: Option<&str>) -> StoreOptions {
        StoreOptions {
            store: store.map(str::to_string),
            etcd_prefix: DEFAULT_PREFIX.into(),
            ..StoreOptions::default()
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
        assert_eq!(tls.etcd(), Err(EtcdOptionsError::TlsWithoutEtcd));
        assert!(
            tls.etcd()
                .unwrap_err()
                .to_string()
                .contains("need --store etcd://")
        );
        for bad in ["allot", "/", ""] {
            let mut a = args(Some("etcd://127.0.0.1:2379"));
            a.etcd_prefix = bad.into();
            assert!(
                a.etcd().unwrap_err().to_string().contains("--etcd-prefix"),
                "{bad}"
            );
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
