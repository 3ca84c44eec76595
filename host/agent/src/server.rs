//! The plugin-facing API (allot-api) over HTTP/1.1 on a unix socket: mode 0600, and a peer whose
//! uid is not ours is refused (SO_PEERCRED) before a byte is read. The agent owns its socket
//! and its DEL journal ([`start`]) before it replays the journal, and replays it before it
//! accepts anything.

use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use allot_api::{self as api, ErrorBody, codes};
use anyhow::Context as _;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::{Bytes, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::net::UnixListener;

use crate::node::{Node, NodeError};

type Reply = Response<Full<Bytes>>;

const MAX_BODY: usize = 1 << 20;

/// The plugin's socket and the DEL journal, this agent's alone while it lives: the socket
/// bound (nothing accepted until [`serve`]), and a lock on each held, which the kernel drops
/// when the process ends however it ends.
#[derive(Debug)]
pub struct SocketAndJournal {
    /// Taken by [`serve`].
    listener: Option<std::os::unix::net::UnixListener>,
    socket: PathBuf,
    inode: Option<u64>,
    _locks: [std::fs::File; 2],
}

impl SocketAndJournal {
    /// Removes the socket if it is still ours (not one a later agent bound meanwhile).
    fn unlink(&self) {
        if std::fs::symlink_metadata(&self.socket)
            .map(|m| m.ino())
            .ok()
            == self.inode
        {
            let _ = std::fs::remove_file(&self.socket);
        }
    }
}

impl Drop for SocketAndJournal {
    fn drop(&mut self) {
        self.unlink();
    }
}

/// Takes `socket` and the node's journal for this agent, then replays the journal. Only the
/// agent that owns both replays: an entry is settled under its attachment's lock, which only
/// this process's ADDs and DELs take, so another agent started on the node while this one
/// serves (its socket answering, or its locks held) is refused here, before it touches the
/// store. Nothing is accepted until the replay is done: the plugin's calls wait in the
/// socket's backlog meanwhile.
pub async fn start(node: Arc<Node>, socket: &Path) -> anyhow::Result<SocketAndJournal> {
    let owned = own(socket, node.journal().dir())?;
    let replaying = node.clone();
    tokio::task::spawn_blocking(move || replaying.replay_journal())
        .await
        .context("replaying the DEL journal")?;
    Ok(owned)
}

/// Locks `socket` (`SOCKET.lock`, next to it: its directory may hold other agents' sockets) and
/// the `journal` directory, then binds `socket`.
fn own(socket: &Path, journal: &Path) -> anyhow::Result<SocketAndJournal> {
    refuse_non_socket(socket)?;
    if let Some(parent) = socket.parent() {
        std::fs::create_dir_all(parent)
            .with_context(|| format!("creating {}", parent.display()))?;
    }
    let socket_lock = PathBuf::from(format!("{}.lock", socket.display()));
    let socket_file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(&socket_lock)
        .with_context(|| {
            format!(
                "opening the lock file {}; fix the permissions, or pass --socket PATH",
                socket_lock.display()
            )
        })?;
    // Never removed: two agents could then lock two different files of one name.
    let locked =
        try_lock(socket_file).with_context(|| format!("locking {}", socket_lock.display()))?;
    let Some(socket_locked) = locked else {
        anyhow::bail!(
            "another allot-agent owns {} (it holds {}): stop it first, or give this one another \
             --socket and --journal",
            socket.display(),
            socket_lock.display()
        );
    };
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(journal)
        .with_context(|| {
            format!(
                "creating the DEL journal {}; fix the permissions, or pass --journal DIR",
                journal.display()
            )
        })?;
    // The directory itself is locked: no file among the entries, and the lock is seen by every
    // container that mounts the directory.
    let journal_dir = std::fs::File::open(journal).with_context(|| {
        format!(
            "opening the DEL journal {}; fix the permissions, or pass --journal DIR",
            journal.display()
        )
    })?;
    let locked = try_lock(journal_dir)
        .with_context(|| format!("locking the DEL journal {}", journal.display()))?;
    let Some(journal_locked) = locked else {
        anyhow::bail!(
            "another allot-agent owns the DEL journal {} (it holds a lock on the directory) and \
             replays it: give this one another --journal, and its plugin's ipam `journal` the \
             same",
            journal.display()
        );
    };
    // An agent of a version without these locks may still serve here.
    claim_socket_path(socket)?;
    let listener = std::os::unix::net::UnixListener::bind(socket)
        .with_context(|| format!("listening on {}", socket.display()))?;
    std::fs::set_permissions(socket, std::fs::Permissions::from_mode(0o600))
        .with_context(|| format!("setting mode 0600 on {}", socket.display()))?;
    listener
        .set_nonblocking(true)
        .with_context(|| format!("listening on {}", socket.display()))?;
    Ok(SocketAndJournal {
        listener: Some(listener),
        socket: socket.to_path_buf(),
        inode: std::fs::symlink_metadata(socket).map(|m| m.ino()).ok(),
        _locks: [socket_locked, journal_locked],
    })
}

/// `file`, once it holds an exclusive lock (flock(2)), which lasts until it is closed; `None`
/// when another open file holds the lock.
fn try_lock(file: std::fs::File) -> std::io::Result<Option<std::fs::File>> {
    // SAFETY: flock(2) on a descriptor that `file` owns and keeps open.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
        return Ok(Some(file));
    }
    match std::io::Error::last_os_error() {
        e if e.kind() == std::io::ErrorKind::WouldBlock => Ok(None),
        e => Err(e),
    }
}

/// Serves the plugin API on the socket `owned` holds until SIGINT or SIGTERM, then finishes the
/// requests in flight (up to 30 s) before it lets the socket and the journal go.
pub async fn serve(node: Arc<Node>, mut owned: SocketAndJournal) -> anyhow::Result<()> {
    let listener = owned
        .listener
        .take()
        .context("the socket was served already")?;
    let listener = UnixListener::from_std(listener)
        .with_context(|| format!("listening on {}", owned.socket.display()))?;
    let me = unsafe { libc::geteuid() };
    tracing::info!(socket = %owned.socket.display(), "serving");

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
                        node.metrics().error("peer-refused");
                        continue;
                    }
                    Err(e) => { tracing::warn!("cannot read the peer's credentials: {e}"); continue; }
                }
                let node = node.clone();
                let service = hyper::service::service_fn(move |req| {
                    let node = node.clone();
                    async move { Ok::<_, std::convert::Infallible>(handle(node, req).await) }
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
    owned.unlink();
    tokio::select! {
        _ = graceful.shutdown() => tracing::info!("all requests finished"),
        _ = tokio::time::sleep(std::time::Duration::from_secs(30)) => tracing::warn!("gave up waiting for requests in flight"),
    }
    // Only now may another agent replay the journal: no DEL of ours is in flight.
    drop(owned);
    Ok(())
}

/// Refuses a `socket` path that holds anything but a socket: never replaced, never deleted, and
/// no lock file is made next to it.
fn refuse_non_socket(socket: &Path) -> anyhow::Result<()> {
    match std::fs::symlink_metadata(socket) {
        Ok(meta) if !meta.file_type().is_socket() => anyhow::bail!(
            "{} exists and is not a socket: refusing to replace it; pass another --socket",
            socket.display()
        ),
        _ => Ok(()),
    }
}

/// Makes `socket` free to bind: a stale socket left by a killed agent is removed; a live one (an
/// agent is answering) or anything that is not a socket is refused, never deleted.
fn claim_socket_path(socket: &Path) -> anyhow::Result<()> {
    match std::fs::symlink_metadata(socket) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e).with_context(|| format!("inspecting {}", socket.display())),
        Ok(meta) if !meta.file_type().is_socket() => refuse_non_socket(socket),
        Ok(_) if std::os::unix::net::UnixStream::connect(socket).is_ok() => anyhow::bail!(
            "another agent is already serving on {}: stop it first, or pass another --socket",
            socket.display()
        ),
        Ok(_) => std::fs::remove_file(socket)
            .with_context(|| format!("removing the stale socket {}", socket.display())),
    }
}

fn json<T: Serialize>(status: StatusCode, body: &T) -> Reply {
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
fn health_or_metrics(node: &Node, method: &Method, path: &str) -> Option<Reply> {
    if method != Method::GET {
        return None;
    }
    Some(match path {
        api::HEALTHZ => text(StatusCode::OK, "ok\n".into()),
        api::READYZ if node.ready() => text(StatusCode::OK, "ready\n".into()),
        api::READYZ => text(
            StatusCode::SERVICE_UNAVAILABLE,
            "pools not loaded yet\n".into(),
        ),
        api::METRICS => text(StatusCode::OK, node.metrics_text()),
        _ => return None,
    })
}

/// `--metrics-address`: `/metrics`, `/healthz` and `/readyz` over plain HTTP on TCP, for
/// Prometheus and the kubelet's probes. Nothing else is served there: the plugin API, status
/// (pool and pod names) and recorded decisions (labels, annotations) stay on the socket, which
/// only this user may reach. Returns the address bound (port 0 picks one).
pub async fn serve_metrics(
    node: Arc<Node>,
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
            let node = node.clone();
            let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                let reply = health_or_metrics(&node, req.method(), req.uri().path())
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

async fn handle(node: Arc<Node>, req: Request<Incoming>) -> Reply {
    let path = req.uri().path().to_string();
    if let Some(reply) = health_or_metrics(&node, req.method(), &path) {
        return reply;
    }
    match (req.method().clone(), path.as_str()) {
        (Method::GET, api::STATUS) => json(StatusCode::OK, &node.status()),
        (Method::GET, api::DECISIONS) => json(StatusCode::OK, &node.decisions()),
        (Method::POST, api::ADD) => match body::<api::AddRequest>(req).await {
            Ok(r) => answer(node.add(r).await),
            Err(reply) => reply,
        },
        (Method::POST, api::DEL) => match body::<api::DelRequest>(req).await {
            Ok(r) => answer(node.del(r).await.map(|()| serde_json::json!({}))),
            Err(reply) => reply,
        },
        (Method::POST, api::CHECK) => match body::<api::AttachmentId>(req).await {
            Ok(r) => answer(node.check(r).await),
            Err(reply) => reply,
        },
        (Method::POST, api::GC) => match body::<api::GcRequest>(req).await {
            Ok(r) => answer(node.gc(r).await),
            Err(reply) => reply,
        },
        (Method::POST, api::QUARANTINE) => match body::<api::QuarantineRequest>(req).await {
            // Without a replacement, the answer is an empty object.
            Ok(r) => match node.quarantine(r).await {
                Ok(Some(result)) => json(StatusCode::OK, &result),
                Ok(None) => json(StatusCode::OK, &serde_json::json!({})),
                Err(e) => failure(&e),
            },
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

/// A verb's answer: its result as JSON, or its error as the plugin's error body.
fn answer<T: Serialize>(result: Result<T, NodeError>) -> Reply {
    match result {
        Ok(body) => json(StatusCode::OK, &body),
        Err(e) => failure(&e),
    }
}

fn failure(e: &NodeError) -> Reply {
    let code = e.code();
    error(http_status(code), code, e.to_string(), e.details())
}

/// The HTTP status that goes with a CNI error code (the plugin reads the code from the body).
fn http_status(code: u32) -> StatusCode {
    match code {
        codes::INVALID_POD | codes::DECODE_FAILURE => StatusCode::BAD_REQUEST,
        codes::TRY_AGAIN_LATER => StatusCode::SERVICE_UNAVAILABLE,
        codes::NO_POOL_FITS => StatusCode::CONFLICT,
        codes::UNKNOWN_CONTAINER => StatusCode::NOT_FOUND,
        codes::PAST_DEADLINE => StatusCode::GATEWAY_TIMEOUT,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    }
}
