//! allot on a real Kubernetes control plane: the local lab (`tests/lab`: upstream etcd,
//! kube-apiserver, controller-manager and scheduler, a kubelet stand-in per node running real
//! CNI plugins and allot's own binaries) with allot installed by its Helm chart, as the README
//! says, with real helm.
//!
//! `make cluster-test` starts one lab for the suite (`ALLOT_LAB_CLUSTER`), and every test of
//! the shared phase attaches to it ([`Suite::shared`]): the first one to come installs the chart
//! (under a lock), the others find it installed. Each test works in a namespace and with pools
//! of its own, so the tests of the phase may follow each other in any order. Without
//! `ALLOT_LAB_CLUSTER` a test starts a lab of its own and installs the chart there (slower, the
//! same checks). Tests that take the whole installation down (upgrade, uninstall) start labs
//! of their own ([`Suite::own`]) and run in a phase after the shared one.
//!
//! Every test ends with [`Suite::no_refusals`]: no request of allot's ServiceAccounts was
//! refused by the API server (its audit log), so RBAC grants what allot does and no more is
//! needed.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use allot_lab::testing::wait_for;
use allot_lab::{ClusterOptions, LabCluster};
use anyhow::{Context, Result, bail};
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, PostParams};

pub mod campaign;
pub mod kubevirt;
pub mod multus;
pub mod objects;
pub mod peers;
pub mod sandboxes;

/// The release and its namespace, as the README installs them.
pub const RELEASE: &str = "allot";
pub const NAMESPACE: &str = "allot-system";

/// The workspace's root.
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// `target/tools` (helm, kubectl, the control plane), as `scripts/setup.sh` made it.
pub fn tools() -> PathBuf {
    allot_lab::paths::tools_dir()
}

/// A lab with allot installed.
pub struct Suite {
    pub lab: LabCluster,
    pub client: kube::Client,
    test: String,
}

impl Suite {
    /// The suite's shared lab (`ALLOT_LAB_CLUSTER`), or one of this test's own, with allot
    /// installed by the README's commands; `None` (after saying why) when `ALLOT_LAB_SKIP` is
    /// set.
    pub async fn shared(test: &str) -> Option<Suite> {
        let suite = match std::env::var_os("ALLOT_LAB_CLUSTER") {
            Some(_) => {
                let lab = LabCluster::from_env().expect("attaching to ALLOT_LAB_CLUSTER");
                Suite::attach(test, lab).await
            }
            None => Suite::own(test, 3, |_| {}).await?,
        };
        suite.install().await;
        Some(suite)
    }

    /// A lab of this test's own with `nodes` nodes, nothing installed.
    pub async fn own(
        test: &str,
        nodes: usize,
        tune: impl FnOnce(&mut ClusterOptions),
    ) -> Option<Suite> {
        let node_binary = allot_lab::paths::node_binary();
        let lab = allot_lab::testing::start(test, nodes, node_binary.to_str()?, tune).await?;
        Some(Suite::attach(test, lab).await)
    }

    async fn attach(test: &str, lab: LabCluster) -> Suite {
        let client = lab.client().await.expect("the admin client");
        Suite {
            lab,
            client,
            test: test.to_string(),
        }
    }

    /// `helm` with the lab's admin kubeconfig.
    pub fn helm(&self, args: &[&str]) -> Output {
        self.run("helm", args)
    }

    /// `kubectl` with the lab's admin kubeconfig.
    pub fn kubectl(&self, args: &[&str]) -> Output {
        self.run("kubectl", args)
    }

    fn run(&self, tool: &str, args: &[&str]) -> Output {
        let path = tools().join(tool);
        Command::new(&path)
            .args(args)
            .env("KUBECONFIG", self.lab.kubeconfig())
            .current_dir(root())
            .output()
            .unwrap_or_else(|e| panic!("{}: {e}: run scripts/setup.sh", path.display()))
    }

    /// `allotctl` of this build (`ALLOT_BIN`), with the lab's admin kubeconfig.
    pub fn allotctl(&self, args: &[&str]) -> Output {
        let path = allot_lab::paths::allot_bin_dir().join("allotctl");
        Command::new(&path)
            .arg("--kubeconfig")
            .arg(self.lab.kubeconfig())
            .args(args)
            .current_dir(root())
            .output()
            .unwrap_or_else(|e| panic!("{}: {e}: build allot-cli", path.display()))
    }

    /// Runs `kubectl`/`helm` arguments, panicking with their output when they fail.
    pub fn must(&self, tool: &str, args: &[&str]) -> String {
        let out = self.run(tool, args);
        assert!(
            out.status.success(),
            "{tool} {}: {}\n{}{}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Installs allot as the README does (`helm install` with the local cluster's values, and
    /// the suite's timings, `tests/cluster/values.yaml`), unless it is installed already, and
    /// waits until it is ready: the CRDs Established, an agent Ready on every node, the
    /// controllers Ready and their webhook configurations made.
    pub async fn install(&self) {
        let lock = self.lab.info().dir.join("suite-install.lock");
        let _held = FileLock::take(&lock).expect("the install lock");
        let status = self.helm(&["status", RELEASE, "-n", NAMESPACE]);
        if !status.status.success() {
            let started = Instant::now();
            self.must("helm", &install_args("install"));
            println!("{}: helm install took {:.1?}", self.test, started.elapsed());
        }
        self.wait_ready().await;
    }

    /// Waits until the installation serves: agents Ready on every node, the controller
    /// deployment available, both webhook configurations present.
    pub async fn wait_ready(&self) {
        let nodes = self.lab.nodes().len() as i32;
        let daemonsets: Api<DaemonSet> = Api::namespaced(self.client.clone(), NAMESPACE);
        let deployments: Api<Deployment> = Api::namespaced(self.client.clone(), NAMESPACE);
        wait_for("every agent Ready", Duration::from_secs(180), || async {
            let ds = daemonsets
                .get("allot-agent")
                .await
                .map_err(|e| e.to_string())?;
            let ready = ds.status.map(|s| s.number_ready).unwrap_or(0);
            (ready >= nodes)
                .then_some(())
                .ok_or(format!("{ready} of {nodes} Ready"))
        })
        .await;
        wait_for(
            "the controllers available",
            Duration::from_secs(180),
            || async {
                let d = deployments
                    .get("allot-controller")
                    .await
                    .map_err(|e| e.to_string())?;
                let ready = d.status.and_then(|s| s.ready_replicas).unwrap_or(0);
                (ready >= 1).then_some(()).ok_or(format!("{ready} Ready"))
            },
        )
        .await;
        wait_for(
            "the webhook configurations",
            Duration::from_secs(120),
            || async {
                let out = self.kubectl(&[
                    "get",
                    "validatingwebhookconfiguration/allot",
                    "mutatingwebhookconfiguration/allot",
                    "-o",
                    "name",
                ]);
                out.status.success().then_some(()).ok_or(out.status)
            },
        )
        .await;
    }

    /// A fresh namespace for this test (deleted first if a previous run left it).
    pub async fn namespace(&self, name: &str) -> String {
        let namespaces: Api<Namespace> = Api::all(self.client.clone());
        if namespaces.get_opt(name).await.unwrap().is_some() {
            let _ = namespaces.delete(name, &DeleteParams::default()).await;
            wait_for(
                "the previous run's namespace gone",
                Duration::from_secs(120),
                || async {
                    match namespaces.get_opt(name).await {
                        Ok(None) => Ok(()),
                        other => Err(format!("{:?}", other.map(|n| n.is_some()))),
                    }
                },
            )
            .await;
        }
        let ns = Namespace {
            metadata: ObjectMeta {
                name: Some(name.to_string()),
                ..Default::default()
            },
            ..Default::default()
        };
        namespaces
            .create(&PostParams::default(), &ns)
            .await
            .unwrap();
        name.to_string()
    }

    /// Applies YAML documents with kubectl, as a user would.
    pub fn apply(&self, yaml: &str) -> Output {
        let file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(file.path(), yaml).unwrap();
        self.kubectl(&["apply", "-f", file.path().to_str().unwrap()])
    }

    /// [`Suite::apply`], which must succeed.
    pub fn must_apply(&self, yaml: &str) {
        let out = self.apply(yaml);
        assert!(
            out.status.success(),
            "kubectl apply: {}{}\n{yaml}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// The pods matching `selector` in `ns`.
    pub async fn pods(&self, ns: &str, selector: &str) -> Vec<Pod> {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), ns);
        api.list(&ListParams::default().labels(selector))
            .await
            .unwrap()
            .items
    }

    /// Waits until exactly `count` pods match `selector` in `ns`, each Running and Ready with
    /// its addresses; returns them.
    pub async fn ready_pods(&self, ns: &str, selector: &str, count: usize) -> Vec<Pod> {
        wait_for(
            &format!("{count} pods {selector} Ready in {ns}"),
            Duration::from_secs(180),
            || async {
                let pods = self.pods(ns, selector).await;
                let ready = pods
                    .iter()
                    .filter(|p| p.metadata.deletion_timestamp.is_none())
                    .filter(|p| {
                        allot_lab::testing::condition(p, "Ready").as_deref() == Some("True")
                    })
                    .filter(|p| !objects::pod_ips(p).is_empty())
                    .count();
                (ready == count && pods.len() == count)
                    .then_some(pods)
                    .ok_or((ready, count))
            },
        )
        .await
    }

    /// Fails when the API server refused any request of allot's ServiceAccounts (RBAC).
    ///
    /// Refusals by an API server that was restarting are not the chart's: until a restarted
    /// kube-apiserver is ready its RBAC authorizer has not read the roles, and it answers 403
    /// to what they allow (naming even the bootstrap role `system:basic-user` as not found).
    /// Requests received between a restart's start and the server's `/readyz` answering `ok`
    /// again are left out, and so are writes into a namespace being deleted (the
    /// NamespaceLifecycle admission plugin's 403 "because it is being terminated": an Event
    /// about a pod of a namespace a test deletes, which real nodes take seconds to empty);
    /// every other refusal fails the test.
    pub fn no_refusals(&self) {
        let restarts = self
            .lab
            .apiserver_restarts()
            .expect("reading the lab's API server restarts");
        let refused: Vec<_> = self
            .lab
            .forbidden(&format!("system:serviceaccount:{NAMESPACE}:"))
            .expect("reading the audit log")
            .into_iter()
            .filter(|r| !restarts.iter().any(|w| w.covers(r)))
            .filter(|r| !r.reason.contains("because it is being terminated"))
            .collect();
        assert!(
            refused.is_empty(),
            "{}: the API server refused allot {} request(s):\n{}",
            self.test,
            refused.len(),
            refused
                .iter()
                .take(20)
                .map(|r| format!("  {r}"))
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
}

/// `helm install|upgrade` of the chart in this checkout with the README's values for the local
/// control plane and the suite's timings.
pub fn install_args(verb: &'static str) -> Vec<&'static str> {
    let mut args = vec![
        verb,
        RELEASE,
        "charts/allot",
        "-n",
        NAMESPACE,
        "-f",
        "charts/allot/ci/local-cluster-values.yaml",
        "-f",
        "tests/cluster/values.yaml",
        "--wait",
        "--timeout",
        "5m",
    ];
    if verb == "install" {
        args.push("--create-namespace");
    }
    args
}

/// An exclusive lock on a file, held until dropped (tests of the shared phase run in
/// processes of their own).
pub struct FileLock {
    _held: std::fs::File,
}

impl FileLock {
    pub fn take(path: &Path) -> Result<FileLock> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(path)
            .with_context(|| format!("opening {}", path.display()))?;
        use std::os::fd::AsRawFd;
        // SAFETY: flock(2) on a descriptor this function owns.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } != 0 {
            bail!(
                "locking {}: {}",
                path.display(),
                std::io::Error::last_os_error()
            );
        }
        Ok(FileLock { _held: file })
    }
}

impl Suite {
    /// The controller replica that leads now (the holder of the Lease `allot-controller`).
    pub async fn leader(&self) -> Option<String> {
        let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
            Api::namespaced(self.client.clone(), NAMESPACE);
        leases
            .get_opt("allot-controller")
            .await
            .ok()??
            .spec?
            .holder_identity
    }

    /// SIGKILLs the process of `container` of `pod` on its node, as a crash or the OOM killer
    /// would: the pod stays, and its kubelet starts the container again.
    pub fn kill_container(&self, pod: &Pod, container: &str) {
        self.signal_container(pod, container, libc::SIGKILL);
    }

    /// The host pid of `container` of `pod` on its real node (its process, pid 1 inside it), as
    /// containerd records it for the id the pod's status gives.
    pub fn container_pid(&self, pod: &Pod, container: &str) -> u32 {
        let node = pod.spec.as_ref().and_then(|s| s.node_name.clone()).unwrap();
        let node = self.lab.node(&node).unwrap();
        let id = pod
            .status
            .as_ref()
            .and_then(|s| s.container_statuses.as_ref())
            .and_then(|c| c.iter().find(|c| c.name == container))
            .and_then(|c| c.container_id.clone())
            .expect("the container's id in the pod's status");
        allot_lab::realnode::container_pid(&node.root, &id)
            .expect("the container's process, as containerd records it")
    }

    /// Sends `signal` to the process of `container` of `pod` on its node (SIGSTOP freezes it as
    /// a stalled process is: its connections stay open, it reads nothing).
    pub fn signal_container(&self, pod: &Pod, container: &str, signal: libc::c_int) {
        let node = pod.spec.as_ref().and_then(|s| s.node_name.clone()).unwrap();
        let node = self.lab.node(&node).unwrap();
        if node.kind == allot_lab::NodeKind::Real {
            let pid = self.container_pid(pod, container);
            // SAFETY: kill(2) of the container's process.
            let sent = unsafe { libc::kill(pid as libc::pid_t, signal) };
            assert_eq!(sent, 0, "kill: {}", std::io::Error::last_os_error());
            return;
        }
        let root = node.root;
        let uid = pod.metadata.uid.clone().unwrap();
        let record = allot_lab::node::state::PodRecord::load(
            &allot_lab::node::state::pods_dir(&root).join(&uid),
        )
        .expect("the stand-in's record of the pod");
        let process = record
            .processes
            .iter()
            .find(|p| p.container == container)
            .expect("the container's process");
        // SAFETY: kill(2) of the container's process group, which the stand-in made for it.
        let sent = unsafe { libc::kill(-(process.pid as libc::pid_t), signal) };
        assert_eq!(sent, 0, "kill: {}", std::io::Error::last_os_error());
    }
}

/// The `/metrics` text an allot process serves on `host:port` (the agent on 9401, the controller
/// on 9402: both on the host network of the lab's nodes).
pub async fn metrics(host: &str, port: u16) -> Result<String, String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect((host, port))
        .await
        .map_err(|e| e.to_string())?;
    stream
        .write_all(b"GET /metrics HTTP/1.0\r\nHost: allot\r\n\r\n")
        .await
        .map_err(|e| e.to_string())?;
    let mut body = String::new();
    stream
        .read_to_string(&mut body)
        .await
        .map_err(|e| e.to_string())?;
    Ok(body)
}
