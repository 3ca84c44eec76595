//! One pod on the node: a task that owns its sandbox, volumes and containers and drives them
//! towards the pod's spec, as the kubelet's pod worker does: sandbox (network) first, then
//! init containers one by one to completion, then the containers; restarts by the restart
//! policy with the kubelet's back-off (immediately, then 10 s doubling to 5 min); on
//! deletion SIGTERM, SIGKILL after the grace period, CNI DEL, and the Pod's final delete.

use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, Patch, PatchParams, Preconditions};
use serde_json::Value;
use tokio::sync::{mpsc, watch};

use super::Node;
use super::cni::Attachment;
use super::containers::{Runtime, State, Terminated};
use super::events::Kind;
use super::probe::{ProbeKind, ProbeUpdate};
use super::state::{PodRecord, ProcessRecord};
use super::status;
use super::volumes::PodVolumes;

mod sandbox;
mod start;

/// What a pod's task hears besides spec changes.
#[derive(Debug)]
pub enum Message {
    Exited {
        container: usize,
        generation: u64,
        status: Option<std::process::ExitStatus>,
    },
    Probe(ProbeUpdate),
}

/// The pod's network sandbox.
struct Sandbox {
    id: String,
    /// The network namespace's name (None: hostNetwork).
    netns: Option<String>,
    ips: Vec<IpAddr>,
    attachment: Option<Attachment>,
}

/// The kubelet's crash-loop back-off: 10 s doubling up to 5 min ("Container restarts").
const BACKOFF_INITIAL: Duration = Duration::from_secs(10);
const BACKOFF_MAX: Duration = Duration::from_secs(300);
/// A container that ran this long starts its back-off afresh.
const BACKOFF_RESET: Duration = Duration::from_secs(600);

pub struct Worker {
    node: Arc<Node>,
    pub uid: String,
    pod: Arc<Pod>,
    updates: watch::Receiver<Arc<Pod>>,
    /// Deleted from the API (or found only on disk): stop and clean up at once.
    gone: bool,
    shutdown: watch::Receiver<bool>,
    shutting_down: bool,
    tx: mpsc::Sender<Message>,
    rx: mpsc::Receiver<Message>,
    dir: PathBuf,
    record: PodRecord,
    sandbox: Option<Sandbox>,
    /// The pod's IPs, kept after the sandbox is torn down (a finished pod keeps its status).
    pod_ips: Vec<IpAddr>,
    retry_at: Option<Instant>,
    retry_backoff: Duration,
    volumes: PodVolumes,
    volumes_ready: bool,
    /// Init containers first, then the containers.
    all: Vec<Runtime>,
    n_init: usize,
    start_time: Option<jiff::Timestamp>,
    last_status: Option<Value>,
    status_retry_at: Option<Instant>,
    terminating: bool,
    /// The API already says the pod finished (Succeeded or Failed) when this task started:
    /// nothing runs again and its status stays as it is, as the kubelet treats such pods.
    finished_in_api: bool,
}

fn name_of(pod: &Pod) -> String {
    format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or_default(),
        pod.metadata.name.as_deref().unwrap_or_default()
    )
}

impl Worker {
    pub fn new(
        node: Arc<Node>,
        updates: watch::Receiver<Arc<Pod>>,
        shutdown: watch::Receiver<bool>,
        gone: bool,
    ) -> Worker {
        let pod = updates.borrow().clone();
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let spec = pod.spec.clone().unwrap_or_default();
        let mut all: Vec<Runtime> = spec
            .init_containers
            .unwrap_or_default()
            .into_iter()
            .map(|c| Runtime::new(c, true))
            .collect();
        let n_init = all.len();
        all.extend(spec.containers.into_iter().map(|c| Runtime::new(c, false)));
        let dir = super::state::pods_dir(&node.fs.root).join(&uid);
        let (tx, rx) = mpsc::channel(64);
        let finished_in_api = pod
            .status
            .as_ref()
            .and_then(|s| s.phase.as_deref())
            .is_some_and(status::terminal);
        let start_time = pod
            .status
            .as_ref()
            .and_then(|s| s.start_time.as_ref())
            .map(|t| t.0)
            .or_else(|| Some(jiff::Timestamp::now()));
        Worker {
            volumes: PodVolumes::new(dir.join("volumes")),
            record: PodRecord {
                namespace: pod.metadata.namespace.clone().unwrap_or_default(),
                name: pod.metadata.name.clone().unwrap_or_default(),
                uid: uid.clone(),
                ..Default::default()
            },
            node,
            uid,
            pod,
            updates,
            gone,
            shutdown,
            shutting_down: false,
            tx,
            rx,
            dir,
            sandbox: None,
            pod_ips: Vec::new(),
            retry_at: None,
            retry_backoff: Duration::from_secs(1),
            volumes_ready: false,
            all,
            n_init,
            start_time,
            last_status: None,
            status_retry_at: None,
            terminating: false,
            finished_in_api,
        }
    }

    fn host_network(&self) -> bool {
        self.pod
            .spec
            .as_ref()
            .and_then(|s| s.host_network)
            .unwrap_or(false)
    }

    fn grace(&self) -> Duration {
        let seconds = self
            .pod
            .metadata
            .deletion_grace_period_seconds
            .or(self
                .pod
                .spec
                .as_ref()
                .and_then(|s| s.termination_grace_period_seconds))
            .unwrap_or(30);
        Duration::from_secs(seconds.max(0) as u64)
    }

    async fn event(&self, container: Option<&str>, kind: Kind, reason: &str, message: &str) {
        self.node
            .recorder
            .record(&self.pod, container, kind, reason, message)
            .await;
    }

    /// Runs the pod until it is gone, deleted, or the node shuts down.
    pub async fn run(mut self) {
        self.restore();
        loop {
            if self.step().await {
                break;
            }
            self.publish().await;
            let wake = self.next_wakeup();
            tokio::select! {
                changed = self.updates.changed(), if !self.gone => match changed {
                    Ok(()) => self.pod = self.updates.borrow_and_update().clone(),
                    Err(_) => self.gone = true,
                },
                Some(message) = self.rx.recv() => self.handle(message).await,
                changed = self.shutdown.changed(), if !self.shutting_down => {
                    if changed.is_err() || *self.shutdown.borrow() {
                        self.shutting_down = true;
                    }
                }
                () = tokio::time::sleep_until(wake.into()) => {}
            }
        }
        self.node.recorder.forget(&self.uid);
    }

    /// One round of driving the pod towards its spec; true when the pod's task is done.
    async fn step(&mut self) -> bool {
        self.kill_overdue();
        if self.gone {
            self.stop_all(Duration::ZERO);
            if let Err(e) = self.teardown_sandbox().await {
                tracing::warn!("{}: {e:#}", name_of(&self.pod));
            }
            self.forget_locally();
            return true;
        }
        if self.shutting_down {
            // A node shutdown: containers stop, sandboxes go, the Pod objects stay.
            if !self.stop_all(self.grace().min(Duration::from_secs(30))) {
                return false;
            }
            if let Err(e) = self.teardown_sandbox().await {
                tracing::warn!("{}: {e:#}", name_of(&self.pod));
            }
            self.forget_locally();
            return true;
        }
        if self.pod.metadata.deletion_timestamp.is_some() {
            return self.terminate().await;
        }
        let phase = status::phase(
            &self.pod,
            &self.all[..self.n_init],
            &self.all[self.n_init..],
        );
        if self.finished_in_api || status::terminal(phase) {
            if self.sandbox.is_some()
                && let Err(e) = self.teardown_sandbox().await
            {
                tracing::warn!("{}: {e:#}", name_of(&self.pod));
            }
            return false;
        }
        if let Some(at) = self.retry_at {
            if Instant::now() < at {
                return false;
            }
            self.retry_at = None;
        }
        let refresh = self
            .volumes
            .refresh_due()
            .is_some_and(|t| Instant::now() >= t);
        if !self.volumes_ready || refresh {
            match self.materialize_volumes().await {
                Ok(()) => self.volumes_ready = true,
                // A refresh that failed (the API server restarting, say): the containers keep
                // the files they have, the next resync tries again.
                Err(e) if self.volumes_ready => {
                    tracing::warn!("{}: refreshing volumes: {e:#}", name_of(&self.pod));
                }
                Err(e) => {
                    self.event(None, Kind::Warning, "FailedMount", &format!("{e:#}"))
                        .await;
                    self.retry_later();
                    return false;
                }
            }
        }
        if self.sandbox.is_none() && !self.create_sandbox().await {
            return false;
        }
        self.run_containers().await;
        false
    }

    fn retry_later(&mut self) {
        self.retry_at = Some(Instant::now() + self.retry_backoff);
        self.retry_backoff = (self.retry_backoff * 2).min(Duration::from_secs(30));
    }

    async fn materialize_volumes(&mut self) -> anyhow::Result<()> {
        let host_ips = self.node.host_ips.clone();
        let pod_ips = self.pod_ips.clone();
        let ctx = super::volumes::VolumeContext {
            client: &self.node.client,
            fs: &self.node.fs,
            objects: &self.node.objects,
            fields: super::env::FieldContext {
                node_name: &self.node.id.name,
                host_ips: &host_ips,
                pod_ips: &pod_ips,
            },
        };
        self.volumes.materialize(&ctx, &self.pod).await
    }

    /// The pod is being deleted: stop, tear down, delete. True when done.
    async fn terminate(&mut self) -> bool {
        if !self.terminating {
            self.terminating = true;
            for c in &mut self.all {
                c.next_start = None;
            }
        }
        if !self.stop_all(self.grace()) {
            return false;
        }
        if let Err(e) = self.teardown_sandbox().await {
            self.event(
                None,
                Kind::Warning,
                "FailedKillPod",
                &format!("error killing pod: {e:#}"),
            )
            .await;
            self.retry_later();
            return false;
        }
        self.publish().await;
        let pods: Api<Pod> = Api::namespaced(self.node.client.clone(), &self.record.namespace);
        let params = DeleteParams {
            grace_period_seconds: Some(0),
            preconditions: Some(Preconditions {
                uid: Some(self.uid.clone()),
                resource_version: None,
            }),
            ..Default::default()
        };
        match pods.delete(&self.record.name, &params).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => {}
            Err(e) => {
                tracing::warn!("{}: deleting: {e}", name_of(&self.pod));
                self.retry_later();
                return false;
            }
        }
        self.forget_locally();
        true
    }

    /// Removes the pod's files on the node (record, volumes, container layers).
    fn forget_locally(&mut self) {
        self.volumes.remove();
        let _ = std::fs::remove_dir_all(&self.dir);
    }

    /// SIGTERM to every running container (stood-in ones end at once), SIGKILL after
    /// `grace`; true once none runs.
    fn stop_all(&mut self, grace: Duration) -> bool {
        let now = Instant::now();
        let mut running = false;
        for c in &mut self.all {
            c.next_start = None;
            if !c.running() {
                continue;
            }
            if c.pid().is_none() {
                // Nothing runs for a stood-in container: it ends as if it exited at once.
                let started = match c.state {
                    State::Running { started_at, .. } => Some(started_at),
                    _ => None,
                };
                c.stop_probes();
                c.ready = false;
                c.state = State::Terminated(Terminated {
                    exit_code: 0,
                    signal: None,
                    reason: "Completed".into(),
                    message: None,
                    started_at: started,
                    finished_at: jiff::Timestamp::now(),
                    container_id: c.container_id.clone(),
                });
                continue;
            }
            running = true;
            if c.kill_at.is_none() {
                c.stop_probes();
                c.signal(if grace.is_zero() {
                    libc::SIGKILL
                } else {
                    libc::SIGTERM
                });
                c.kill_at = Some(now + grace);
            }
        }
        !running
    }

    fn kill_overdue(&mut self) {
        let now = Instant::now();
        for c in &mut self.all {
            if c.running() && c.kill_at.is_some_and(|t| now >= t) {
                c.signal(libc::SIGKILL);
                c.kill_at = Some(now + Duration::from_secs(3600));
            }
        }
    }

    /// Starts whatever should run now: the next init container, or the containers.
    async fn run_containers(&mut self) {
        let now = Instant::now();
        for i in 0..self.n_init {
            let c = &self.all[i];
            if c.succeeded() {
                continue;
            }
            if matches!(c.state, State::Waiting { .. }) && c.next_start.is_none_or(|t| now >= t) {
                self.start(i).await;
            }
            return;
        }
        for i in self.n_init..self.all.len() {
            let c = &self.all[i];
            if matches!(c.state, State::Waiting { .. }) && c.next_start.is_none_or(|t| now >= t) {
                self.start(i).await;
            }
        }
    }

    async fn handle(&mut self, message: Message) {
        match message {
            Message::Exited {
                container,
                generation,
                status,
            } => {
                let Some(c) = self.all.get(container) else {
                    return;
                };
                if c.generation != generation {
                    return;
                }
                let (code, signal) = match status {
                    Some(s) => {
                        use std::os::unix::process::ExitStatusExt;
                        match (s.code(), s.signal()) {
                            (Some(code), _) => (code, None),
                            (None, Some(sig)) => (128 + sig, Some(sig)),
                            _ => (255, None),
                        }
                    }
                    None => (255, None),
                };
                let started_at = match c.state {
                    State::Running { started_at, .. } => Some(started_at),
                    _ => None,
                };
                let t = Terminated {
                    exit_code: code,
                    signal,
                    reason: if code == 0 { "Completed" } else { "Error" }.into(),
                    message: None,
                    started_at,
                    finished_at: jiff::Timestamp::now(),
                    container_id: c.container_id.clone(),
                };
                self.record.processes.retain(|p| p.container != c.spec.name);
                self.record.save(&self.dir);
                self.exited(container, t).await;
            }
            Message::Probe(u) => self.probe_result(u).await,
        }
    }

    /// A container ended: restart it (with back-off) if the policy says so.
    async fn exited(&mut self, i: usize, t: Terminated) {
        let policy = status::restart_policy(&self.pod).to_string();
        let pod_desc = format!(
            "{}_{}({})",
            self.record.name, self.record.namespace, self.uid
        );
        let terminating = self.terminating || self.shutting_down || self.gone;
        let c = &mut self.all[i];
        c.stop_probes();
        c.ready = false;
        c.started = false;
        c.kill_at = None;
        let failed = t.exit_code != 0;
        let restart = !terminating
            && match policy.as_str() {
                "Always" if !c.init => true,
                "Always" | "OnFailure" => failed,
                _ => false,
            };
        if !restart {
            if c.init && !failed {
                c.ready = true;
            }
            c.state = State::Terminated(t);
            return;
        }
        let ran = t
            .started_at
            .map(|s| (t.finished_at.as_second() - s.as_second()).max(0) as u64)
            .unwrap_or(0);
        let delay = match c.backoff {
            Some(_) if ran >= BACKOFF_RESET.as_secs() => Duration::ZERO,
            None => Duration::ZERO,
            Some(d) => d,
        };
        c.backoff = Some(if delay.is_zero() {
            BACKOFF_INITIAL
        } else {
            (delay * 2).min(BACKOFF_MAX)
        });
        c.last = Some(t);
        c.next_start = Some(Instant::now() + delay);
        let name = c.spec.name.clone();
        if delay.is_zero() {
            c.state = State::Waiting {
                reason: "ContainerCreating".into(),
                message: None,
            };
        } else {
            c.state = State::Waiting {
                reason: "CrashLoopBackOff".into(),
                message: Some(format!(
                    "back-off {}s restarting failed container={name} pod={pod_desc}",
                    delay.as_secs()
                )),
            };
            self.event(
                Some(&name),
                Kind::Warning,
                "BackOff",
                &format!("Back-off restarting failed container {name} in pod {pod_desc}"),
            )
            .await;
        }
    }

    async fn probe_result(&mut self, u: ProbeUpdate) {
        let grace = self.grace();
        let Some(c) = self.all.get_mut(u.container) else {
            return;
        };
        if c.generation != u.generation || !c.running() {
            return;
        }
        match (u.kind, u.success) {
            (ProbeKind::Readiness, ok) => c.ready = ok,
            (ProbeKind::Startup, true) => {
                c.started = true;
                self.start_probes(u.container, false);
            }
            (kind, _) => {
                let which = if kind == ProbeKind::Startup {
                    "startup"
                } else {
                    "liveness"
                };
                let name = c.spec.name.clone();
                let message = format!("Container {name} failed {which} probe, will be restarted");
                c.signal(libc::SIGTERM);
                c.kill_at = Some(Instant::now() + grace);
                self.event(Some(&name), Kind::Normal, "Killing", &message)
                    .await;
            }
        }
    }

    fn next_wakeup(&self) -> Instant {
        let mut wake = Instant::now() + Duration::from_secs(60);
        let candidates = self
            .all
            .iter()
            .flat_map(|c| [c.next_start, c.kill_at])
            .chain([
                self.retry_at,
                self.status_retry_at,
                self.volumes.refresh_due(),
            ]);
        for t in candidates.flatten() {
            wake = wake.min(t);
        }
        wake
    }

    /// Patches the pod's status when it changed (not for a pod that is gone or on a node
    /// that shuts down: those leave the object as it is).
    async fn publish(&mut self) {
        if self.gone || self.shutting_down || self.finished_in_api {
            return;
        }
        if self.status_retry_at.is_some_and(|t| Instant::now() < t) {
            return;
        }
        let patch = status::patch(&status::Snapshot {
            pod: &self.pod,
            host_ips: &self.node.host_ips,
            pod_ips: &self.pod_ips,
            sandbox_ready: self.sandbox.is_some(),
            start_time: self.start_time,
            init: &self.all[..self.n_init],
            containers: &self.all[self.n_init..],
        });
        if self.last_status.as_ref() == Some(&patch) {
            return;
        }
        let pods: Api<Pod> = Api::namespaced(self.node.client.clone(), &self.record.namespace);
        let _slot = self.node.status_slots.acquire().await;
        match pods
            .patch_status(
                &self.record.name,
                &PatchParams::default(),
                &Patch::Strategic(&patch),
            )
            .await
        {
            Ok(_) => {
                self.last_status = Some(patch);
                self.status_retry_at = None;
            }
            Err(kube::Error::Api(e)) if e.code == 404 => self.last_status = Some(patch),
            Err(e) => {
                tracing::warn!("{}: status: {e}", name_of(&self.pod));
                self.status_retry_at = Some(Instant::now() + Duration::from_secs(1));
            }
        }
    }

    pub(super) fn note_process(&mut self, name: &str, pid: u32, restarts: i32) {
        if let Some(start_ticks) = super::containers::start_ticks(pid) {
            self.record.processes.retain(|p| p.container != name);
            self.record.processes.push(ProcessRecord {
                container: name.to_string(),
                pid,
                start_ticks,
            });
        }
        self.record.restarts.insert(name.to_string(), restarts);
        self.record.save(&self.dir);
    }
}
