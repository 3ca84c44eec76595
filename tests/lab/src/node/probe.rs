//! Container probes, as the kubelet runs them ("Configure Liveness, Readiness and Startup
//! Probes"): after `initialDelaySeconds`, every `periodSeconds`, each attempt bounded by
//! `timeoutSeconds`; the result changes after `successThreshold` successes or
//! `failureThreshold` failures in a row. `httpGet` (2xx and 3xx succeed) and `tcpSocket` are
//! dialled from the node's network namespace, as the kubelet dials them; `exec` runs in the
//! container's namespaces and root. gRPC and HTTPS probes are not supported: they fail, saying
//! so, rather than pass unchecked.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ContainerPort, Pod, Probe};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use tokio::sync::mpsc;

use super::events::{Kind, Recorder};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProbeKind {
    Startup,
    Liveness,
    Readiness,
}

impl ProbeKind {
    fn name(self) -> &'static str {
        match self {
            ProbeKind::Startup => "Startup",
            ProbeKind::Liveness => "Liveness",
            ProbeKind::Readiness => "Readiness",
        }
    }

    /// The result before the first attempt: a container is not ready and not started until
    /// its probes say so, and alive until its liveness probe says otherwise.
    fn initial(self) -> bool {
        self == ProbeKind::Liveness
    }
}

/// A probe's result changed.
#[derive(Debug, Clone)]
pub struct ProbeUpdate {
    pub container: usize,
    pub generation: u64,
    pub kind: ProbeKind,
    pub success: bool,
}

/// What a probe attempt needs to know about its container.
#[derive(Clone)]
pub struct Target {
    pub pod: Arc<Pod>,
    pub container_name: String,
    pub container: usize,
    pub generation: u64,
    /// The pod's IP (the node's for hostNetwork pods).
    pub pod_ip: Option<IpAddr>,
    pub ports: Vec<ContainerPort>,
    /// The container's process, its user and group, its environment (exec probes).
    pub pid: u32,
    pub uid: u32,
    pub gid: u32,
    pub cwd: String,
    pub env: Vec<(String, String)>,
    pub helper: PathBuf,
}

/// Runs `probe` until the task is aborted, sending result changes to `updates` and recording
/// an `Unhealthy` event for each failed attempt.
pub async fn run(
    kind: ProbeKind,
    probe: Probe,
    target: Target,
    updates: mpsc::Sender<super::pod::Message>,
    recorder: Arc<Recorder>,
) {
    let secs =
        |v: Option<i32>, default: i32| Duration::from_secs(v.unwrap_or(default).max(0) as u64);
    let period = secs(probe.period_seconds, 10).max(Duration::from_secs(1));
    let timeout = secs(probe.timeout_seconds, 1).max(Duration::from_secs(1));
    let success_threshold = probe.success_threshold.unwrap_or(1).max(1);
    let failure_threshold = probe.failure_threshold.unwrap_or(3).max(1);
    tokio::time::sleep(secs(probe.initial_delay_seconds, 0)).await;
    let mut result = kind.initial();
    let (mut successes, mut failures) = (0, 0);
    loop {
        match attempt(&probe, &target, timeout).await {
            Ok(()) => {
                successes += 1;
                failures = 0;
                if !result && successes >= success_threshold {
                    result = true;
                    send(&updates, &target, kind, true).await;
                }
            }
            Err(message) => {
                failures += 1;
                successes = 0;
                recorder
                    .record(
                        &target.pod,
                        Some(&target.container_name),
                        Kind::Warning,
                        "Unhealthy",
                        &format!("{} probe failed: {message}", kind.name()),
                    )
                    .await;
                if (result || kind == ProbeKind::Startup) && failures >= failure_threshold {
                    result = false;
                    send(&updates, &target, kind, false).await;
                    if kind != ProbeKind::Readiness {
                        // The container is restarted; a new probe starts with it.
                        return;
                    }
                }
            }
        }
        if kind == ProbeKind::Startup && result {
            return;
        }
        tokio::time::sleep(period).await;
    }
}

async fn send(
    updates: &mpsc::Sender<super::pod::Message>,
    target: &Target,
    kind: ProbeKind,
    success: bool,
) {
    let _ = updates
        .send(super::pod::Message::Probe(ProbeUpdate {
            container: target.container,
            generation: target.generation,
            kind,
            success,
        }))
        .await;
}

fn port_of(port: &IntOrString, ports: &[ContainerPort]) -> Result<u16, String> {
    match port {
        IntOrString::Int(p) => u16::try_from(*p).map_err(|_| format!("invalid port {p}")),
        IntOrString::String(name) => ports
            .iter()
            .find(|p| p.name.as_deref() == Some(name))
            .and_then(|p| u16::try_from(p.container_port).ok())
            .ok_or_else(|| format!("no container port named {name:?}")),
    }
}

async fn attempt(probe: &Probe, t: &Target, timeout: Duration) -> Result<(), String> {
    if let Some(http) = &probe.http_get {
        if http
            .scheme
            .as_deref()
            .is_some_and(|s| s.eq_ignore_ascii_case("HTTPS"))
        {
            return Err("HTTPS probes are not supported by the lab's kubelet stand-in".into());
        }
        let port = port_of(&http.port, &t.ports)?;
        let host: IpAddr = match &http.host {
            Some(h) if !h.is_empty() => h.parse().map_err(|_| format!("host {h:?}: not an IP"))?,
            _ => t.pod_ip.ok_or("the pod has no IP yet")?,
        };
        let path = http.path.clone().unwrap_or_else(|| "/".into());
        let headers: Vec<(String, String)> = http
            .http_headers
            .iter()
            .flatten()
            .map(|h| (h.name.clone(), h.value.clone()))
            .collect();
        let addr = SocketAddr::new(host, port);
        let url = format!("http://{addr}{path}");
        return match crate::http::get(addr, &addr.to_string(), &path, &headers, timeout).await {
            Ok(r) if (200..400).contains(&r.status) => Ok(()),
            Ok(r) => Err(format!("HTTP probe failed with statuscode: {}", r.status)),
            Err(e) => Err(format!("Get {url:?}: {e:#}")),
        };
    }
    if let Some(tcp) = &probe.tcp_socket {
        let port = port_of(&tcp.port, &t.ports)?;
        let host: IpAddr = match &tcp.host {
            Some(h) if !h.is_empty() => h.parse().map_err(|_| format!("host {h:?}: not an IP"))?,
            _ => t.pod_ip.ok_or("the pod has no IP yet")?,
        };
        let addr = SocketAddr::new(host, port);
        return match tokio::time::timeout(timeout, tokio::net::TcpStream::connect(addr)).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(format!("dial tcp {addr}: {e}")),
            Err(_) => Err(format!("dial tcp {addr}: i/o timeout")),
        };
    }
    if let Some(exec) = &probe.exec {
        let argv = exec.command.clone().unwrap_or_default();
        let mut cmd = tokio::process::Command::new(&t.helper);
        cmd.arg("__exec")
            .arg(t.pid.to_string())
            .arg(t.uid.to_string())
            .arg(t.gid.to_string())
            .arg(&t.cwd)
            .arg("--")
            .args(&argv)
            .env_clear()
            .envs(t.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let out = match tokio::time::timeout(timeout, cmd.output()).await {
            Ok(Ok(out)) => out,
            Ok(Err(e)) => return Err(format!("starting the exec probe: {e}")),
            Err(_) => return Err(format!("command {argv:?} timed out")),
        };
        if out.status.success() {
            return Ok(());
        }
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        return Err(format!(
            "command {argv:?} exited with {}: {}",
            out.status.code().unwrap_or(-1),
            text.trim()
        ));
    }
    Err("gRPC probes are not supported by the lab's kubelet stand-in".into())
}
