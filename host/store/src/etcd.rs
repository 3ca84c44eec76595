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
//! events in memory; [`Store::changes_since`] answers from them once the watch has caught up with
//! the store's current revision. A compaction or a watch that cannot resume turns readers behind
//! it into a full resync ([`Changes::Compacted`]). Feed revisions are positions derived from
//! etcd's revision (see [`feed`]).
//!
//! # Synchronous seam, asynchronous client
//!
//! The [`Store`] seam is synchronous; each `EtcdStore` owns a small tokio runtime for the gRPC
//! client and its watch, and a call waits for its task there ([`crate::blocking`]).
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
pub mod testing;

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::blocking::Blocking;
use allot_core::store::{
    Attachment, Changes, Claim, Clock, PodRef, Reattach, Snapshot, Store, StoreError, system_clock,
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

impl EtcdConfig {
    /// Parses `etcd://HOST:PORT[,HOST:PORT…]`.
    pub fn from_url(url: &str) -> Result<EtcdConfig, String> {
        let Some(rest) = url.strip_prefix("etcd://") else {
            return Err(format!(
                "{url:?} is not an etcd store: write etcd://HOST:PORT[,HOST:PORT…]"
            ));
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
                return Err(format!(
                    "{url:?}: {e:?} is not HOST:PORT (write etcd://127.0.0.1:2379,10.0.0.2:2379)"
                ));
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
                StoreError::Backend(format!(
                    "cannot read the etcd {what} {}: {e}",
                    path.display()
                ))
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
                return Err(StoreError::Backend(
                    "give both --etcd-cert and --etcd-key (a client certificate needs its key)"
                        .into(),
                ));
            }
        }
        Ok(Some(tls))
    }
}

/// What the async half of a store shares: the client, the key layout, the feed.
struct Inner {
    client: Client,
    keys: Keys,
    feed: feed::Feed,
    clock: Clock,
    endpoints: String,
}

/// Claims in etcd. See the [module documentation](self).
pub struct EtcdStore {
    inner: Arc<Inner>,
    blocking: Blocking,
}

impl std::fmt::Debug for EtcdStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdStore")
            .field("endpoints", &self.inner.endpoints)
            .field("prefix", &self.inner.keys.prefix())
            .finish_non_exhaustive()
    }
}

impl EtcdStore {
    /// Connects (lazily: an unreachable etcd makes calls fail as unavailable, and they succeed
    /// once it is back) and starts following the claims.
    pub fn connect(config: &EtcdConfig) -> Result<EtcdStore, StoreError> {
        Self::connect_with_clock(config, system_clock())
    }

    /// As [`EtcdStore::connect`], with the clock that stamps releases.
    pub fn connect_with_clock(config: &EtcdConfig, clock: Clock) -> Result<EtcdStore, StoreError> {
        if config.endpoints.is_empty() {
            return Err(StoreError::Backend("no etcd endpoints given".into()));
        }
        let tls = config.tls()?;
        let scheme = if tls.is_some() { "https" } else { "http" };
        let endpoints: Vec<String> = config
            .endpoints
            .iter()
            .map(|e| format!("{scheme}://{e}"))
            .collect();
        let peer = format!("etcd {}", config.endpoints.join(","));
        let blocking = Blocking::new("allot-etcd", &peer, config.timeout)?;
        let runtime = blocking.runtime();
        let mut options = ConnectOptions::new()
            .with_connect_timeout(Duration::from_secs(2))
            // One request; a call (several requests) has `config.timeout`.
            .with_timeout(REQUEST_TIMEOUT.min(config.timeout))
            .with_keep_alive(Duration::from_secs(10), Duration::from_secs(5));
        if let Some(tls) = tls {
            options = options.with_tls(tls);
        }
        let client = runtime
            .block_on(Client::connect(&endpoints, Some(options)))
            .map_err(|e| {
                StoreError::Backend(format!("etcd {}: {e}", config.endpoints.join(",")))
            })?;
        let keys = Keys::new(&config.prefix);
        let feed = feed::Feed::default();
        let inner = Arc::new(Inner {
            client,
            keys,
            feed,
            clock,
            endpoints: config.endpoints.join(","),
        });
        runtime.spawn(feed::follow(inner.clone()));
        // A snapshot read once the feed has its start revision is one the feed can follow on
        // from; read before, its reader would be told to resync at once. Bounded, so that an
        // etcd that is down still makes a store whose calls fail until it is back.
        if !inner.feed.wait_live(FEED_START.min(config.timeout)) {
            tracing::warn!(%peer, "the claims watch has not started yet; readers may resync once");
        }
        Ok(EtcdStore { inner, blocking })
    }

    /// The key layout in use.
    pub fn keys(&self) -> &Keys {
        &self.inner.keys
    }

    /// Runs `work` on the store's runtime and waits for it, within the call budget.
    fn run<T, F>(&self, work: impl FnOnce(Arc<Inner>) -> F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: Future<Output = Result<T, StoreError>> + Send + 'static,
    {
        self.blocking.run(work(self.inner.clone()))
    }

    fn index_lookup(
        &self,
        prefix: String,
        belong: impl Fn(&Claim) -> bool + Send + 'static,
    ) -> Result<Vec<Claim>, StoreError> {
        self.run(move |s| async move {
            let mut claims = s.claims_at_index(&prefix).await?;
            claims.retain(|c| belong(c));
            Ok(claims)
        })
    }

    /// Waits until the watch has seen a change after `revision`, or `timeout` passes: an agent
    /// follows other nodes' claims within one watch event instead of one poll interval.
    pub fn wait_for_change(&self, revision: u64, timeout: Duration) -> bool {
        self.inner.feed.wait_past(revision, timeout)
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
            | Code::Unknown => StoreError::Unavailable(format!(
                "etcd {endpoints}: {} (retrying later may succeed)",
                s.message()
            )),
            _ => StoreError::Backend(format!("etcd {endpoints}: {}", s.message())),
        },
        E::TransportError(e) => StoreError::Unavailable(format!(
            "etcd {endpoints} is unreachable: {e}; is it running?"
        )),
        E::IoError(e) => StoreError::Unavailable(format!("etcd {endpoints}: {e}")),
        other => StoreError::Backend(format!("etcd {endpoints}: {other}")),
    }
}

impl Store for EtcdStore {
    fn claim_batch(
        &self,
        fresh: &[Claim],
        reattach: &[Reattach],
    ) -> Result<Vec<Claim>, StoreError> {
        let (fresh, reattach) = (fresh.to_vec(), reattach.to_vec());
        self.run(move |s| async move { s.claim_batch(fresh, reattach).await })
    }

    fn release_attachment(&self, attachment: &Attachment) -> Result<Vec<Claim>, StoreError> {
        let attachment = attachment.clone();
        self.run(move |s| async move { s.release_attachment(attachment).await })
    }

    fn release(
        &self,
        address: std::net::IpAddr,
        attachment: Option<&Attachment>,
    ) -> Result<bool, StoreError> {
        let attachment = attachment.cloned();
        self.run(move |s| async move { s.release(address, attachment).await })
    }

    fn release_unchanged(&self, claims: &[Claim]) -> Result<Vec<Claim>, StoreError> {
        let claims = claims.to_vec();
        self.run(move |s| async move { s.release_unchanged(claims).await })
    }

    fn detach(&self, attachment: &Attachment, now: u64) -> Result<Vec<Claim>, StoreError> {
        let attachment = attachment.clone();
        self.run(move |s| async move { s.detach(attachment, now).await })
    }

    fn quarantine(
        &self,
        address: std::net::IpAddr,
        attachment: &Attachment,
        holder: &PodRef,
        now: u64,
    ) -> Result<Claim, StoreError> {
        let (attachment, holder) = (attachment.clone(), holder.clone());
        self.run(move |s| async move { s.quarantine(address, attachment, holder, now).await })
    }

    fn claims_of(&self, attachment: &Attachment) -> Result<Vec<Claim>, StoreError> {
        let attachment = attachment.clone();
        self.index_lookup(self.inner.keys.by_attachment(&attachment), move |c| {
            c.attachment.as_ref() == Some(&attachment)
        })
    }

    fn claims_of_pod(&self, namespace: &str, name: &str) -> Result<Vec<Claim>, StoreError> {
        let (namespace, name) = (namespace.to_string(), name.to_string());
        self.index_lookup(self.inner.keys.by_pod(&namespace, &name), move |c| {
            c.pod.namespace == namespace && c.pod.name == name
        })
    }

    fn detached(&self) -> Result<Vec<Claim>, StoreError> {
        self.index_lookup(self.inner.keys.detached(), |c| c.attachment.is_none())
    }

    fn all(&self) -> Result<Vec<Claim>, StoreError> {
        self.run(|s| async move { Ok(s.all_claims(None).await?.1) })
    }

    fn snapshot(&self, released_since: u64) -> Result<Snapshot, StoreError> {
        self.run(move |s| async move { s.snapshot(released_since).await })
    }

    fn changes_since(&self, revision: u64) -> Result<Changes, StoreError> {
        self.run(move |s| async move { s.changes_since(revision).await })
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
            let err = EtcdConfig::from_url(bad).unwrap_err();
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
