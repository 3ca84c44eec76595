//! An in-memory Kubernetes API server for tests.
//!
//! No API server can be installed where allot's CI runs, so the Kubernetes code is tested against
//! this one: it keeps objects of any resource as JSON, with the API's semantics that allot relies
//! on — `resourceVersion` compare-and-swap on update, patch and delete preconditions
//! (409 `Conflict`), create-if-absent (409 `AlreadyExists`), 404 `NotFound`, label and field
//! selectors on lists and watches, watches that resume from a `resourceVersion` and answer
//! `410 Gone` when it is older than the history kept ([`ApiServer::compact`]), status
//! subresources, finalizers, and faults injected per verb and resource (403 `Forbidden` with the
//! API server's wording, any other status, delays).
//!
//! It serves kube's [`Client`](kube::Client) in process ([`ApiServer::client`], a tower service
//! like kube's own mock) or over HTTP on a loopback port ([`ApiServer::serve`]) for binaries
//! started with a kubeconfig ([`ApiServer::kubeconfig`]).
//!
//! Not modelled: authentication, admission, defaulting, server-side apply field ownership (an
//! apply patch is a merge patch that creates a missing object), `deletecollection`, pagination
//! (a list returns every item in one page), and resource kinds it has not seen (a list of an
//! unknown resource is empty, as for a CRD with no objects).

mod objects;
mod response;
mod selector;
pub mod verifier;

use std::collections::{BTreeMap, VecDeque};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use http::{Method, Request, Response};
use http_body_util::{BodyExt, combinators::UnsyncBoxBody};
use serde_json::{Value, json};
use tokio::sync::broadcast;

use objects::{create, delete, get, list, patch, update};
use response::{
    forbidden, json_response, line, split_api_version, status, status_body, stream_response,
    url_pairs,
};
use selector::{FieldSelector, LabelSelector};

/// Events kept for watches that resume; older resource versions get `410 Gone`.
const HISTORY: usize = 50_000;

/// A server on a loopback port ([`ApiServer::on_loopback`]); it stops when this is dropped.
pub struct Loopback {
    pub server: ApiServer,
    /// A kubeconfig naming the server, for binaries under test.
    pub kubeconfig: std::path::PathBuf,
    /// The temporary directory the kubeconfig is in; tests may put their files there too.
    pub dir: tempfile::TempDir,
    _runtime: tokio::runtime::Runtime,
}

/// A response body: whole, or a watch's stream of events.
pub type Body = UnsyncBoxBody<Bytes, Infallible>;

/// The server. Clones share one state.
#[derive(Clone)]
pub struct ApiServer {
    inner: Arc<Inner>,
}

struct Inner {
    state: Mutex<State>,
    events: broadcast::Sender<Signal>,
}

#[derive(Clone)]
enum Signal {
    Event(Arc<Event>),
    /// Ends every open watch (as an API server restart or a load balancer would).
    CloseWatches,
}

#[derive(Default)]
struct State {
    revision: u64,
    /// Objects by resource (`GROUP/VERSION/PLURAL`), namespace ("" for cluster-scoped), name.
    objects: BTreeMap<(String, String, String), Value>,
    history: VecDeque<Arc<Event>>,
    /// Watches from a resource version at or below this one are too old (`410 Gone`).
    compacted: u64,
    faults: Vec<Fault>,
    requests: BTreeMap<(String, String), u64>,
    next_uid: u64,
}

struct Event {
    revision: u64,
    resource: String,
    namespace: String,
    kind: &'static str,
    object: Value,
}

/// A fault: requests of `verb` (`get`, `list`, `watch`, `create`, `update`, `patch`, `delete`)
/// on `plural` are answered with `response`, `times` times (`None`: until cleared).
struct Fault {
    verb: String,
    plural: String,
    times: Option<usize>,
    response: FaultResponse,
}

#[derive(Clone)]
enum FaultResponse {
    Status { code: u16, reason: String },
    Forbidden,
    Delay(Duration),
}

/// Where a request goes.
#[derive(Debug)]
struct Target {
    group: String,
    version: String,
    plural: String,
    /// `None` across namespaces (a list or watch of a namespaced resource) or cluster-scoped.
    namespace: Option<String>,
    name: Option<String>,
    subresource: Option<String>,
}

impl Target {
    fn resource(&self) -> String {
        format!("{}/{}/{}", self.group, self.version, self.plural)
    }

    /// Where `object` of `plural` is stored (its apiVersion and namespace), named `name`.
    fn of(plural: &str, object: &Value, name: Option<String>) -> Target {
        let (group, version) = split_api_version(object["apiVersion"].as_str().unwrap_or("v1"));
        Target {
            group,
            version,
            plural: plural.to_string(),
            namespace: object["metadata"]["namespace"].as_str().map(str::to_string),
            name,
            subresource: None,
        }
    }

    fn parse(path: &str) -> Option<Target> {
        let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
        let (group, version, rest) = match parts.as_slice() {
            ["api", version, rest @ ..] => (String::new(), version.to_string(), rest),
            ["apis", group, version, rest @ ..] => (group.to_string(), version.to_string(), rest),
            _ => return None,
        };
        let owned = |s: &&str| s.to_string();
        let (namespace, rest) = match rest {
            ["namespaces", ns, rest @ ..] if !rest.is_empty() => (Some(ns.to_string()), rest),
            rest => (None, rest),
        };
        let (plural, name, subresource) = match rest {
            [plural] => (owned(plural), None, None),
            [plural, name] => (owned(plural), Some(owned(name)), None),
            [plural, name, sub] => (owned(plural), Some(owned(name)), Some(owned(sub))),
            _ => return None,
        };
        Some(Target {
            group,
            version,
            plural,
            namespace,
            name,
            subresource,
        })
    }
}

impl Default for ApiServer {
    fn default() -> Self {
        Self::new()
    }
}

impl ApiServer {
    pub fn new() -> ApiServer {
        let (events, _) = broadcast::channel(65_536);
        ApiServer {
            inner: Arc::new(Inner {
                state: Mutex::new(State {
                    revision: 100,
                    compacted: 0,
                    ..State::default()
                }),
                events,
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.inner.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A kube client talking to this server in process (call inside a tokio runtime).
    pub fn client(&self) -> kube::Client {
        let server = self.clone();
        let service = tower::service_fn(move |req: Request<kube::client::Body>| {
            let server = server.clone();
            async move { Ok::<_, Infallible>(server.answer(req).await) }
        });
        kube::Client::new(service, "default")
    }

    /// Reads a request's body and answers it (a body that cannot be read counts as empty).
    async fn answer<B: hyper::body::Body>(&self, req: Request<B>) -> Response<Body> {
        let (parts, body) = req.into_parts();
        let body = body
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        self.handle(parts, body).await
    }

    /// Serves HTTP on `addr` (a loopback port; port 0 picks one) until the runtime stops.
    /// Returns the address bound.
    pub async fn serve(&self, addr: SocketAddr) -> std::io::Result<SocketAddr> {
        let listener = tokio::net::TcpListener::bind(addr).await?;
        let bound = listener.local_addr()?;
        let server = self.clone();
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let server = server.clone();
                tokio::spawn(async move {
                    let service =
                        hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                            let server = server.clone();
                            async move { Ok::<_, Infallible>(server.answer(req).await) }
                        });
                    let io = hyper_util::rt::TokioIo::new(stream);
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(io, service)
                        .await;
                });
            }
        });
        Ok(bound)
    }

    /// A kubeconfig for a server at `url` (`http://127.0.0.1:PORT`), default namespace `default`.
    pub fn kubeconfig(url: &str) -> String {
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: test\n  cluster:\n    server: {url}\n\
             contexts:\n- name: test\n  context:\n    cluster: test\n    user: test\n    namespace: default\n\
             current-context: test\nusers:\n- name: test\n  user: {{}}\n"
        )
    }

    // -----------------------------------------------------------------------------------------
    // What a test sets up and inspects.

    /// Runs `change` on the state and then sends watchers the events it recorded, in order
    /// (after the lock is released: a watcher never waits on a writer).
    fn change<T>(&self, change: impl FnOnce(&mut State) -> T) -> T {
        let mut st = self.lock();
        let before = st.revision;
        let out = change(&mut st);
        let fresh: Vec<Arc<Event>> = st
            .history
            .iter()
            .rev()
            .take_while(|e| e.revision > before)
            .cloned()
            .collect();
        drop(st);
        for e in fresh.into_iter().rev() {
            let _ = self.inner.events.send(Signal::Event(e));
        }
        out
    }

    /// Stores `object` as if created (its `apiVersion`, `kind`, `metadata.name` and, when
    /// namespaced, `metadata.namespace` must be set). Returns it as stored.
    pub fn insert(&self, plural: &str, object: Value) -> Value {
        let target = Target::of(plural, &object, None);
        self.change(|st| create(st, &target, object))
            .unwrap_or_else(|(code, reason, message)| panic!("insert: {code} {reason}: {message}"))
    }

    /// Serves a new server on a loopback port from a runtime of its own, with a kubeconfig file
    /// for it in a temporary directory: what an end-to-end test hands to real binaries.
    pub fn on_loopback() -> Loopback {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("a runtime for the test API server");
        let server = ApiServer::new();
        let addr = runtime
            .block_on(server.serve("127.0.0.1:0".parse().expect("an address")))
            .expect("a loopback port");
        let dir = tempfile::tempdir().expect("a temporary directory");
        let kubeconfig = dir.path().join("kubeconfig");
        std::fs::write(
            &kubeconfig,
            ApiServer::kubeconfig(&format!("http://{addr}")),
        )
        .expect("the kubeconfig written");
        Loopback {
            server,
            kubeconfig,
            dir,
            _runtime: runtime,
        }
    }

    /// Replaces a stored object as a user's edit would (`kubectl replace` without a
    /// resourceVersion: whatever was stored). Returns it as stored; watches see the change.
    pub fn edit(&self, plural: &str, mut object: Value) -> Value {
        let name = object["metadata"]["name"].as_str().map(str::to_string);
        let target = Target::of(plural, &object, name);
        if let Some(meta) = object["metadata"].as_object_mut() {
            meta.remove("resourceVersion");
        }
        self.change(|st| update(st, &target, object))
            .unwrap_or_else(|(code, reason, message)| panic!("edit: {code} {reason}: {message}"))
    }

    /// Deletes a stored object as `kubectl delete` would (finalizers honoured); `false` when
    /// there was none. `api_version` is the object's (`v1`, `apps/v1`, `allot.dev/v1alpha1`).
    pub fn remove(
        &self,
        api_version: &str,
        plural: &str,
        namespace: Option<&str>,
        name: &str,
    ) -> bool {
        let (group, version) = split_api_version(api_version);
        let target = Target {
            group,
            version,
            plural: plural.to_string(),
            namespace: namespace.map(str::to_string),
            name: Some(name.to_string()),
            subresource: None,
        };
        self.change(|st| delete(st, &target, Value::Null).is_ok())
    }

    /// Every stored object of `plural` (any group), in namespace, name order.
    pub fn objects(&self, plural: &str) -> Vec<Value> {
        self.lock()
            .objects
            .iter()
            .filter(|((r, _, _), _)| r.rsplit('/').next() == Some(plural))
            .map(|(_, v)| v.clone())
            .collect()
    }

    /// Requests served for `verb` on `plural` (`create`, `update`, `get`, `list`, `watch`, …).
    pub fn requests(&self, verb: &str, plural: &str) -> u64 {
        self.lock()
            .requests
            .get(&(verb.to_string(), plural.to_string()))
            .copied()
            .unwrap_or(0)
    }

    /// The next `times` requests of `verb` on `plural` are answered with `code` and `reason`.
    pub fn fail(&self, verb: &str, plural: &str, times: usize, code: u16, reason: &str) {
        self.lock().faults.push(Fault {
            verb: verb.to_string(),
            plural: plural.to_string(),
            times: Some(times),
            response: FaultResponse::Status {
                code,
                reason: reason.to_string(),
            },
        });
    }

    /// Every request of `verb` on `plural` is refused with 403, worded as RBAC refuses it,
    /// until [`ApiServer::clear_faults`].
    pub fn forbid(&self, verb: &str, plural: &str) {
        self.lock().faults.push(Fault {
            verb: verb.to_string(),
            plural: plural.to_string(),
            times: None,
            response: FaultResponse::Forbidden,
        });
    }

    /// Every request of `verb` on `plural` waits `delay` first, until cleared.
    pub fn delay(&self, verb: &str, plural: &str, delay: Duration) {
        self.lock().faults.push(Fault {
            verb: verb.to_string(),
            plural: plural.to_string(),
            times: None,
            response: FaultResponse::Delay(delay),
        });
    }

    pub fn clear_faults(&self) {
        self.lock().faults.clear();
    }

    /// Forgets the history: a watch resuming from any earlier resource version gets `410 Gone`.
    pub fn compact(&self) {
        let mut st = self.lock();
        st.compacted = st.revision;
        st.history.clear();
    }

    /// Ends every open watch stream, as an API server restart would.
    pub fn close_watches(&self) {
        let _ = self.inner.events.send(Signal::CloseWatches);
    }

    /// The current resource version.
    pub fn revision(&self) -> u64 {
        self.lock().revision
    }

    // -----------------------------------------------------------------------------------------
    // Serving.

    /// Answers one request.
    pub async fn handle(&self, parts: http::request::Parts, body: Bytes) -> Response<Body> {
        let Some(target) = Target::parse(parts.uri.path()) else {
            return status(404, "NotFound", &format!("no route {}", parts.uri.path()));
        };
        let query: BTreeMap<String, String> = parts
            .uri
            .query()
            .map(|q| url_pairs(q).into_iter().collect())
            .unwrap_or_default();
        let watching = matches!(query.get("watch").map(String::as_str), Some("true" | "1"));
        let verb = match (&parts.method, target.name.is_some()) {
            (&Method::GET, true) => "get",
            (&Method::GET, false) if watching => "watch",
            (&Method::GET, false) => "list",
            (&Method::POST, false) => "create",
            (&Method::PUT, true) => "update",
            (&Method::PATCH, true) => "patch",
            (&Method::DELETE, true) => "delete",
            _ => return status(405, "MethodNotAllowed", "not served by the test API server"),
        };
        let fault = {
            let mut st = self.lock();
            *st.requests
                .entry((verb.to_string(), target.plural.clone()))
                .or_default() += 1;
            take_fault(&mut st, verb, &target.plural)
        };
        match fault {
            Some(FaultResponse::Delay(d)) => tokio::time::sleep(d).await,
            Some(FaultResponse::Status { code, reason }) => {
                return status(code, &reason, &format!("injected {reason}"));
            }
            Some(FaultResponse::Forbidden) => return forbidden(verb, &target),
            None => {}
        }
        if verb == "watch" {
            return self.watch(&target, &query);
        }
        let body: Value = if body.is_empty() {
            Value::Null
        } else {
            match serde_json::from_slice(&body) {
                Ok(v) => v,
                Err(e) => return status(400, "BadRequest", &format!("body is not JSON: {e}")),
            }
        };
        let apply = parts
            .headers
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|ct| ct.starts_with("application/apply-patch"));
        let result = self.change(|st| match verb {
            "get" => get(st, &target).map(|v| (200, v)),
            "list" => list(st, &target, &query).map(|v| (200, v)),
            "create" => create(st, &target, body).map(|v| (201, v)),
            "update" => update(st, &target, body).map(|v| (200, v)),
            "patch" => patch(st, &target, body, apply).map(|v| (200, v)),
            "delete" => delete(st, &target, body).map(|v| (200, v)),
            _ => unreachable!("verbs are matched above"),
        });
        match result {
            Ok((code, v)) => json_response(code, &v),
            Err((code, reason, message)) => status(code, &reason, &message),
        }
    }

    fn watch(&self, target: &Target, query: &BTreeMap<String, String>) -> Response<Body> {
        let labels = match LabelSelector::parse(query.get("labelSelector")) {
            Ok(s) => s,
            Err(e) => return status(400, "BadRequest", &e),
        };
        let fields = match FieldSelector::parse(query.get("fieldSelector")) {
            Ok(s) => s,
            Err(e) => return status(400, "BadRequest", &e),
        };
        let timeout = query
            .get("timeoutSeconds")
            .and_then(|t| t.parse().ok())
            .unwrap_or(1800u64);
        let from: u64 = query
            .get("resourceVersion")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        let resource = target.resource();
        let namespace = target.namespace.clone();
        let matches = move |e: &Event| {
            e.resource == resource
                && namespace.as_ref().is_none_or(|ns| *ns == e.namespace)
                && labels.matches(&e.object)
                && fields.matches(&e.object)
        };
        // Under the lock: what happened after `from`, then the live feed, with nothing between.
        let (replay, live) = {
            let st = self.lock();
            let live = self.inner.events.subscribe();
            if from > 0 && from < st.compacted {
                let gone = json!({"type": "ERROR", "object": status_body(410, "Expired",
                    &format!("too old resource version: {from} ({})", st.compacted))});
                drop(st);
                return stream_response(futures::stream::iter([line(&gone)]).boxed());
            }
            let replay: Vec<Bytes> = if from == 0 {
                st.objects
                    .iter()
                    .filter(|((r, ns, _), _)| {
                        *r == target.resource() && target.namespace.as_ref().is_none_or(|n| n == ns)
                    })
                    .map(|(_, o)| o)
                    .filter(|o| {
                        matches(&Event {
                            revision: 0,
                            resource: target.resource(),
                            namespace: o["metadata"]["namespace"]
                                .as_str()
                                .unwrap_or_default()
                                .to_string(),
                            kind: "ADDED",
                            object: (*o).clone(),
                        })
                    })
                    .map(|o| line(&json!({"type": "ADDED", "object": o})))
                    .collect()
            } else {
                st.history
                    .iter()
                    .filter(|e| e.revision > from && matches(e))
                    .map(|e| line(&json!({"type": e.kind, "object": e.object})))
                    .collect()
            };
            (replay, live)
        };
        let replayed = futures::stream::iter(replay);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(timeout);
        let live = futures::stream::unfold(
            (live, matches, deadline),
            |(mut live, matches, deadline)| async move {
                loop {
                    let next = tokio::time::timeout_at(deadline, live.recv()).await;
                    match next {
                        Err(_) => return None,
                        Ok(Ok(Signal::Event(e))) if matches(&e) => {
                            let l = line(&json!({"type": e.kind, "object": e.object}));
                            return Some((l, (live, matches, deadline)));
                        }
                        Ok(Ok(Signal::Event(_))) => continue,
                        Ok(Ok(Signal::CloseWatches)) | Ok(Err(_)) => return None,
                    }
                }
            },
        );
        stream_response(replayed.chain(live).boxed())
    }
}

fn take_fault(st: &mut State, verb: &str, plural: &str) -> Option<FaultResponse> {
    let i = st
        .faults
        .iter()
        .position(|f| f.verb == verb && f.plural == plural)?;
    let response = st.faults[i].response.clone();
    if let Some(times) = &mut st.faults[i].times {
        *times -= 1;
        if *times == 0 {
            st.faults.remove(i);
        }
    }
    Some(response)
}
