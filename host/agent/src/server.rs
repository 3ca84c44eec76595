//! The plugin-facing API (allot-api) over HTTP/1.1 on a unix socket: mode 0600, and a peer whose
//! uid is not ours is refused (SO_PEERCRED) before a byte is read.

use std::collections::BTreeSet;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use allot_api::{self as api, ErrorBody, codes};
use allot_core::PolicyErrorKind;
use allot_core::engine::{AddOutcome, AddRequest, AllocError, DelRequest, Serialized};
use allot_core::policy::{CniDefaults, NamespaceInfo, NodeInfo, Owner, PodInfo};
use allot_core::store::{Attachment, Claim, StoreError};
use anyhow::Context as _;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::{Bytes, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::net::UnixListener;

use crate::args::AgentEngine;
use crate::inventory::SharedConfig;
use crate::metrics::Metrics;

pub struct Shared {
    pub engine: Arc<AgentEngine>,
    pub metrics: Arc<Metrics>,
    pub node_name: String,
    pub config: SharedConfig,
    /// The DEL journal (the plugin's, `--journal`): DELs the store cannot take now wait there.
    pub journal: std::path::PathBuf,
    /// Cluster mode's indexes and API client (`--kubernetes`).
    pub cluster: Option<crate::cluster::Cluster>,
    /// Probe defaults for the plugin, and how long quarantines last.
    pub underlay: crate::quarantine::Underlay,
    /// The ring of recent policy decisions (`--record-decisions`), served on `GET /v1/decisions`.
    pub decisions: Option<Arc<allot_policy::DecisionLog>>,
    /// `--probe-ahead`.
    pub ahead: Option<Arc<crate::ahead::ProbeAhead>>,
    /// The policies, for their fault counts in the metrics.
    pub policies: Arc<allot_policy::PolicyRegistry>,
}

pub(crate) type Reply = Response<Full<Bytes>>;

const MAX_BODY: usize = 1 << 20;

pub async fn serve(shared: Arc<Shared>, socket: &Path) -> anyhow::Result<()> {
    if let Some(parent) = socket.parent() {
        std::fs::create_dir_all(parent)
            .with_context(|| format!("creating {}", parent.display()))?;
    }
    claim_socket_path(socket)?;
    let listener =
        UnixListener::bind(socket).with_context(|| format!("listening on {}", socket.display()))?;
    std::fs::set_permissions(socket, std::fs::Permissions::from_mode(0o600))
        .with_context(|| format!("setting mode 0600 on {}", socket.display()))?;
    let our_inode = std::fs::symlink_metadata(socket).map(|m| m.ino()).ok();
    let me = unsafe { libc::geteuid() };
    tracing::info!(socket = %socket.display(), "serving");

    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let (stream, _) = match accepted {
                    Ok(s) => s,
                    Err(e) => { tracing::warn!("accept failed: {e}"); continue; }
                };
                match stream.peer_cred() {
                    Ok(cred) if cred.uid() == me => {}
                    Ok(cred) => {
                        tracing::warn!(uid = cred.uid(), pid = ?cred.pid(), "refused a peer of another user");
                        shared.metrics.error("peer-refused");
                        continue;
                    }
                    Err(e) => { tracing::warn!("cannot read the peer's credentials: {e}"); continue; }
                }
                let shared = shared.clone();
                let service = hyper::service::service_fn(move |req| {
                    let shared = shared.clone();
                    async move { Ok::<_, std::convert::Infallible>(handle(shared, req).await) }
                });
                let conn = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service);
                let conn = graceful.watch(conn);
                tokio::spawn(async move {
                    if let Err(e) = conn.await {
                        tracing::debug!("connection ended: {e}");
                    }
                });
            }
            _ = tokio::signal::ctrl_c() => break,
            _ = terminate.recv() => break,
        }
    }
    tracing::info!("shutting down: finishing requests in flight");
    drop(listener);
    // Remove the socket only if it is still ours (not one a later agent bound meanwhile).
    if std::fs::symlink_metadata(socket).map(|m| m.ino()).ok() == our_inode {
        let _ = std::fs::remove_file(socket);
    }
    tokio::select! {
        _ = graceful.shutdown() => tracing::info!("all requests finished"),
        _ = tokio::time::sleep(std::time::Duration::from_secs(30)) => tracing::warn!("gave up waiting for requests in flight"),
    }
    Ok(())
}

/// Makes `socket` free to bind: a stale socket left by a killed agent is removed; a live one (an
/// agent is answering) or anything that is not a socket is refused, never deleted.
fn claim_socket_path(socket: &Path) -> anyhow::Result<()> {
    match std::fs::symlink_metadata(socket) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e).with_context(|| format!("inspecting {}", socket.display())),
        Ok(meta) if !meta.file_type().is_socket() => anyhow::bail!(
            "{} exists and is not a socket: refusing to replace it; pass another --socket",
            socket.display()
        ),
        Ok(_) if std::os::unix::net::UnixStream::connect(socket).is_ok() => anyhow::bail!(
            "another agent is already serving on {}: stop it first, or pass another --socket",
            socket.display()
        ),
        Ok(_) => std::fs::remove_file(socket)
            .with_context(|| format!("removing the stale socket {}", socket.display())),
    }
}

pub(crate) fn json<T: Serialize>(status: StatusCode, body: &T) -> Reply {
    let mut r = Response::new(Full::new(Bytes::from(
        serde_json::to_vec(body).expect("serializable"),
    )));
    *r.status_mut() = status;
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    r
}

fn text(status: StatusCode, body: String) -> Reply {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    r
}

fn error(
    status: StatusCode,
    code: u32,
    msg: impl Into<String>,
    details: impl Into<String>,
) -> Reply {
    json(
        status,
        &ErrorBody {
            code,
            msg: msg.into(),
            details: details.into(),
        },
    )
}

async fn body<T: DeserializeOwned>(req: Request<Incoming>) -> Result<T, Reply> {
    let bytes = Limited::new(req.into_body(), MAX_BODY)
        .collect()
        .await
        .map_err(|e| {
            error(
                StatusCode::BAD_REQUEST,
                codes::DECODE_FAILURE,
                format!("reading the request: {e}"),
                "",
            )
        })?
        .to_bytes();
    serde_json::from_slice(&bytes).map_err(|e| {
        error(
            StatusCode::BAD_REQUEST,
            codes::DECODE_FAILURE,
            format!("malformed request: {e}"),
            "",
        )
    })
}

/// `/healthz`, `/readyz` and `/metrics`: what the socket and `--metrics-address` both answer.
fn health_or_metrics(shared: &Shared, method: &Method, path: &str) -> Option<Reply> {
    if method != Method::GET {
        return None;
    }
    Some(match path {
        api::HEALTHZ => text(StatusCode::OK, "ok\n".into()),
        api::READYZ if shared.engine.is_loaded() => text(StatusCode::OK, "ready\n".into()),
        api::READYZ => text(
            StatusCode::SERVICE_UNAVAILABLE,
            "pools not loaded yet\n".into(),
        ),
        api::METRICS => text(
            StatusCode::OK,
            shared.metrics.encode(
                &shared.engine.usage(),
                shared.engine.lost_races(),
                &shared.policies.faults(),
            ),
        ),
        _ => return None,
    })
}

/// `--metrics-address`: `/metrics`, `/healthz` and `/readyz` over plain HTTP on TCP, for
/// Prometheus and the kubelet's probes. Nothing else is served there: the plugin API, status
/// (pool and pod names) and recorded decisions (labels, annotations) stay on the socket, which
/// only this user may reach. Returns the address bound (port 0 picks one).
pub async fn serve_metrics(
    shared: Arc<Shared>,
    address: std::net::SocketAddr,
) -> anyhow::Result<std::net::SocketAddr> {
    let listener = allot_k8s::listen::bind(address)
        .and_then(tokio::net::TcpListener::from_std)
        .with_context(|| format!("listening on {address} (--metrics-address)"))?;
    let bound = listener.local_addr()?;
    tracing::info!(address = %bound, "serving /metrics, /healthz and /readyz over HTTP");
    tokio::spawn(async move {
        loop {
            let stream = match listener.accept().await {
                Ok((stream, _)) => stream,
                Err(e) => {
                    tracing::warn!("metrics listener: {e}");
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                    continue;
                }
            };
            let shared = shared.clone();
            let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                let reply = health_or_metrics(&shared, req.method(), req.uri().path())
                    .unwrap_or_else(|| {
                        text(
                            StatusCode::NOT_FOUND,
                            "only /metrics, /healthz and /readyz are served here\n".into(),
                        )
                    });
                async move { Ok::<_, std::convert::Infallible>(reply) }
            });
            tokio::spawn(async move {
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    Ok(bound)
}

async fn handle(shared: Arc<Shared>, req: Request<Incoming>) -> Reply {
    let path = req.uri().path().to_string();
    if let Some(reply) = health_or_metrics(&shared, req.method(), &path) {
        return reply;
    }
    match (req.method().clone(), path.as_str()) {
        (Method::GET, api::STATUS) => json(StatusCode::OK, &status(&shared)),
        (Method::GET, api::DECISIONS) => json(
            StatusCode::OK,
            &crate::recorded::recorded(shared.decisions.as_deref(), &shared.node_name),
        ),
        (Method::POST, api::ADD) => match body::<api::AddRequest>(req).await {
            Ok(r) => add(shared, r).await,
            Err(reply) => reply,
        },
        (Method::POST, api::DEL) => match body::<api::DelRequest>(req).await {
            Ok(r) => {
                blocking(&shared, "del", move |s| {
                    let request = DelRequest {
                        attachment: attachment(&r.attachment),
                        owner_replicas: r.owner_replicas,
                        issued_at: r.issued_at,
                    };
                    let container = request.attachment.clone();
                    let lock = s.engine.serialize(&container);
                    let touched = match release_serialized(s, &lock, request) {
                        Err(AllocError::Store(StoreError::Unavailable(why))) => {
                            // The pod must be able to go away: remember the DEL and replay it
                            // when the store is back, as the plugin does when we are down.
                            return remember_del(s, r, &why);
                        }
                        other => other?,
                    };
                    // Served now: a DEL remembered before (the runtime retried) is done too.
                    if let Err(e) = crate::journal::forget(s, &lock) {
                        tracing::warn!(%container, "served, but cannot remove its DEL journal entry: {e}; replaying it later releases nothing this attachment holds then");
                    }
                    if r.issued_at.is_some() {
                        let released = touched.iter().filter(|c| c.attachment.is_some()).count();
                        tracing::info!(%container, released, "replayed a DEL from the plugin's journal");
                    }
                    Ok(json(StatusCode::OK, &serde_json::json!({})))
                })
                .await
            }
            Err(reply) => reply,
        },
        (Method::POST, api::CHECK) => match body::<api::AttachmentId>(req).await {
            Ok(r) => {
                blocking(&shared, "check", move |s| {
                    Ok(json(
                        StatusCode::OK,
                        &result(&s.engine.check(&attachment(&r))?),
                    ))
                })
                .await
            }
            Err(reply) => reply,
        },
        (Method::POST, api::GC) => match body::<api::GcRequest>(req).await {
            Ok(r) => {
                blocking(&shared, "gc", move |s| {
                    let valid: BTreeSet<Attachment> =
                        r.valid_attachments.iter().map(attachment).collect();
                    let report = s.engine.gc(&r.network, &valid)?;
                    s.metrics.releases.inc_by(report.released.len() as u64);
                    for c in &report.released {
                        tracing::info!(address = %c.address, pool = %c.pool, "released by GC");
                    }
                    if report.suspects > 0 {
                        tracing::info!(network = %r.network, suspects = report.suspects, "claims seen leaked; released at a later GC past the grace period if still leaked");
                    }
                    Ok(json(
                        StatusCode::OK,
                        &api::GcResponse {
                            released: report
                                .released
                                .iter()
                                .map(|c| c.address.to_string())
                                .collect(),
                            suspects: report.suspects,
                        },
                    ))
                })
                .await
            }
            Err(reply) => reply,
        },
        (Method::POST, api::QUARANTINE) => match body::<api::QuarantineRequest>(req).await {
            Ok(r) => crate::quarantine::handle(shared, r).await,
            Err(reply) => reply,
        },
        _ => error(
            StatusCode::NOT_FOUND,
            codes::UNSUPPORTED_FIELD,
            format!("no endpoint {path}"),
            "",
        ),
    }
}

fn attachment(a: &api::AttachmentId) -> Attachment {
    Attachment {
        container_id: a.container_id.clone(),
        interface: a.if_name.clone(),
    }
}

/// A DEL, from the plugin or replayed from its journal, under the attachment's lock: in cluster
/// mode the StatefulSet's replica count comes from the index when the caller did not say it,
/// and the pod's Endpoint loses the interface whose addresses were released. Returns the claims
/// touched (released ones still name their attachment; kept ones do not).
pub(crate) fn release_serialized(
    shared: &Shared,
    lock: &Serialized<'_>,
    mut request: DelRequest,
) -> Result<Vec<Claim>, AllocError> {
    if let Some(cluster) = &shared.cluster
        && request.owner_replicas.is_none()
    {
        request.owner_replicas =
            cluster.owner_replicas(shared.engine.store().as_ref(), &request.attachment);
    }
    let touched = shared.engine.del_serialized(lock, &request)?;
    let released: Vec<&Claim> = touched.iter().filter(|c| c.attachment.is_some()).collect();
    shared.metrics.releases.inc_by(released.len() as u64);
    if let (Some(cluster), Some(c)) = (&shared.cluster, released.first()) {
        cluster.endpoints.released(
            &c.pod.namespace,
            &c.pod.name,
            &c.pod.uid,
            &request.attachment.interface,
        );
    }
    Ok(touched)
}

fn status(shared: &Shared) -> api::StatusResponse {
    let (degraded, problems) = {
        let config = shared.config.lock().unwrap_or_else(|p| p.into_inner());
        (config.degraded(), config.listed())
    };
    let ready = shared.engine.is_loaded();
    api::StatusResponse {
        ready,
        message: match (ready, problems.len()) {
            (false, _) => "pools not loaded yet".into(),
            (true, 0) => "ready".into(),
            (true, n) => format!(
                "ready, degraded: {n} object(s) or file(s) not entirely in force: {}",
                problems
                    .iter()
                    .map(|p| format!("{} {} {}: {}", p.kind, p.name, p.state, p.reason))
                    .collect::<Vec<_>>()
                    .join("; ")
            ),
        },
        pools: shared
            .engine
            .usage()
            .into_iter()
            .map(|u| api::PoolStatus {
                name: u.name,
                ip_version: u.family.version(),
                total: u.total,
                free: u.free,
                cooling: u.cooling,
                state: u.state.as_str().into(),
                claims: u.claims,
            })
            .collect(),
        degraded,
        problems,
    }
}

/// Runs engine work (store I/O, fsync) off the async threads, mapping errors to CNI codes.
pub(crate) async fn blocking(
    shared: &Arc<Shared>,
    verb: &'static str,
    f: impl FnOnce(&Shared) -> Result<Reply, AllocError> + Send + 'static,
) -> Reply {
    let s = shared.clone();
    match tokio::task::spawn_blocking(move || f(&s)).await {
        Ok(Ok(reply)) => reply,
        Ok(Err(e)) => {
            let (status, code, reason) = classify(&e);
            shared.metrics.error(reason);
            tracing::warn!(verb, reason, "{e}");
            let details = match &e {
                AllocError::NoPoolFits { trace, .. } => trace.clone(),
                _ => String::new(),
            };
            error(status, code, e.to_string(), details)
        }
        Err(e) => error(
            StatusCode::INTERNAL_SERVER_ERROR,
            codes::IO_FAILURE,
            format!("{verb} failed: {e}"),
            "",
        ),
    }
}

/// Writes a DEL the store could not take into the journal, and answers success; when even that
/// fails, the DEL fails with try-again-later and the runtime retries it.
fn remember_del(s: &Shared, r: api::DelRequest, why: &str) -> Result<Reply, AllocError> {
    let entry = api::DelRequest {
        issued_at: Some(r.issued_at.unwrap_or_else(unix_now)),
        ..r
    };
    // The entry's file name is made of these: never a path out of the journal directory.
    let safe = |s: &str| !s.is_empty() && !s.contains('/') && s != "." && s != "..";
    if !safe(&entry.attachment.container_id) || !safe(&entry.attachment.if_name) {
        return Err(AllocError::Store(StoreError::Unavailable(why.to_string())));
    }
    match api::journal::record(&s.journal, &entry) {
        Ok(path) => {
            s.metrics.error("del-journaled");
            tracing::warn!(container = %format!("{}/{}", entry.attachment.container_id, entry.attachment.if_name), journal = %path.display(), "the store is unavailable ({why}); the DEL is remembered and will be replayed");
            Ok(json(StatusCode::OK, &serde_json::json!({})))
        }
        Err(e) => Err(AllocError::Store(StoreError::Unavailable(format!(
            "{why}; and the DEL cannot be remembered in {}: {e}",
            s.journal.display()
        )))),
    }
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

fn classify(e: &AllocError) -> (StatusCode, u32, &'static str) {
    match e {
        AllocError::Policy(p) => match p.kind {
            PolicyErrorKind::InvalidInput => {
                (StatusCode::BAD_REQUEST, codes::INVALID_POD, "invalid-pod")
            }
            PolicyErrorKind::NotReady => (
                StatusCode::SERVICE_UNAVAILABLE,
                codes::TRY_AGAIN_LATER,
                "not-ready",
            ),
            _ => (
                StatusCode::INTERNAL_SERVER_ERROR,
                codes::POLICY_FAILED,
                "policy-failed",
            ),
        },
        AllocError::NoPoolFits { .. } | AllocError::NothingDecided(_) => {
            (StatusCode::CONFLICT, codes::NO_POOL_FITS, "no-pool-fits")
        }
        AllocError::Store(StoreError::Backend(_)) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            codes::STORE_FAILED,
            "store",
        ),
        AllocError::Store(_) | AllocError::Contended(_) | AllocError::NotLoaded => (
            StatusCode::SERVICE_UNAVAILABLE,
            codes::TRY_AGAIN_LATER,
            "try-again",
        ),
        AllocError::UnknownAttachment(_) => (
            StatusCode::NOT_FOUND,
            codes::UNKNOWN_CONTAINER,
            "unknown-container",
        ),
    }
}

pub(crate) fn result(o: &AddOutcome) -> api::IpamResult {
    api::IpamResult {
        ips: o
            .allocations
            .iter()
            .map(|a| api::IpConfig {
                address: a.cidr(),
                gateway: a.gateway.map(|g| g.to_string()),
                pool: a.pool.clone(),
            })
            .collect(),
        routes: o
            .routes
            .iter()
            .map(|r| api::RouteConfig {
                dst: r.dst.to_string(),
                gw: Some(r.gw.to_string()),
            })
            .collect(),
        probe: None,
        preprobed: None,
    }
}

/// The engine's ADD for the plugin's request (also used to serve the ADD again after a
/// quarantine). In cluster mode the pod, its namespace, the node and the interface's Multus
/// network come from the indexes (returned too, for the pod's Endpoint); a pod that cannot be
/// found or read is the reply.
pub(crate) async fn add_request(
    shared: &Shared,
    r: &api::AddRequest,
) -> Result<(AddRequest, Option<allot_index::PodRequest>), Reply> {
    let mut request = AddRequest {
        attachment: Attachment {
            container_id: r.container_id.clone(),
            interface: r.if_name.clone(),
        },
        network: r.network.clone(),
        pod: PodInfo {
            namespace: r.pod.namespace.clone(),
            name: r.pod.name.clone(),
            uid: r.pod.uid.clone(),
            owner: match (&r.pod.owner_kind, &r.pod.owner_name) {
                (Some(kind), Some(name)) => Some(Owner {
                    kind: kind.clone(),
                    name: name.clone(),
                }),
                _ => None,
            },
            ..Default::default()
        },
        namespace: NamespaceInfo {
            name: r.pod.namespace.clone(),
            ..Default::default()
        },
        node: NodeInfo {
            name: shared.node_name.clone(),
            ..Default::default()
        },
        multus_name: r.multus_name.clone(),
        cni_defaults: CniDefaults {
            ipv4: r.default_ipv4_pools.clone(),
            ipv6: r.default_ipv6_pools.clone(),
        },
    };
    let mut found = None;
    if let Some(cluster) = &shared.cluster {
        match cluster
            .request(&r.pod.namespace, &r.pod.name, &r.pod.uid, &r.if_name)
            .await
        {
            Ok(pod) => {
                request.pod = pod.pod.clone();
                request.namespace = pod.namespace.clone();
                request.node = pod.node.clone();
                request.multus_name = pod.multus_name.clone();
                found = Some(pod);
            }
            Err(e) => {
                let (status, code, reason, why) = match e {
                    crate::cluster::LookupError::Invalid(why) => (
                        StatusCode::BAD_REQUEST,
                        codes::INVALID_POD,
                        "invalid-pod",
                        why,
                    ),
                    crate::cluster::LookupError::Unavailable(why) => (
                        StatusCode::SERVICE_UNAVAILABLE,
                        codes::TRY_AGAIN_LATER,
                        "pod-unknown",
                        why,
                    ),
                };
                shared.metrics.error(reason);
                tracing::warn!(verb = "add", reason, "{why}");
                return Err(error(status, code, why, ""));
            }
        }
    }
    Ok((request, found))
}

async fn add(shared: Arc<Shared>, r: api::AddRequest) -> Reply {
    let started = Instant::now();
    let (request, found) = match add_request(&shared, &r).await {
        Ok(built) => built,
        Err(reply) => return reply,
    };
    let reply = blocking(&shared, "add", move |s| {
        let lock = s.engine.serialize(&request.attachment);
        // A DEL of this attachment remembered while it could not be served was issued before
        // this ADD: it comes first (see the journal module).
        crate::journal::settle(s, &lock)?;
        let out = s.engine.add_serialized(&lock, &request)?;
        drop(lock);
        if let (Some(cluster), Some(pod)) = (&s.cluster, &found) {
            cluster.endpoints.added(pod, &request.attachment.interface, &out);
        }
        if !out.repeated {
            s.metrics.allocations.inc_by(out.allocations.len() as u64);
            for a in &out.allocations {
                tracing::info!(address = %a.cidr(), pool = %a.pool, container = %request.attachment, pod = %format!("{}/{}", request.pod.namespace, request.pod.name), "allocated");
            }
        }
        // The plugin probes with these unless the network's config says otherwise.
        let probe = s.underlay.probe;
        let preprobed = s
            .ahead
            .as_ref()
            .and_then(|a| a.served(&r, r.probe.or(probe), &out));
        Ok(json(StatusCode::OK, &api::IpamResult { probe, preprobed, ..result(&out) }))
    })
    .await;
    shared
        .metrics
        .add_seconds
        .observe(started.elapsed().as_secs_f64());
    reply
}
