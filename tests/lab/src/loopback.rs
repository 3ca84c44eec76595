//! A light real control plane for tests: upstream etcd and kube-apiserver on 127.0.0.1, with
//! free ports and a directory of their own, so that many test processes start one each at
//! once. No lock, no network namespace, no nodes, no root: what envtest (controller-runtime)
//! starts, with the lab's certificates, flags and audit log ([`crate::controlplane`],
//! [`crate::pki`]).
//!
//! Without a controller-manager nothing creates the `default` ServiceAccount that the
//! ServiceAccount admission plugin wants before it admits a pod: [`LoopbackControlPlane`]
//! creates it in `default`, and [`LoopbackControlPlane::create_namespace`] in every namespace
//! it creates. Without a kubelet, a pod bound to a node is deleted at once only with a grace
//! period of 0 ([`LoopbackControlPlane::delete`] deletes so, as `kubectl delete --force`).

mod objects;

use std::future::Future;
use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;

use crate::audit;
use crate::controlplane::{Component, Layout, free_port};
use crate::pki::{self, ControlPlaneCerts, Pki};
use crate::process::{Spawner, Supervised};

pub use objects::resource_path;

/// What kube-apiserver writes into the `default/kubernetes` Endpoints and EndpointSlice.
///
/// It must not be loopback: Endpoints refuse 127.0.0.0/8, and an API server advertising
/// 127.0.0.1 fails to write them every few seconds ("may not be in the loopback range"), so
/// the `kubernetes` Service would have no endpoints. envtest used to pass 127.0.0.1 anyway and
/// now lets the server pick the default route's address, which fails on a machine without
/// one. kube-apiserver only publishes this address (it listens on `--bind-address`), so an
/// address of TEST-NET-1 (RFC 5737), local or not, keeps the Service valid everywhere;
/// nothing here dials it (clients use the kubeconfig's 127.0.0.1).
pub const ADVERTISE_ADDRESS: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 1);

/// How to start a [`LoopbackControlPlane`].
#[derive(Clone, Debug)]
pub struct LoopbackOptions {
    /// The upstream binaries (see [`crate::paths::tools_dir`]).
    pub tools: PathBuf,
    /// The admission plugins that call webhooks. Off for a test whose binaries create webhook
    /// configurations the API server cannot reach: their Service would have to lead to a
    /// non-loopback address of this machine.
    pub admission_webhooks: bool,
    /// How long etcd and the API server may take to serve.
    pub ready_timeout: Duration,
    /// Keep the directory after teardown (for a failing test's logs).
    pub keep: bool,
}

impl Default for LoopbackOptions {
    fn default() -> LoopbackOptions {
        LoopbackOptions {
            tools: crate::paths::tools_dir(),
            admission_webhooks: true,
            ready_timeout: Duration::from_secs(90),
            keep: std::env::var_os("ALLOT_LAB_KEEP").is_some(),
        }
    }
}

/// etcd and kube-apiserver on 127.0.0.1, torn down (processes killed, directory removed) when
/// dropped. Its methods block, also when called from an async test (they then run on a thread
/// of their own, blocking the caller's).
pub struct LoopbackControlPlane {
    dir: PathBuf,
    keep: bool,
    layout: Layout,
    pki: Pki,
    kubeconfig: PathBuf,
    processes: Vec<Supervised>,
    runtime: Option<tokio::runtime::Runtime>,
    client: kube::Client,
}

/// Runs `work` here, or on a thread of its own when this thread is a runtime's (whose
/// `block_on` would panic).
fn off_runtime<T: Send>(work: impl FnOnce() -> T + Send) -> T {
    if tokio::runtime::Handle::try_current().is_err() {
        return work();
    }
    std::thread::scope(|s| match s.spawn(work).join() {
        Ok(t) => t,
        Err(panic) => std::panic::resume_unwind(panic),
    })
}

impl LoopbackControlPlane {
    /// Starts one for test `test`, printing how long it took; None (after saying why) when
    /// `ALLOT_LAB_SKIP` is set. Missing tools fail the test: they are not reasons to skip.
    pub fn for_test(test: &str, options: LoopbackOptions) -> Option<LoopbackControlPlane> {
        if let Some(why) = crate::skip_reason() {
            println!("SKIP: {test}: {why}");
            return None;
        }
        let started = Instant::now();
        let plane = LoopbackControlPlane::start(options)
            .unwrap_or_else(|e| panic!("{test}: starting etcd and kube-apiserver: {e:#}"));
        println!(
            "{test}: etcd and kube-apiserver up in {:.1?} ({})",
            started.elapsed(),
            plane.dir.display()
        );
        Some(plane)
    }

    /// Starts etcd and kube-apiserver and waits until the API server is ready and the
    /// `default` ServiceAccount exists.
    pub fn start(options: LoopbackOptions) -> Result<LoopbackControlPlane> {
        off_runtime(|| Self::start_here(options))
    }

    fn start_here(options: LoopbackOptions) -> Result<LoopbackControlPlane> {
        for name in ["etcd", "kube-apiserver"] {
            crate::paths::tool(&options.tools, name)?;
        }
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .context("starting a runtime for the control plane's client")?;
        let spawner = Spawner::new("allot-lab-spawner")?;
        let dir = tempfile::Builder::new()
            .prefix("allot-apiserver-")
            .tempdir()
            .context("creating a temporary directory")?
            .keep();
        let started = (|| {
            let certs = ControlPlaneCerts::create(
                &dir.join("pki"),
                &dir.join("kubeconfigs"),
                // The port is chosen below, and the kubeconfigs written again with it.
                "https://127.0.0.1:0",
                &[ADVERTISE_ADDRESS.to_string()],
            )?;
            // A port chosen free can be taken by another test's component before ours binds
            // it: try again with other ports.
            let mut last = None;
            for _ in 0..3 {
                match runtime.block_on(start_processes(&options, &dir, &certs, &spawner)) {
                    Ok(up) => return Ok((certs, up)),
                    Err(e) if format!("{e:#}").contains("address already in use") => last = Some(e),
                    Err(e) => return Err(e),
                }
            }
            Err(last.expect("three attempts"))
        })();
        let (certs, (layout, processes, kubeconfig)) = match started {
            Ok(up) => up,
            Err(e) => {
                if !options.keep {
                    let _ = std::fs::remove_dir_all(&dir);
                }
                return Err(e);
            }
        };
        let client = runtime.block_on(crate::kube_client(&kubeconfig))?;
        let plane = LoopbackControlPlane {
            dir,
            keep: options.keep,
            layout,
            pki: certs.pki,
            kubeconfig,
            processes,
            runtime: Some(runtime),
            client,
        };
        plane.create_default_service_account("default")?;
        Ok(plane)
    }

    /// The admin kubeconfig (`system:masters`).
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// The API server's URL (`https://127.0.0.1:PORT`).
    pub fn server(&self) -> String {
        self.layout.server_url()
    }

    /// The directory of certificates, kubeconfigs, etcd's data and logs.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The components' logs and the audit log.
    pub fn logs(&self) -> &Path {
        &self.layout.logs
    }

    /// A kubeconfig for a user of its own (a client certificate for `user` in `groups`), so
    /// that the audit log tells its requests from the test's ([`Self::requests_of`]).
    pub fn user_kubeconfig(&self, user: &str, groups: &[&str]) -> Result<PathBuf> {
        let file: String = user
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
            .collect();
        let cert = self.pki.client(&format!("user-{file}"), user, groups)?;
        let path = self.dir.join(format!("kubeconfigs/{file}.kubeconfig"));
        pki::write_kubeconfig(&path, &self.server(), &self.pki.ca_cert, &cert, user)?;
        Ok(path)
    }

    /// The requests user `user` made, as the API server's audit log records them, once every
    /// request answered before this call is there.
    pub fn requests_of(&self, user: &str) -> Result<Vec<audit::Request>> {
        self.audit_barrier()?;
        Ok(audit::read(self.logs())?
            .into_iter()
            .filter(|r| r.user == user)
            .collect())
    }

    /// Waits until a request made now is in the audit log: the API server writes an entry
    /// once its response is sent, so one answered just before may not be there yet.
    fn audit_barrier(&self) -> Result<()> {
        static MARKERS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = MARKERS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let marker = format!("allot-lab-audit-barrier-{}-{n}", std::process::id());
        self.get("v1", "configmaps", Some("default"), &marker)?;
        let deadline = Instant::now() + Duration::from_secs(10);
        while !audit::read(self.logs())?.iter().any(|r| r.name == marker) {
            if Instant::now() > deadline {
                bail!("the audit log did not record a request within 10 s");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }

    /// Runs `future` on the control plane's runtime, where [`Self::client`] lives.
    pub fn block_on<F: Future + Send>(&self, future: F) -> F::Output
    where
        F::Output: Send,
    {
        let runtime = self.runtime.as_ref().expect("the runtime lives until drop");
        off_runtime(|| runtime.block_on(future))
    }

    /// An admin client, bound to the control plane's runtime: use it inside
    /// [`Self::block_on`]. A test's own runtime makes its own with [`crate::kube_client`].
    pub fn client(&self) -> kube::Client {
        self.client.clone()
    }

    /// Creates `crds` (server-side apply) and waits until each is Established.
    pub fn apply_crds(&self, crds: &[CustomResourceDefinition]) -> Result<()> {
        self.block_on(objects::apply_crds(&self.client, crds))
    }

    /// Creates namespace `name` with `labels`, and its `default` ServiceAccount.
    pub fn create_namespace(&self, name: &str, labels: serde_json::Value) -> Result<()> {
        self.create(
            "namespaces",
            serde_json::json!({"apiVersion": "v1", "kind": "Namespace",
                               "metadata": {"name": name, "labels": labels}}),
        )?;
        self.create_default_service_account(name)
    }

    fn create_default_service_account(&self, namespace: &str) -> Result<()> {
        self.create(
            "serviceaccounts",
            serde_json::json!({"apiVersion": "v1", "kind": "ServiceAccount",
                               "metadata": {"namespace": namespace, "name": "default"}}),
        )
        .map(drop)
    }
}

/// Starts etcd and the API server into `dir` on free ports; returns the layout, the processes
/// and the admin kubeconfig naming the chosen port.
async fn start_processes(
    options: &LoopbackOptions,
    dir: &Path,
    certs: &ControlPlaneCerts,
    spawner: &Spawner,
) -> Result<(Layout, Vec<Supervised>, PathBuf)> {
    let loopback = IpAddr::from(Ipv4Addr::LOCALHOST);
    let mut layout = Layout::new(
        &options.tools,
        dir,
        certs,
        (loopback, free_port()?, ADVERTISE_ADDRESS.into()),
        // Kubernetes' default; no controller-manager reads it here.
        Duration::from_secs(50),
    )?;
    layout.admission_webhooks = options.admission_webhooks;
    layout.spawner = Some(spawner.clone());
    layout.write_audit_policy()?;
    if layout.etcd_data.exists() {
        std::fs::remove_dir_all(&layout.etcd_data)?;
    }
    certs.write_kubeconfigs(&layout.server_url())?;
    let admin = certs.admin_kubeconfig.clone();
    let deadline = Instant::now() + options.ready_timeout;
    let mut processes = Vec::new();
    for component in [Component::Etcd, Component::KubeApiserver] {
        match layout.start(component, &admin).await {
            Ok(p) => processes.push(p),
            Err(e) => {
                for p in &mut processes {
                    p.kill();
                }
                return Err(e);
            }
        }
        if Instant::now() > deadline {
            bail!(
                "the control plane was not ready within {:?}",
                options.ready_timeout
            );
        }
    }
    Ok((layout, processes, admin))
}

impl Drop for LoopbackControlPlane {
    fn drop(&mut self) {
        // Without waiting for its tasks: a runtime dropped in an async test would panic.
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
        // A throwaway: no clean shutdown to wait for (SIGKILL, the API server first).
        for p in self.processes.iter_mut().rev() {
            p.kill();
        }
        if self.keep {
            println!("kept {}", self.dir.display());
        } else if let Err(e) = std::fs::remove_dir_all(&self.dir) {
            eprintln!("removing {}: {e}", self.dir.display());
        }
    }
}
