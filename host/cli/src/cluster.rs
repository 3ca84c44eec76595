//! The cluster a command works on (`allotctl migrate`, `allotctl ipam`): the Kubernetes claim
//! store (the IPBlocks) and a client, from `--kubeconfig` or the in-cluster ServiceAccount.
//! `--store` may be left out; any store other than `kubernetes` is refused.

use std::sync::Arc;

use allot_store::{KubeConfig, KubeStore};
use anyhow::{Context as _, bail};

use crate::store_args::StoreArgs;

pub struct Cluster {
    pub store: Arc<KubeStore>,
    pub client: kube::Client,
    /// The runtime `client` runs on: block on it for API calls; call the store (which blocks
    /// its caller) outside it.
    pub runtime: tokio::runtime::Runtime,
}

pub fn connect(args: &StoreArgs, command: &str) -> anyhow::Result<Cluster> {
    if let Some(store) = args.store.as_deref()
        && store != allot_store::KUBERNETES
    {
        bail!(
            "allotctl {command} works on a cluster's claims (its IPBlocks): leave --store out or \
             use --store kubernetes, not {store:?}"
        );
    }
    let store = KubeStore::connect(&KubeConfig {
        kubeconfig: args.kubeconfig.clone(),
        ..KubeConfig::default()
    })
    .context("cannot open the cluster's claims")?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let client = runtime.block_on(allot_store::kube_client(args.kubeconfig.as_deref()))?;
    Ok(Cluster {
        store: Arc::new(store),
        client,
        runtime,
    })
}
