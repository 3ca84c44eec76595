//! The workload-cluster copy: a Cluster API cluster's ConfigMap `allot-ipam-allocations` (the
//! one in its namespace, `data: {POOL: "first-last,…"}`) written into the workload cluster
//! itself, through the kubeconfig Cluster API keeps in the Secret `<cluster>-kubeconfig` (key
//! `value`) beside the Cluster, so that MetalLB and the like read their range where they run.
//!
//! On for every Cluster with `--fleet-workload-configmap`, or for one Cluster with its
//! annotation `allot.dev/workload-configmap: "true"` (`"false"` turns it off for one Cluster when
//! the flag is on). A copy is written when the data differs from what was last written there,
//! and checked again every resync (someone may have edited or deleted it): create if absent,
//! else replace carrying the resourceVersion read. Each copy is bounded by a timeout, a few run
//! at once, and a failure (no Secret yet, an unreachable API server, a refusal) is a Warning
//! Event on the Cluster, retried with backoff, without holding up any other cluster or the
//! allocations.
//!
//! The kubeconfig comes from a Secret that whoever may write Secrets in the cluster's namespace
//! can write, so the controller refuses one that would make it run a command (`exec`, an
//! `auth-provider`) or read its own files (`tokenFile`, `client-certificate`, `client-key`,
//! `certificate-authority` paths): only inline credentials (`token`, `*-data`) are used, as in
//! the kubeconfigs Cluster API writes.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use allot_index::{FleetIndex, Shared};
use allot_k8s::openapi::api::core::v1::{ConfigMap, Secret};
use futures::future::BoxFuture;
use futures::{StreamExt, stream};
use kube::api::{Api, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::events::{Event, EventType};
use tokio::time::Instant;

use super::reconcile::{Events, cluster_reference};
use super::wants::{ClusterRef, Notice, tenants};
use crate::lease::Leadership;

/// The key of Cluster API's kubeconfig Secret that holds the kubeconfig.
pub const KUBECONFIG_KEY: &str = "value";
/// The annotation on a copy naming the Cluster it was written for.
pub const COPIED_FROM_ANNOTATION: &str = "allot.dev/copied-from";
/// Copies running at once.
const CONCURRENCY: usize = 4;
const FIRST_BACKOFF: Duration = Duration::from_secs(10);
const MAX_BACKOFF: Duration = Duration::from_secs(300);
const DEBOUNCE: Duration = Duration::from_millis(100);

/// How to reach a workload cluster's API from its kubeconfig (checked already).
pub type Connect =
    Arc<dyn Fn(Kubeconfig) -> BoxFuture<'static, Result<kube::Client, String>> + Send + Sync>;

/// A client for the workload cluster the kubeconfig names (its current context), every request
/// of which is bounded by `timeout`.
pub fn connect_with_kubeconfig(timeout: Duration) -> Connect {
    Arc::new(move |kubeconfig: Kubeconfig| {
        Box::pin(async move {
            let mut config =
                kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
                    .await
                    .map_err(|e| format!("the kubeconfig cannot be used: {e}"))?;
            config.connect_timeout = Some(timeout);
            config.read_timeout = Some(timeout);
            config.write_timeout = Some(timeout);
            kube::Client::try_from(config)
                .map_err(|e| format!("cannot make a client from the kubeconfig: {e}"))
        })
    })
}

/// What a refused kubeconfig should be instead.
const INLINE: &str = "use a kubeconfig with inline credentials (token, client-certificate-data, client-key-data, certificate-authority-data), as Cluster API writes it";

/// Why a kubeconfig from a Secret must not be used: it would make the controller run a command
/// or read a file of its own.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum KubeconfigError {
    /// `exec` or `auth-provider`.
    #[error(
        "user {user} authenticates by running a command (exec or auth-provider), which the controller never does for a kubeconfig read from a Secret: {INLINE}",
        INLINE = INLINE
    )]
    RunsCommand { user: String },
    /// `tokenFile`, `client-certificate` or `client-key` (`field`).
    #[error(
        "user {user} names a file ({field}: {path}), which would be read from the controller's own filesystem: {INLINE}",
        INLINE = INLINE
    )]
    UserFile {
        user: String,
        field: &'static str,
        path: String,
    },
    /// A cluster's `certificate-authority`.
    #[error(
        "cluster {cluster} names a file (certificate-authority: {path}), which would be read from the controller's own filesystem: {INLINE}",
        INLINE = INLINE
    )]
    ClusterFile { cluster: String, path: String },
}

/// Why a kubeconfig from a Secret must not be used, if it must not.
pub fn check_kubeconfig(k: &Kubeconfig) -> Result<(), KubeconfigError> {
    for user in &k.auth_infos {
        let Some(a) = &user.auth_info else { continue };
        if a.exec.is_some() || a.auth_provider.is_some() {
            return Err(KubeconfigError::RunsCommand {
                user: user.name.clone(),
            });
        }
        for (field, path) in [
            ("tokenFile", &a.token_file),
            ("client-certificate", &a.client_certificate),
            ("client-key", &a.client_key),
        ] {
            if let Some(path) = path {
                return Err(KubeconfigError::UserFile {
                    user: user.name.clone(),
                    field,
                    path: path.clone(),
                });
            }
        }
    }
    for cluster in &k.clusters {
        if let Some(path) = cluster
            .cluster
            .as_ref()
            .and_then(|c| c.certificate_authority.as_ref())
        {
            return Err(KubeconfigError::ClusterFile {
                cluster: cluster.name.clone(),
                path: path.clone(),
            });
        }
    }
    Ok(())
}

/// Why one copy into a workload cluster failed. `secret` is the kubeconfig Secret
/// (`namespace/name`), `server` the workload cluster's API server.
#[derive(Debug, thiserror::Error)]
pub enum CopyError {
    /// The API server refused to let the controller read the Secret (403).
    #[error(
        "cannot read Secret {secret}: {message}; the controller's ServiceAccount needs get on secrets to copy into workload clusters"
    )]
    SecretForbidden {
        secret: String,
        message: String,
        #[source]
        source: kube::Error,
    },
    #[error("cannot read Secret {secret}: {source}")]
    SecretUnreadable {
        secret: String,
        #[source]
        source: kube::Error,
    },
    #[error(
        "no Secret {secret}: Cluster API writes it once the workload cluster's control plane is up; the copy waits for it"
    )]
    NoSecret { secret: String },
    #[error(
        "Secret {secret} has no key {KUBECONFIG_KEY} (Cluster API keeps the kubeconfig there)",
        KUBECONFIG_KEY = KUBECONFIG_KEY
    )]
    NoKubeconfigKey { secret: String },
    #[error(
        "Secret {secret}: {KUBECONFIG_KEY} is not UTF-8 text",
        KUBECONFIG_KEY = KUBECONFIG_KEY
    )]
    NotText {
        secret: String,
        #[source]
        source: std::str::Utf8Error,
    },
    #[error(
        "Secret {secret}: {KUBECONFIG_KEY} is not a kubeconfig: {source}",
        KUBECONFIG_KEY = KUBECONFIG_KEY
    )]
    NotAKubeconfig {
        secret: String,
        #[source]
        source: kube::config::KubeconfigError,
    },
    /// A kubeconfig [`check_kubeconfig`] refuses.
    #[error("Secret {secret}: {source}")]
    Refused {
        secret: String,
        #[source]
        source: KubeconfigError,
    },
    /// No client for the workload cluster ([`Connect`] says why).
    #[error("Secret {secret}: {reason}")]
    Connect { secret: String, reason: String },
    /// The workload cluster has no namespace `namespace` (`--fleet-workload-namespace`).
    #[error(
        "the workload cluster ({server}) has no namespace {namespace}: create it, or choose another with --fleet-workload-namespace"
    )]
    NoNamespace {
        server: String,
        namespace: String,
        #[source]
        source: kube::Error,
    },
    #[error("the workload cluster's API server ({server}): {source}")]
    Workload {
        server: String,
        #[source]
        source: kube::Error,
    },
    /// The ConfigMap changed between each read and write of three tries.
    #[error(
        "the ConfigMap in the workload cluster ({server}) changed under every write; trying again later"
    )]
    Contended { server: String },
}

/// The API server a kubeconfig's current context names, for messages.
fn server_of(k: &Kubeconfig) -> String {
    let context = k
        .current_context
        .as_ref()
        .and_then(|name| k.contexts.iter().find(|c| &c.name == name))
        .and_then(|c| c.context.as_ref());
    context
        .and_then(|c| k.clusters.iter().find(|n| n.name == c.cluster))
        .and_then(|n| n.cluster.as_ref()?.server.clone())
        .unwrap_or_else(|| "(no server in the current context)".into())
}

/// One Cluster's copy: the data of its namespace's ConfigMap.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CopyTarget {
    pub cluster: ClusterRef,
    pub data: BTreeMap<String, String>,
}

/// The Clusters whose ConfigMap is copied (`default_on`: the flag), and the Clusters whose
/// annotation cannot be read.
pub fn copies(index: &FleetIndex, default_on: bool) -> (Vec<CopyTarget>, Vec<Notice>) {
    let (mut targets, mut notices) = (Vec::new(), Vec::new());
    for (ns, (cluster, entry, _)) in tenants(index) {
        if entry.deleting {
            continue;
        }
        let on = match entry.workload_copy.as_deref() {
            None => default_on,
            Some("true") => true,
            Some("false") => false,
            Some(other) => {
                notices.push(Notice {
                    cluster: cluster.clone(),
                    reason: "WorkloadConfigMapAnnotationInvalid",
                    message: format!(
                        "annotation {} is {other:?}: write \"true\" or \"false\"; nothing is copied into the workload cluster meanwhile",
                        allot_index::fleet::WORKLOAD_COPY_ANNOTATION
                    ),
                });
                continue;
            }
        };
        if let (true, Some(data)) = (on, index.config_map(ns)) {
            targets.push(CopyTarget {
                cluster,
                data: data.clone(),
            });
        }
    }
    (targets, notices)
}

/// What a copy did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Copied {
    Created,
    Updated,
    Unchanged,
}

/// The copy settings.
#[derive(Clone, Debug)]
pub struct CopySettings {
    /// `--fleet-workload-configmap`.
    pub default_on: bool,
    /// The namespace of the copy in the workload cluster.
    pub namespace: String,
    /// The bound of one whole copy (the Secret, the connection, the writes).
    pub timeout: Duration,
    /// How often a copy written is checked again.
    pub resync: Duration,
    /// Cluster API's version, for Events.
    pub cluster_api_version: String,
}

/// What was last done for a Cluster.
struct Last {
    data: BTreeMap<String, String>,
    failure: Option<String>,
    /// When to look again even if the data did not change.
    next: Instant,
    backoff: Duration,
}

/// Keeps the copies, while leading.
pub struct WorkloadCopier {
    client: kube::Client,
    recorder: Events,
    leadership: Leadership,
    settings: CopySettings,
    connect: Connect,
    last: HashMap<(String, String), Last>,
    /// Annotation notices told: cluster → note.
    told: HashMap<(String, String), String>,
}

impl WorkloadCopier {
    pub fn new(
        client: kube::Client,
        recorder: Events,
        leadership: Leadership,
        settings: CopySettings,
        connect: Connect,
    ) -> WorkloadCopier {
        WorkloadCopier {
            client,
            recorder,
            leadership,
            settings,
            connect,
            last: HashMap::new(),
            told: HashMap::new(),
        }
    }

    /// Copies while leading, on every change of the index and when a check or retry is due.
    /// Never returns.
    pub async fn run(mut self, index: Arc<Shared<FleetIndex>>) {
        let mut changes = index.changes();
        let mut leading = self.leadership.subscribe();
        loop {
            self.leadership.until_leading().await;
            // Before reading the index: a change made during the round wakes the wait below.
            changes.mark_unchanged();
            leading.mark_unchanged();
            let wake = if index.read().ready() {
                let (targets, notices) = copies(&index.read(), self.settings.default_on);
                self.round(targets, notices).await
            } else {
                None
            };
            let wake = wake.unwrap_or_else(|| Instant::now() + self.settings.resync);
            tokio::select! {
                _ = changes.changed() => tokio::time::sleep(DEBOUNCE).await,
                _ = leading.changed() => {}
                _ = tokio::time::sleep_until(wake) => {}
            }
        }
    }

    /// Copies what is due among `targets`; returns when to look again.
    pub async fn round(
        &mut self,
        targets: Vec<CopyTarget>,
        notices: Vec<Notice>,
    ) -> Option<Instant> {
        // A cluster whose annotation was fixed is told again if it breaks again.
        self.told.retain(|(ns, name), _| {
            notices
                .iter()
                .any(|n| n.cluster.namespace == *ns && n.cluster.name == *name)
        });
        for n in notices {
            let key = (n.cluster.namespace.clone(), n.cluster.name.clone());
            if self.told.get(&key) != Some(&n.message) {
                self.event(&n.cluster, EventType::Warning, n.reason, &n.message)
                    .await;
                self.told.insert(key, n.message);
            }
        }
        let now = Instant::now();
        let key = |t: &CopyTarget| (t.cluster.namespace.clone(), t.cluster.name.clone());
        self.last
            .retain(|k, _| targets.iter().any(|t| key(t) == *k));
        let due: Vec<CopyTarget> = targets
            .into_iter()
            .filter(|t| {
                self.last
                    .get(&key(t))
                    .is_none_or(|l| l.data != t.data || now >= l.next)
            })
            .collect();
        let this = &*self;
        let done: Vec<(CopyTarget, Option<Result<Copied, String>>)> = stream::iter(due)
            .map(|t| async move {
                if !this.leadership.is_leading() {
                    return (t, None);
                }
                let copied = match tokio::time::timeout(this.settings.timeout, this.copy(&t)).await
                {
                    Ok(r) => r.map_err(|e| e.to_string()),
                    Err(_) => Err(format!(
                        "not done within {:?} (--fleet-workload-timeout-seconds)",
                        this.settings.timeout
                    )),
                };
                (t, Some(copied))
            })
            .buffer_unordered(CONCURRENCY)
            .collect()
            .await;
        for (t, copied) in done {
            let Some(copied) = copied else { continue };
            self.record(t, copied).await;
        }
        self.last.values().map(|l| l.next).min()
    }

    async fn record(&mut self, t: CopyTarget, copied: Result<Copied, String>) {
        let c = &t.cluster;
        let key = (c.namespace.clone(), c.name.clone());
        let previous = self.last.remove(&key);
        let where_to = format!(
            "ConfigMap {}/{} in the workload cluster of Cluster {}/{}",
            self.settings.namespace,
            crate::fleet::CONFIG_MAP,
            c.namespace,
            c.name
        );
        let last = match copied {
            Ok(done) => {
                if done != Copied::Unchanged {
                    let note = format!(
                        "{where_to} {}",
                        if done == Copied::Created {
                            "created"
                        } else {
                            "updated"
                        }
                    );
                    tracing::info!(namespace = %c.namespace, cluster = %c.name, "{note}");
                    self.event(c, EventType::Normal, "WorkloadConfigMapWritten", &note)
                        .await;
                }
                Last {
                    data: t.data,
                    failure: None,
                    next: Instant::now() + self.settings.resync,
                    backoff: FIRST_BACKOFF,
                }
            }
            Err(why) => {
                let note = format!("cannot write {where_to}: {why}");
                let told = previous.as_ref().and_then(|l| l.failure.as_ref()) == Some(&note);
                if !told {
                    tracing::warn!(namespace = %c.namespace, cluster = %c.name, "{note}");
                    self.event(c, EventType::Warning, "WorkloadConfigMapFailed", &note)
                        .await;
                }
                let backoff = previous
                    .filter(|l| l.failure.is_some())
                    .map_or(FIRST_BACKOFF, |l| (l.backoff * 2).min(MAX_BACKOFF));
                Last {
                    data: t.data,
                    failure: Some(note),
                    next: Instant::now() + backoff,
                    backoff,
                }
            }
        };
        self.last.insert(key, last);
    }

    async fn event(&self, c: &ClusterRef, type_: EventType, reason: &str, note: &str) {
        let event = Event {
            type_,
            reason: reason.into(),
            note: Some(allot_k8s::event_note(note)),
            action: "CopyConfigMap".into(),
            secondary: None,
        };
        let reference = cluster_reference(&self.settings.cluster_api_version, c);
        if let Err(e) = self.recorder.publish(&event, &reference).await {
            tracing::warn!(namespace = %c.namespace, cluster = %c.name, "cannot record an Event: {e}");
        }
    }

    /// One copy: the kubeconfig from the Secret, then create or replace.
    pub async fn copy(&self, t: &CopyTarget) -> Result<Copied, CopyError> {
        let c = &t.cluster;
        let secret_name = format!("{}-kubeconfig", c.name);
        let secret = || format!("{}/{secret_name}", c.namespace);
        let secrets: Api<Secret> = Api::namespaced(self.client.clone(), &c.namespace);
        let found = secrets
            .get_opt(&secret_name)
            .await
            .map_err(|source| match &source {
                kube::Error::Api(s) if s.code == 403 => CopyError::SecretForbidden {
                    secret: secret(),
                    message: s.message.clone(),
                    source,
                },
                _ => CopyError::SecretUnreadable {
                    secret: secret(),
                    source,
                },
            })?
            .ok_or_else(|| CopyError::NoSecret { secret: secret() })?;
        let value = found
            .data
            .as_ref()
            .and_then(|d| d.get(KUBECONFIG_KEY))
            .ok_or_else(|| CopyError::NoKubeconfigKey { secret: secret() })?;
        let text = std::str::from_utf8(&value.0).map_err(|source| CopyError::NotText {
            secret: secret(),
            source,
        })?;
        let kubeconfig =
            Kubeconfig::from_yaml(text).map_err(|source| CopyError::NotAKubeconfig {
                secret: secret(),
                source,
            })?;
        check_kubeconfig(&kubeconfig).map_err(|source| CopyError::Refused {
            secret: secret(),
            source,
        })?;
        let server = server_of(&kubeconfig);
        let workload = (self.connect)(kubeconfig)
            .await
            .map_err(|reason| CopyError::Connect {
                secret: secret(),
                reason,
            })?;
        let api: Api<ConfigMap> = Api::namespaced(workload, &self.settings.namespace);
        let failed = |source: kube::Error| match &source {
            kube::Error::Api(s) if s.code == 404 => CopyError::NoNamespace {
                server: server.clone(),
                namespace: self.settings.namespace.clone(),
                source,
            },
            _ => CopyError::Workload {
                server: server.clone(),
                source,
            },
        };
        let labels = BTreeMap::from([(
            "app.kubernetes.io/managed-by".to_string(),
            "allot-controller".to_string(),
        )]);
        let source = format!("{}/{}", c.namespace, c.name);
        for _ in 0..3 {
            let stored = api
                .get_opt(crate::fleet::CONFIG_MAP)
                .await
                .map_err(failed)?;
            let Some(mut cm) = stored else {
                let mut cm = ConfigMap::default();
                cm.metadata.name = Some(crate::fleet::CONFIG_MAP.to_string());
                cm.metadata.labels = Some(labels.clone());
                cm.metadata.annotations = Some(BTreeMap::from([(
                    COPIED_FROM_ANNOTATION.to_string(),
                    source.clone(),
                )]));
                cm.data = Some(t.data.clone());
                match api.create(&PostParams::default(), &cm).await {
                    Ok(_) => return Ok(Copied::Created),
                    Err(kube::Error::Api(s)) if s.code == 409 => continue,
                    Err(e) => return Err(failed(e)),
                }
            };
            let meta = &mut cm.metadata;
            let current = cm.data.clone().unwrap_or_default() == t.data
                && meta
                    .labels
                    .as_ref()
                    .and_then(|l| l.get("app.kubernetes.io/managed-by"))
                    == labels.get("app.kubernetes.io/managed-by")
                && meta
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(COPIED_FROM_ANNOTATION))
                    == Some(&source);
            if current {
                return Ok(Copied::Unchanged);
            }
            meta.labels.get_or_insert_default().extend(labels.clone());
            meta.annotations
                .get_or_insert_default()
                .insert(COPIED_FROM_ANNOTATION.to_string(), source.clone());
            cm.data = Some(t.data.clone());
            // The resourceVersion read travels with the replace: an edit since is a 409.
            match api
                .replace(crate::fleet::CONFIG_MAP, &PostParams::default(), &cm)
                .await
            {
                Ok(_) => return Ok(Copied::Updated),
                // Changed or deleted since it was read: read it again.
                Err(kube::Error::Api(s)) if s.code == 409 || s.code == 404 => continue,
                Err(e) => return Err(failed(e)),
            }
        }
        Err(CopyError::Contended { server })
    }
}
