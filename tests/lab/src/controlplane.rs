//! The upstream control plane: etcd, kube-apiserver, kube-controller-manager and
//! kube-scheduler, each one process with its flags (the same on every restart) and a log.

use std::ffi::OsString;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::paths::tool;
use crate::pki::ControlPlaneCerts;
use crate::process::{Spawner, Supervised};

/// The lab's API server port on the bridge address.
pub const API_PORT: u16 = 6443;
/// The Service range (TEST-NET-3). No kube-proxy runs: ClusterIPs are allocated, not routed.
pub const SERVICE_RANGE: &str = "203.0.113.0/24";
/// The first address of the Service range: the `kubernetes` Service's ClusterIP.
pub const KUBERNETES_SERVICE_IP: Ipv4Addr = Ipv4Addr::new(203, 0, 113, 1);
/// The service-account token issuer (and default audience), as kubeadm sets it.
pub const ISSUER: &str = "https://kubernetes.default.svc.cluster.local";

/// A control-plane component.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Component {
    Etcd,
    KubeApiserver,
    KubeControllerManager,
    KubeScheduler,
}

impl Component {
    pub const ALL: [Component; 4] = [
        Component::Etcd,
        Component::KubeApiserver,
        Component::KubeControllerManager,
        Component::KubeScheduler,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Component::Etcd => "etcd",
            Component::KubeApiserver => "kube-apiserver",
            Component::KubeControllerManager => "kube-controller-manager",
            Component::KubeScheduler => "kube-scheduler",
        }
    }
}

impl Component {
    /// How long a stop waits after SIGTERM before SIGKILL. kube-apiserver drains its open
    /// watch streams before it exits, which takes as long as its clients keep them (the
    /// stand-ins and controllers do); five seconds shuts down its storage and Endpoints lease
    /// cleanly, which is what a restart needs.
    pub fn stop_grace(self) -> Duration {
        match self {
            Component::KubeApiserver => Duration::from_secs(5),
            _ => Duration::from_secs(15),
        }
    }
}

impl fmt::Display for Component {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Component {
    type Err = anyhow::Error;

    fn from_str(s: &str) -> Result<Component> {
        Component::ALL
            .into_iter()
            .find(|c| c.name() == s)
            .with_context(|| {
                format!(
                    "unknown component {s:?}: one of etcd, kube-apiserver, \
                     kube-controller-manager, kube-scheduler"
                )
            })
    }
}

/// Files and ports the components share.
#[derive(Debug, Clone)]
pub struct Layout {
    pub tools: PathBuf,
    /// Where the API server listens.
    pub api_bind: IpAddr,
    pub api_port: u16,
    /// What the API server writes into the `default/kubernetes` Endpoints: never loopback,
    /// which Endpoints refuse.
    pub advertise_address: IpAddr,
    /// The admission plugins that call webhooks (on by default, as upstream's).
    pub admission_webhooks: bool,
    /// Where the components are forked from (the calling thread when `None`).
    pub spawner: Option<Spawner>,
    pub logs: PathBuf,
    pub etcd_data: PathBuf,
    pub etcd_client_port: u16,
    pub etcd_peer_port: u16,
    pub controller_manager_port: u16,
    pub scheduler_port: u16,
    pub ca_cert: PathBuf,
    pub ca_key: PathBuf,
    pub apiserver_cert: PathBuf,
    pub apiserver_key: PathBuf,
    pub sa_private: PathBuf,
    pub sa_public: PathBuf,
    pub front_proxy_cert: PathBuf,
    pub front_proxy_key: PathBuf,
    pub kubelet_client_cert: PathBuf,
    pub kubelet_client_key: PathBuf,
    /// Where kube-controller-manager keeps FlexVolume plugins (it creates the directory: kept
    /// in the lab's, not the machine's `/usr/libexec/kubernetes`).
    pub flex_volume_dir: PathBuf,
    pub controller_manager_kubeconfig: PathBuf,
    pub scheduler_kubeconfig: PathBuf,
    pub node_monitor_grace: Duration,
}

impl Layout {
    /// The layout of a control plane whose files live under `dir` (`logs/`, `etcd/`), with
    /// certificates `certs` and free ports for everything but the API server's.
    pub fn new(
        tools: &Path,
        dir: &Path,
        certs: &ControlPlaneCerts,
        (api_bind, api_port, advertise_address): (IpAddr, u16, IpAddr),
        node_monitor_grace: Duration,
    ) -> Result<Layout> {
        Ok(Layout {
            tools: tools.to_path_buf(),
            api_bind,
            api_port,
            advertise_address,
            admission_webhooks: true,
            spawner: None,
            logs: dir.join("logs"),
            etcd_data: dir.join("etcd"),
            etcd_client_port: free_port()?,
            etcd_peer_port: free_port()?,
            controller_manager_port: free_port()?,
            scheduler_port: free_port()?,
            ca_cert: certs.pki.ca_cert.clone(),
            ca_key: certs.ca_key.clone(),
            apiserver_cert: certs.serving.cert.clone(),
            apiserver_key: certs.serving.key.clone(),
            sa_private: certs.sa_private.clone(),
            sa_public: certs.sa_public.clone(),
            front_proxy_cert: certs.front_proxy.cert.clone(),
            front_proxy_key: certs.front_proxy.key.clone(),
            kubelet_client_cert: certs.kubelet_client.cert.clone(),
            kubelet_client_key: certs.kubelet_client.key.clone(),
            flex_volume_dir: dir.join("flexvolume"),
            controller_manager_kubeconfig: certs.controller_manager_kubeconfig.clone(),
            scheduler_kubeconfig: certs.scheduler_kubeconfig.clone(),
            node_monitor_grace,
        })
    }

    /// Writes the audit policy the API server's flags name (into `logs`, created).
    pub fn write_audit_policy(&self) -> Result<()> {
        std::fs::create_dir_all(&self.logs)
            .with_context(|| format!("creating {}", self.logs.display()))?;
        let path = crate::audit::policy_path(&self.logs);
        std::fs::write(&path, crate::audit::POLICY)
            .with_context(|| format!("writing {}", path.display()))
    }
}

/// A free TCP port on 127.0.0.1 for a component to listen on. Chosen below the kernel's
/// ephemeral range (ip_local_port_range): a port the kernel picked for `bind(0)` and released
/// can go to any outgoing connection before the component binds it.
pub fn free_port() -> Result<u16> {
    let low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    if low > 11000 {
        let span = (low - 10000) as u32;
        let seed = std::process::id()
            ^ std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.subsec_nanos())
                .unwrap_or(0);
        for i in 0..span {
            let port =
                10000 + ((seed.wrapping_mul(2654435761).wrapping_add(i * 7919)) % span) as u16;
            if TcpListener::bind(("127.0.0.1", port)).is_ok() {
                return Ok(port);
            }
        }
    }
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// Waits until `port` on 127.0.0.1 accepts connections (the component serves), failing with
/// its log when it exits first.
pub async fn wait_listening(port: u16, proc: &mut Supervised, timeout: Duration) -> Result<()> {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if let Some(status) = proc.try_exit() {
            bail!(
                "{} exited ({status}) while starting; its log ({}):\n{}",
                proc.name,
                proc.log.display(),
                proc.log_tail(20)
            );
        }
        if tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_ok()
        {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    bail!(
        "{} did not listen on 127.0.0.1:{port} within {timeout:?}; its log ({}):\n{}",
        proc.name,
        proc.log.display(),
        proc.log_tail(20)
    )
}

fn args(list: &[String]) -> Vec<OsString> {
    list.iter().map(OsString::from).collect()
}

fn p(path: &Path) -> String {
    path.display().to_string()
}

impl Layout {
    pub fn etcd_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.etcd_client_port)
    }

    /// The API server's URL.
    pub fn server_url(&self) -> String {
        format!("https://{}", SocketAddr::new(self.api_bind, self.api_port))
    }

    /// The process of `component`, not started.
    pub fn process(&self, component: Component) -> Result<Supervised> {
        let log = self.logs.join(format!("{component}.log"));
        let program = tool(&self.tools, component.name())?;
        let flags = match component {
            Component::Etcd => {
                let peer = format!("http://127.0.0.1:{}", self.etcd_peer_port);
                vec![
                    "--name=lab".to_string(),
                    format!("--data-dir={}", p(&self.etcd_data)),
                    format!("--listen-client-urls={}", self.etcd_url()),
                    format!("--advertise-client-urls={}", self.etcd_url()),
                    format!("--listen-peer-urls={peer}"),
                    format!("--initial-advertise-peer-urls={peer}"),
                    format!("--initial-cluster=lab={peer}"),
                    // A lab's data need not survive a power loss; fsync dominates write
                    // latency on a busy disk.
                    "--unsafe-no-fsync".to_string(),
                    // One member: a short election timeout makes it leader at once.
                    "--heartbeat-interval=50".to_string(),
                    "--election-timeout=500".to_string(),
                    "--log-level=warn".to_string(),
                ]
            }
            Component::KubeApiserver => vec![
                format!("--etcd-servers={}", self.etcd_url()),
                format!("--bind-address={}", self.api_bind),
                format!("--secure-port={}", self.api_port),
                // Written into the default/kubernetes Endpoints: must not be loopback.
                format!("--advertise-address={}", self.advertise_address),
                format!("--tls-cert-file={}", p(&self.apiserver_cert)),
                format!("--tls-private-key-file={}", p(&self.apiserver_key)),
                format!("--client-ca-file={}", p(&self.ca_cert)),
                "--authorization-mode=Node,RBAC".to_string(),
                // As kubeadm: nodes may only change their own Node and their pods' status.
                "--enable-admission-plugins=NodeRestriction".to_string(),
                format!("--service-cluster-ip-range={SERVICE_RANGE}"),
                format!("--service-account-issuer={ISSUER}"),
                format!("--service-account-key-file={}", p(&self.sa_public)),
                format!("--service-account-signing-key-file={}", p(&self.sa_private)),
                "--allow-privileged=true".to_string(),
                // No kube-proxy: a webhook's or aggregated API's Service is dialled at an
                // endpoint address instead of its ClusterIP.
                "--enable-aggregator-routing=true".to_string(),
                // The aggregation layer's front proxy, as kubeadm configures it: without it,
                // the controller-manager's and scheduler's delegated authentication finds no
                // request-header CA.
                format!("--requestheader-client-ca-file={}", p(&self.ca_cert)),
                "--requestheader-allowed-names=front-proxy-client".to_string(),
                "--requestheader-username-headers=X-Remote-User".to_string(),
                "--requestheader-group-headers=X-Remote-Group".to_string(),
                "--requestheader-extra-headers-prefix=X-Remote-Extra-".to_string(),
                format!("--proxy-client-cert-file={}", p(&self.front_proxy_cert)),
                format!("--proxy-client-key-file={}", p(&self.front_proxy_key)),
                // Kubelets (logs, exec) at the address a Node reports and this machine routes.
                format!(
                    "--kubelet-client-certificate={}",
                    p(&self.kubelet_client_cert)
                ),
                format!("--kubelet-client-key={}", p(&self.kubelet_client_key)),
                "--kubelet-preferred-address-types=InternalIP".to_string(),
                "--profiling=false".to_string(),
                // Who asked for what and what was answered, without bodies: tests read the
                // refusals of the accounts they care about (crate::audit).
                format!(
                    "--audit-policy-file={}",
                    p(&crate::audit::policy_path(&self.logs))
                ),
                format!(
                    "--audit-log-path={}",
                    p(&crate::audit::log_path(&self.logs))
                ),
                "--audit-log-maxsize=200".to_string(),
                "--audit-log-maxbackup=1".to_string(),
            ]
            .into_iter()
            .chain((!self.admission_webhooks).then(|| {
                "--disable-admission-plugins=MutatingAdmissionWebhook,\
                 ValidatingAdmissionWebhook"
                    .to_string()
            }))
            .collect(),
            Component::KubeControllerManager => {
                let kc = p(&self.controller_manager_kubeconfig);
                vec![
                    format!("--kubeconfig={kc}"),
                    format!("--authentication-kubeconfig={kc}"),
                    format!("--authorization-kubeconfig={kc}"),
                    "--bind-address=127.0.0.1".to_string(),
                    format!("--secure-port={}", self.controller_manager_port),
                    // Published in every namespace as kube-root-ca.crt.
                    format!("--root-ca-file={}", p(&self.ca_cert)),
                    format!("--service-account-private-key-file={}", p(&self.sa_private)),
                    // Each controller acts as its own ServiceAccount, so RBAC applies to it as
                    // upstream intends.
                    "--use-service-account-credentials=true".to_string(),
                    format!("--cluster-signing-cert-file={}", p(&self.ca_cert)),
                    format!("--cluster-signing-key-file={}", p(&self.ca_key)),
                    // One instance: no leader election to wait for.
                    "--leader-elect=false".to_string(),
                    format!(
                        "--node-monitor-grace-period={}s",
                        self.node_monitor_grace.as_secs()
                    ),
                    "--node-monitor-period=2s".to_string(),
                    format!("--flex-volume-plugin-dir={}", p(&self.flex_volume_dir)),
                ]
            }
            Component::KubeScheduler => {
                let kc = p(&self.scheduler_kubeconfig);
                vec![
                    format!("--kubeconfig={kc}"),
                    format!("--authentication-kubeconfig={kc}"),
                    format!("--authorization-kubeconfig={kc}"),
                    "--bind-address=127.0.0.1".to_string(),
                    format!("--secure-port={}", self.scheduler_port),
                    "--leader-elect=false".to_string(),
                ]
            }
        };
        let process = Supervised::new(component.name(), &program, args(&flags), log);
        Ok(match &self.spawner {
            Some(spawner) => process.spawned_by(spawner),
            None => process,
        })
    }

    /// Starts `component` and waits until it serves (etcd, the API server, with the admin
    /// kubeconfig `admin`) or listens (the others). A component that does not is killed.
    pub async fn start(&self, component: Component, admin: &Path) -> Result<Supervised> {
        let mut proc = self.process(component)?;
        proc.start()?;
        match component {
            Component::Etcd => wait_etcd(self, &mut proc, Duration::from_secs(30)).await,
            Component::KubeApiserver => {
                let client = crate::kube_client(admin).await?;
                wait_apiserver(&client, &mut proc, Duration::from_secs(90)).await
            }
            Component::KubeControllerManager => {
                let port = self.controller_manager_port;
                wait_listening(port, &mut proc, Duration::from_secs(60)).await
            }
            Component::KubeScheduler => {
                wait_listening(self.scheduler_port, &mut proc, Duration::from_secs(60)).await
            }
        }
        .inspect_err(|_| proc.kill())?;
        Ok(proc)
    }
}

/// Waits until etcd answers `/health` with `"health":"true"`.
pub async fn wait_etcd(layout: &Layout, proc: &mut Supervised, timeout: Duration) -> Result<()> {
    let addr = SocketAddr::from(([127, 0, 0, 1], layout.etcd_client_port));
    let deadline = Instant::now() + timeout;
    let mut last = String::new();
    while Instant::now() < deadline {
        if let Some(status) = proc.try_exit() {
            bail!(
                "etcd exited ({status}) while starting; its log ({}):\n{}",
                proc.log.display(),
                proc.log_tail(20)
            );
        }
        match crate::http::get(addr, "127.0.0.1", "/health", &[], Duration::from_secs(2)).await {
            Ok(r) if r.status == 200 && r.body.contains("\"health\":\"true\"") => return Ok(()),
            Ok(r) => last = format!("{} {}", r.status, r.body.trim()),
            Err(e) => last = format!("{e:#}"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    bail!(
        "etcd did not become healthy within {timeout:?} (last answer: {last}); its log ({}):\n{}",
        proc.log.display(),
        proc.log_tail(20)
    )
}

/// Waits until the API server answers `/readyz` with 200 to `client`.
pub async fn wait_apiserver(
    client: &kube::Client,
    proc: &mut Supervised,
    timeout: Duration,
) -> Result<()> {
    let deadline = Instant::now() + timeout;
    let mut last = String::new();
    while Instant::now() < deadline {
        if let Some(status) = proc.try_exit() {
            bail!(
                "kube-apiserver exited ({status}) while starting; its log ({}):\n{}",
                proc.log.display(),
                proc.log_tail(30)
            );
        }
        let req = http::Request::get("/readyz").body(Vec::new())?;
        match client.request_text(req).await {
            Ok(body) if body.trim() == "ok" => return Ok(()),
            Ok(body) => last = body,
            Err(e) => last = format!("{e}"),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    bail!(
        "kube-apiserver was not ready within {timeout:?} (last /readyz: {last}); its log ({}):\n{}",
        proc.log.display(),
        proc.log_tail(30)
    )
}
