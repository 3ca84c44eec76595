//! Where pools come from: the standalone directory, etcd's config keys or the cluster's
//! objects, read as one observation. Reloading them (deciding what is in force) is a verb of the
//! node (`Node::reload`); the periodic work that calls it is wired in `run`.

use std::path::PathBuf;
use std::sync::Arc;

use crate::standalone;

/// Where pools, subnets and reserved addresses come from.
#[derive(Clone)]
pub enum Source {
    /// The YAML files of a directory (`--standalone`).
    Dir(PathBuf),
    /// The `PREFIX/config/` keys of etcd (`--store etcd://…` without `--standalone`), written by
    /// `allotctl pool apply`.
    Etcd(Arc<allot_store::EtcdStore>),
    /// The cluster's IPPool, Subnet and ReservedIP objects (`--kubernetes`), as the watches
    /// keep them in the index.
    Cluster(Arc<allot_index::SharedIndex>),
}

impl Source {
    pub fn describe(&self) -> String {
        match self {
            Source::Dir(dir) => dir.display().to_string(),
            Source::Etcd(etcd) => format!("{etcd:?} config keys"),
            Source::Cluster(_) => "the cluster's IPPools, Subnets and ReservedIPs".into(),
        }
    }

    /// Changes whenever what [`Source::load`] would read changes (`None`: unreadable now).
    pub fn fingerprint(&self) -> Option<u64> {
        match self {
            Source::Dir(dir) => standalone::fingerprint(dir).ok(),
            Source::Etcd(etcd) => etcd.load_config().ok().map(|(f, _)| f),
            Source::Cluster(index) => index.read().pools_generation(),
        }
    }

    pub fn load(&self) -> Result<allot_core::config::Observation, LoadError> {
        match self {
            Source::Dir(dir) => standalone::load(dir).map_err(|source| LoadError::Dir {
                dir: dir.clone(),
                source,
            }),
            Source::Etcd(etcd) => etcd
                .load_config()
                .map(|(_, o)| o)
                .map_err(|source| LoadError::Etcd { source }),
            Source::Cluster(index) => {
                let index = index.read();
                index.observation().map(|(_, o)| o).ok_or_else(|| {
                    let kinds = index
                        .unsynced()
                        .into_iter()
                        .filter(|k| k.holds_pools())
                        .map(|k| k.as_str())
                        .collect();
                    LoadError::Waiting { kinds }
                })
            }
        }
    }
}

/// Why [`Source::load`] read no pools.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("reading {}: {source}", dir.display())]
    Dir {
        dir: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("reading pools from etcd: {source}")]
    Etcd {
        #[source]
        source: allot_core::store::StoreError,
    },
    /// Cluster mode starting: the watches have not listed these kinds yet. Not a failure: the
    /// reload that meets it logs it as news, not as an error.
    #[error("waiting for the first list of {} from the Kubernetes API", kinds.join(", "))]
    Waiting { kinds: Vec<&'static str> },
}
