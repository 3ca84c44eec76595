//! The etcd backend: claims as keys of an etcd v3 cluster, for several nodes without Kubernetes.
//!
//! # Atomicity
//!
//! A claim is the key `PREFIX/claims/ADDRESS`, created in a transaction guarded on its
//! `create_revision == 0` (it does not exist); a batch (dual-stack, several NICs) is one
//! transaction, so it is written entirely or not at all. Releases, detaches and reattaches read
//! the claim first and write it in a transaction guarded on the `mod_revision` they read: a
//! writer working from a stale read changes nothing and tries again from a fresh one, so it can
//! never release an address someone else holds now. The by-attachment, by-pod and detached
//! indexes are keys of their own written in the same transactions (see [`keys`]); lookups read
//! them, never a scan of all claims.
//!
//! # The change feed
//!
//! Each store watches `PREFIX/claims/` from the revision it opened at ([`feed`]) and keeps the
//! events in memory; `Store::changes_since` answers from them once the watch has caught up with
//! the store's current revision. A compaction or a watch that cannot resume turns readers behind
//! it into a full resync ([`Changes::Compacted`]). Feed revisions are positions derived from
//! etcd's revision (see [`feed`]).
//!
//! # Synchronous seam, asynchronous client
//!
//! The [`Store`](allot_core::store::Store) seam is synchronous: [`Backend`] implements the
//! store's operations on the async gRPC client once, and [`EtcdStore`] is the
//! [`BlockingStore`] of it ([`crate::blocking`]).
//!
//! # Limits
//!
//! etcd refuses transactions of more than `--max-txn-ops` (128 by default) operations; a fresh
//! claim takes five, so a batch holds at most 25 addresses (far more than dual-stack multi-NIC
//! pods need). Releases of many claims (GC) are split into transactions of [`RELEASE_CHUNK`]
//! claims, each claim still guarded on its own revision.

mod claims;
pub mod config;
mod feed;
pub mod keys;
#[cfg(feature = "testing")]
pub mod testing;

use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::blocking::{AsyncStore, BlockingStore};
use allot_core::store::{
    Attachment, Changes, Claim, Clock, PodRef, Reattach, Snapshot, StoreError, system_clock,
};
use etcd_client::{Certificate, Client, ConnectOptions, Identity, TlsOptions};

pub use keys::Keys;

/// The default key prefix.
pub const DEFAULT_PREFIX: &str = "/allot";

/// Budget of one request: an unreachable etcd fails a call quickly, so that the runtime retries.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(3);

/// How long opening a store waits for its claims watch to learn where it starts.
const FEED_START: Duration = Duration::from_secs(2);

/// Claims released per transaction when many are released at once.
pub const RELEASE_CHUNK: usize = 20;

/// Where the etcd cluster is and how to talk to it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EtcdConfig {
    /// `HOST:PORT` of each member.
    pub endpoints: Vec<String>,
    /// Keys live under this prefix (several installations can share one etcd).
    pub prefix: String,
    /// TLS to etcd: the CA that signed its certificate, and this client's certificate and key
    /// when etcd asks for one (`--client-cert-auth`).
    pub ca: Option<PathBuf>,
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
    /// Budget of one store call (all its requests); past it the call fails as unavailable.
    pub timeout: Duration,
}

/// Why an `etcd://` URL names no etcd cluster.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum UrlError {
    /// Not `etcd://…` at all.
    NotEtcd { url: String },
    /// One endpoint is not `HOST:PORT`.
    NotHostPort { url: String, endpoint: String },
}

impl std::fmt::Display for UrlError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            UrlError::NotEtcd { url } => write!(
                f,
                "{url:?} is not an etcd store: write etcd://HOST:PORT[,HOST:PORT…]"
            ),
            UrlError::NotHostPort { url, endpoint } => write!(
                f,
                "{url:?}: {endpoint:?} is not HOST:PORT (write etcd://127.0.0.1:2379,10.0.0.2:2379)"
            ),
        }
    }
}

impl std::error::Error for UrlError {}

impl EtcdConfig {
    /// Parses `etcd://HOST:PORT[,HOST:PORT…]`.
    pub fn from_url(url: &str) -> Result<EtcdConfig, UrlError> {
        let Some(rest) = url.strip_prefix("etcd://") else {
            return Err(UrlError::NotEtcd { url: url.into() });
        };
        let endpoints: Vec<String> = rest
            .trim_end_matches('/')
            .split(',')
            .map(str::trim)
            .map(str::to_string)
            .collect();
        for e in &endpoints {
            let ok = e.rsplit_once(':').is_some_and(|(host, port)| {
                !host.is_empty() && !host.contains('/') && port.parse::<u16>().is_ok_and(|p| p > 0)
            });
            if !ok {
                return Err(UrlError::NotHostPort {
                    url: url.into(),
                    endpoint: e.clone(),
                });
            }
        }
        Ok(EtcdConfig {
            endpoints,
            prefix: DEFAULT_PREFIX.to_string(),
            ca: None,
            cert: None,
            key: None,
            timeout: Duration::from_secs(8),
        })
    }

    fn tls(&self) -> Result<Option<TlsOptions>, StoreError> {
        if self.ca.is_none() && self.cert.is_none() && self.key.is_none() {
            return Ok(None);
        }
        let read = |what: &str, path: &PathBuf| {
            std::fs::read(path).map_err(|e| {
                StoreError::backend_caused(
                    format!("cannot read the etcd {what} {}: {e}", path.display()),
                    e,
                )
            })
        };
        let mut tls = TlsOptions::new();
        if let Some(ca) = &self.ca {
            tls = tls.ca_certificate(Certificate::from_pem(read("CA certificate", ca)?));
        }
        match (&self.cert, &self.key) {
            (Some(cert), Some(key)) => {
                tls = tls.identity(Identity::from_pem(
                    read("client certificate", cert)?,
                    read("client key", key)?,
                ));
            }
            (None, None) => {}
            _ => {
                return Err(StoreError::backend(
                    "give both --etcd-cert and --etcd-key (a client certificate needs its key)",
                ));
            }
        }
        Ok(Some(tls))
    }
}

/// Claims in etcd, asynchronously: the client, the key layout, the feed. [`EtcdStore`] is the
/// [`Store`] made of it.
pub struct Backend {
    client: Client,
    keys: Keys,
    feed: feed::Feed,
    clock: Clock,
    endpoints: String,
}

impl std::fmt::Debug for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdStore")
            .field("endpoints", &self.endpoints)
            .field("prefix", &self.keys.prefix())
            .finish_non_exhaustive()
    }
}

/// Claims in etcd. See the [module documentation](self).
pub type EtcdStore = BlockingStore<Backend>;

impl EtcdStore {
    /// Connects (lazily: an unreachable etcd makes calls fail as unavailable, and they succeed
    /// once it is back) and starts following the claims.
    pub fn connect(config: &EtcdConfig) -> Result<EtcdStore, StoreError> {
        Self::connect_with_clock(config, system_clock())
    }

    /// As [`EtcdStore::connect`], with the clock that stamps releases.
    pub fn connect_with_clock(config: &EtcdConfig, clock: Clock) -> Result<EtcdStore, StoreError> {
        if config.endpoints.is_empty() {
            return Err(StoreError::backend("no etcd endpoints given"));
        }
        let tls = config.tls()?;
        let scheme = if tls.is_some() { "https" } else { "http" };
        let endpoints: Vec<String> = config
            .endpoints
            .iter()
            .map(|e| format!("{scheme}://{e}"))
            .collect();
        let peer = format!("etcd {}", config.endpoints.join(","));
        let mut options = ConnectOptions::new()
            .with_connect_timeout(Duration::from_secs(2))
            // One request; a call (several requests) has `config.timeout`.
            .with_timeout(REQUEST_TIMEOUT.min(config.timeout))
            .with_keep_alive(Duration::from_secs(10), Duration::from_secs(5));
        if let Some(tls) = tls {
            options = options.with_tls(tls);
        }
        let names = config.endpoints.join(",");
        let prefix = config.prefix.clone();
        let store =
            BlockingStore::start("allot-etcd", &peer, config.timeout, move || async move {
                let client = Client::connect(&endpoints, Some(options))
                    .await
                    .map_err(|e| StoreError::backend_caused(format!("etcd {names}: {e}"), e))?;
                let backend = Arc::new(Backend {
                    client,
                    keys: Keys::new(&prefix),
                    feed: feed::Feed::default(),
                    clock,
                    endpoints: names,
                });
                tokio::spawn(feed::follow(backend.clone()));
                Ok(backend)
            })?;
        // A snapshot read once the feed has its start revision is one the feed can follow on
        // from; read before, its reader would be told to resync at once. Bounded, so that an
        // etcd that is down still makes a store whose calls fail until it is back.
        if !store
            .backend()
            .feed
            .wait_live(FEED_START.min(config.timeout))
        {
            tracing::warn!(%peer, "the claims watch has not started yet; readers may resync once");
        }
        Ok(store)
    }

    /// The key layout in use.
    pub fn keys(&self) -> &Keys {
        &self.backend().keys
    }

    /// Waits until the watch has seen a change after `revision`, or `timeout` passes: an agent
    /// follows other nodes' claims within one watch event instead of one poll interval.
    pub fn wait_for_change(&self, revision: u64, timeout: Duration) -> bool {
        self.backend().feed.wait_past(revision, timeout)
    }
}

fn etcd_error(endpoints: &str, e: etcd_client::Error) -> StoreError {
    use etcd_client::Error as E;
    use tonic::Code;
    match e {
        E::GRpcStatus(s) => match s.code() {
            Code::Unavailable
            | Code::DeadlineExceeded
            | Code::Cancelled
            | Code::Aborted
            | Code::ResourceExhausted
            | Code::Unknown => StoreError::unavailable_caused(
                format!(
                    "etcd {endpoints}: {} (retrying later may succeed)",
                    s.message()
                ),
                s,
            ),
            _ => StoreError::backend_caused(format!("etcd {endpoints}: {}", s.message()), s),
        },
        E::TransportError(e) => StoreError::unavailable_caused(
            format!("etcd {endpoints} is unreachable: {e}; is it running?"),
            e,
        ),
        E::IoError(e) => StoreError::unavailable_caused(format!("etcd {endpoints}: {e}"), e),
        other => StoreError::backend_caused(format!("etcd {endpoints}: {other}"), other),
    }
}

// The writes and the feed are the backend's own methods of the same names (claims.rs, feed.rs;
// `Backend::name` is the inherent one); this impl offers them to the seam.
impl AsyncStore for Backend {
    async fn claim_batch(
        &self,
        fresh: Vec<Claim>,
        reattach: Vec<Reattach>,
    ) -> Result<Vec<Claim>, StoreError> {
        Backend::claim_batch(self, fresh, reattach).await
    }

    async fn release_attachment(&self, attachment: Attachment) -> Result<Vec<Claim>, StoreError> {
        Backend::release_attachment(self, attachment).await
    }

    async fn release(
        &self,
        address: IpAddr,
        attachment: Option<Attachment>,
    ) -> Result<bool, StoreError> {
        Backend::release(self, address, attachment).await
    }

    async fn release_unchanged(&self, claims: Vec<Claim>) -> Result<Vec<Claim>, StoreError> {
        Backend::release_unchanged(self, claims).await
    }

    async fn detach(&self, attachment: Attachment, now: u64) -> Result<Vec<Claim>, StoreError> {
        Backend::detach(self, attachment, now).await
    }

    async fn quarantine(
        &self,
        address: IpAddr,
        attachment: Attachment,
        holder: PodRef,
        now: u64,
    ) -> Result<Claim, StoreError> {
        Backend::quarantine(self, address, attachment, holder, now).await
    }

    async fn claims_of(&self, attachment: Attachment) -> Result<Vec<Claim>, StoreError> {
        let mut claims = self
            .claims_at_index(&self.keys.by_attachment(&attachment))
            .await?;
        claims.retain(|c| c.attachment.as_ref() == Some(&attachment));
        Ok(claims)
    }

    async fn claims_of_pod(
        &self,
        namespace: String,
        name: String,
    ) -> Result<Vec<Claim>, StoreError> {
        let mut claims = self
            .claims_at_index(&self.keys.by_pod(&namespace, &name))
            .await?;
        claims.retain(|c| c.pod.namespace == namespace && c.pod.name == name);
        Ok(claims)
    }

    async fn detached(&self) -> Result<Vec<Claim>, StoreError> {
        let mut claims = self.claims_at_index(&self.keys.detached()).await?;
        claims.retain(|c| c.attachment.is_none());
        Ok(claims)
    }

    async fn all(&self) -> Result<Vec<Claim>, StoreError> {
        Ok(self.all_claims(None).await?.1)
    }

    async fn snapshot(&self, released_since: u64) -> Result<Snapshot, StoreError> {
        Backend::snapshot(self, released_since).await
    }

    async fn changes_since(&self, revision: u64) -> Result<Changes, StoreError> {
        Backend::changes_since(self, revision).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn store_urls() {
        let c = EtcdConfig::from_url("etcd://127.0.0.1:2379,etcd-2.example:2379").unwrap();
        assert_eq!(c.endpoints, ["127.0.0.1:2379", "etcd-2.example:2379"]);
        assert_eq!(c.prefix, "/allot");
        for bad in [
            "127.0.0.1:2379",
            "etcd://",
            "etcd://host",
            "etcd://host:0",
            "etcd://host:http",
            "etcd://:2379",
            "etcd://a:1,,b:2",
        ] {
            let err = EtcdConfig::from_url(bad).unwrap_err().to_string();
            assert!(err.contains("HOST:PORT"), "{bad}: {err}");
        }
    }

    #[test]
    fn a_certificate_without_its_key_is_refused() {
        let config = EtcdConfig {
            cert: Some("/nonexistent/cert.pem".into()),
            ..EtcdConfig::from_url("etcd://127.0.0.1:2379").unwrap()
        };
        let err = EtcdStore::connect(&config).unwrap_err().to_string();
        assert!(
            err.contains("give both --etcd-cert and --etcd-key"),
            "{err}"
        );
        let config = EtcdConfig {
            ca: Some("/nonexistent/ca.pem".into()),
            ..config
        };
        let config = EtcdConfig {
            cert: None,
            ..config
        };
        let err = EtcdStore::connect(&config).unwrap_err().to_string();
        assert!(
            err.contains("cannot read the etcd CA certificate /nonexistent/ca.pem"),
            "{err}"
        );
    }
}
