//! The IPAMs under test, each installed as its users install it, and each given the same
//! network: Debian's bridge plugin on a node-local bridge with the IPAM's own ipam section
//! ([`conflist`]), written on every node by the benchmark, as a cluster's administrator
//! writes it.
//!
//! - host-local, the floor: CNI's own plugin (Debian's, which the lab links into every node's
//!   `/opt/cni/bin`), nothing installed and no API request. It coordinates nothing: every node
//!   is given the whole pool's range and keeps its reservations in its own `/var/lib/cni`, so
//!   an address may answer on two nodes at once (each node's bridge is node-local, so the pods
//!   never meet). It is what an ADD and a DEL cost with no IPAM behind them, not a cluster IPAM.
//! - allot: its Helm chart from this checkout (default values but the lab's image), its
//!   agents and controllers as the chart runs them; pools are IPPools named in the ipam section.
//! - Whereabouts v0.9.2 (`target/tools/whereabouts`, `ip-control-loop`): its CRDs, its
//!   ServiceAccount and ClusterRole as its `daemonset-install.yaml` makes them, the CNI plugin
//!   copied into each node's `/opt/cni/bin` with a kubeconfig of that ServiceAccount's token in
//!   `/etc/cni/net.d/whereabouts.d/` (what its install script does), and `ip-control-loop` run
//!   as its DaemonSet runs it: one pod per node, host network, in-cluster credentials of the
//!   ServiceAccount, `NODENAME` from the downward API, the reconciler's cron schedule from a
//!   ConfigMap. Pools are ranges in the ipam section (Whereabouts makes an IPPool per range).

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use allot_cluster_tests::Suite;
use allot_lab::NodeInfo;
use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

/// The reference of the image the lab runs Whereabouts' `ip-control-loop` from.
pub const WHEREABOUTS_IMAGE: &str = "localhost/whereabouts:bench";
const WHEREABOUTS_NS: &str = "kube-system";
/// Where Whereabouts' install script puts its kubeconfig on a node.
const WHEREABOUTS_DIR: &str = "etc/cni/net.d/whereabouts.d";
const CALICO_NS: &str = "kube-system";
/// Where the benchmark puts calico-ipam's kubeconfig on a node (Calico's install-cni puts it in
/// the CNI configuration directory too).
const CALICO_KUBECONFIG: &str = "etc/cni/net.d/calico-kubeconfig";

/// An address range of RFC 2544's benchmarking network (198.18.0.0/15), which nothing else in
/// the lab uses.
#[derive(Clone, Debug)]
pub struct Pool {
    pub name: String,
    pub subnet: String,
    pub first: Ipv4Addr,
    pub last: Ipv4Addr,
}

impl Pool {
    /// `size` addresses from `base`.10 of a /16.
    pub fn new(name: &str, base: Ipv4Addr, size: u32) -> Pool {
        let first = u32::from(base) + 10;
        Pool {
            name: name.into(),
            subnet: format!("{base}/16"),
            first: Ipv4Addr::from(first),
            last: Ipv4Addr::from(first + size - 1),
        }
    }

    pub fn size(&self) -> u32 {
        u32::from(self.last) - u32::from(self.first) + 1
    }

    /// The pool as Calico states pools: a CIDR (the smallest from the /16's base holding
    /// `size` addresses; the whole /16 for a larger one) and the CIDRs reserved beyond `size`
    /// (IPReservations), so that exactly `size` addresses are assignable.
    pub fn calico(&self) -> (String, Vec<String>) {
        let base = u32::from(self.first) & 0xffff_0000;
        let size = self.size();
        let bits = 32 - size.next_power_of_two().trailing_zeros();
        if bits <= 16 {
            return (format!("{}/16", Ipv4Addr::from(base)), Vec::new());
        }
        let end = base + (1u32 << (32 - bits));
        let mut reserved = Vec::new();
        let mut at = base + size;
        while at < end {
            // The largest aligned block starting at `at` that ends within the pool's CIDR.
            let mut len = at.trailing_zeros().min(31);
            while at + (1u32 << len) > end {
                len -= 1;
            }
            reserved.push(format!("{}/{}", Ipv4Addr::from(at), 32 - len));
            at += 1 << len;
        }
        (format!("{}/{bits}", Ipv4Addr::from(base)), reserved)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ipam {
    HostLocal,
    Allot,
    Whereabouts,
    Calico,
}

impl Ipam {
    pub fn parse(name: &str) -> Option<Ipam> {
        match name.trim() {
            "host-local" => Some(Ipam::HostLocal),
            "allot" => Some(Ipam::Allot),
            "whereabouts" => Some(Ipam::Whereabouts),
            "calico" => Some(Ipam::Calico),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Ipam::HostLocal => "host-local",
            Ipam::Allot => "allot",
            Ipam::Whereabouts => "whereabouts",
            Ipam::Calico => "calico",
        }
    }

    /// Why this IPAM cannot run here, if it cannot: a binary that is not built (host-local:
    /// in neither `target/tools` nor Debian's plugins).
    pub fn missing(self) -> Option<String> {
        let need: &[&str] = match self {
            Ipam::HostLocal => {
                return host_local_binary().is_none().then(|| {
                    format!(
                        "host-local is in neither {} nor {SYSTEM_CNI_DIR} (Debian's \
                         containernetworking-plugins)",
                        allot_lab::paths::tools_dir().display()
                    )
                });
            }
            Ipam::Allot => return None,
            Ipam::Whereabouts => &["whereabouts", "ip-control-loop"],
            Ipam::Calico => &["calico-ipam"],
        };
        let tools = allot_lab::paths::tools_dir();
        need.iter()
            .map(|b| tools.join(b))
            .find(|p| !p.exists())
            .map(|p| {
                format!(
                    "{} is not built (scripts/build-upstream.sh --peers)",
                    p.display()
                )
            })
    }

    /// The users (prefixes) whose requests are the IPAM's own, in the audit log (none for
    /// host-local, which asks the API server nothing).
    pub fn users(self) -> Vec<String> {
        match self {
            Ipam::HostLocal => Vec::new(),
            Ipam::Allot => vec![format!(
                "system:serviceaccount:{}:",
                allot_cluster_tests::NAMESPACE
            )],
            Ipam::Whereabouts => vec![format!(
                "system:serviceaccount:{WHEREABOUTS_NS}:whereabouts"
            )],
            Ipam::Calico => vec![format!(
                "system:serviceaccount:{CALICO_NS}:calico-cni-plugin"
            )],
        }
    }

    /// The IPAM's pods on every node (namespace, label selector), if it has any (host-local
    /// has none; calico-ipam alone has none either: calico-node is Calico's dataplane agent,
    /// not its IPAM).
    pub fn node_pods(self) -> Option<(&'static str, &'static str)> {
        match self {
            Ipam::Allot => Some((
                allot_cluster_tests::NAMESPACE,
                "app.kubernetes.io/component=agent",
            )),
            Ipam::Whereabouts => Some((WHEREABOUTS_NS, "name=whereabouts")),
            Ipam::HostLocal | Ipam::Calico => None,
        }
    }

    /// The IPAM's cluster-wide pods (namespace, label selector), if it has any.
    pub fn cluster_pods(self) -> Option<(&'static str, &'static str)> {
        match self {
            Ipam::Allot => Some((
                allot_cluster_tests::NAMESPACE,
                "app.kubernetes.io/component=controller",
            )),
            _ => None,
        }
    }

    /// Whether each node hands out the whole pool on its own (host-local): an address then
    /// answers on two nodes by design, and only one answering in two sandboxes of one node is
    /// a failure.
    pub fn node_local(self) -> bool {
        self == Ipam::HostLocal
    }

    /// Installs the IPAM and waits until it serves on every node (host-local: only its binary
    /// on each node that lacks it, as a node image would ship it).
    pub async fn install(self, s: &Suite, nodes: &[NodeInfo]) -> Result<()> {
        match self {
            Ipam::HostLocal => {
                let binary = host_local_binary().context("the host-local binary")?;
                for node in nodes {
                    if node
                        .root
                        .join("opt/cni/bin/host-local")
                        .symlink_metadata()
                        .is_err()
                    {
                        install_plugin(node, &binary, "host-local")?;
                    }
                }
                Ok(())
            }
            Ipam::Allot => {
                s.must(
                    "helm",
                    &[
                        "install",
                        allot_cluster_tests::RELEASE,
                        "charts/allot",
                        "-n",
                        allot_cluster_tests::NAMESPACE,
                        "--create-namespace",
                        "--set",
                        "image.repository=localhost/allot,image.tag=dev,image.pullPolicy=Never",
                        // Its webhooks must be reachable from the API server: the benchmark's
                        // bridge is node-local (as the chart does when allot writes the conflist).
                        "--set",
                        "controller.hostNetwork=true",
                        "--wait",
                        "--timeout",
                        "5m",
                    ],
                );
                s.wait_ready().await;
                Ok(())
            }
            Ipam::Whereabouts => install_whereabouts(s, nodes).await,
            Ipam::Calico => install_calico(s, nodes).await,
        }
    }

    /// The ipam section that takes addresses from `pool`, and the keys the IPAM reads at the
    /// top of the plugin's configuration on `node` (calico-ipam reads its datastore there).
    pub fn section(self, pool: &Pool, node: &NodeInfo) -> (Value, Value) {
        match self {
            // The whole pool on every node (https://www.cni.dev/plugins/current/ipam/host-local/:
            // one range set of one range). Its reservations are files under the node's own
            // `/var/lib/cni` (the node's view binds it there), `<dataDir>/<network name>`: a
            // directory per pool, so that the exact pool starts from none of the large one's.
            Ipam::HostLocal => (
                json!({
                    "type": "host-local",
                    "ranges": [[{
                        "subnet": pool.subnet,
                        "rangeStart": pool.first.to_string(),
                        "rangeEnd": pool.last.to_string(),
                    }]],
                    "dataDir": format!("/var/lib/cni/networks/{}", pool.name),
                }),
                json!({}),
            ),
            Ipam::Allot => (
                json!({
                    "type": "allot",
                    "socket": "/run/allot/agent.sock",
                    "journal": "/var/lib/allot/journal",
                    "default_ipv4_ippool": [pool.name],
                }),
                json!({}),
            ),
            Ipam::Whereabouts => (
                json!({
                    "type": "whereabouts",
                    "range": pool.subnet,
                    "range_start": pool.first.to_string(),
                    "range_end": pool.last.to_string(),
                    "kubernetes": {
                        "kubeconfig": format!("/{WHEREABOUTS_DIR}/whereabouts.kubeconfig"),
                    },
                }),
                json!({}),
            ),
            Ipam::Calico => (
                json!({"type": "calico-ipam", "assign_ipv4": "true", "ipv4_pools": [pool.name]}),
                json!({
                    "datastore_type": "kubernetes",
                    "nodename": node.name,
                    "kubernetes": {"kubeconfig": format!("/{CALICO_KUBECONFIG}")},
                }),
            ),
        }
    }

    /// Makes the objects `pool` needs (allot's IPPool; Calico's IPPool and, for a pool that is
    /// not a power of two, IPReservations of the addresses beyond it; Whereabouts makes its
    /// IPPool itself on the first ADD; host-local's pool is its ipam section alone).
    pub fn make_pool(self, s: &Suite, pool: &Pool) -> Result<()> {
        let yaml = match self {
            Ipam::HostLocal => return Ok(()),
            Ipam::Allot => format!(
                "apiVersion: allot.dev/v1alpha1\nkind: IPPool\nmetadata:\n  name: {}\n\
                 spec:\n  ipVersion: 4\n  subnet: {}\n  ips: [\"{}-{}\"]\n",
                pool.name, pool.subnet, pool.first, pool.last
            ),
            Ipam::Whereabouts => return Ok(()),
            Ipam::Calico => {
                let (cidr, reserved) = pool.calico();
                let mut yaml = format!(
                    "apiVersion: crd.projectcalico.org/v1\nkind: IPPool\nmetadata:\n  name: {}\n\
                     spec:\n  cidr: {cidr}\n  blockSize: 26\n  ipipMode: Never\n  \
                     vxlanMode: Never\n  natOutgoing: false\n  nodeSelector: all()\n",
                    pool.name
                );
                if !reserved.is_empty() {
                    yaml += &format!(
                        "---\napiVersion: crd.projectcalico.org/v1\nkind: IPReservation\n\
                         metadata:\n  name: {}\nspec:\n  reservedCIDRs: {:?}\n",
                        pool.name, reserved
                    );
                }
                yaml
            }
        };
        let out = s.apply(&yaml);
        if !out.status.success() {
            bail!(
                "kubectl apply of pool {}: {}",
                pool.name,
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(())
    }

    /// Removes what [`Ipam::make_pool`] made, once no pod holds its addresses.
    pub fn drop_pool(self, s: &Suite, pool: &Pool) {
        if self == Ipam::Allot {
            let _ = s.kubectl(&[
                "delete",
                "ippool",
                &pool.name,
                "--wait=true",
                "--timeout=120s",
            ]);
        }
    }
}

/// The network every IPAM is measured behind: the bridge plugin on a node-local bridge, no
/// gateway, the IPAM's ipam section. Written atomically (renamed into place), named to sort
/// first.
pub fn conflist(nodes: &[NodeInfo], ipam: Ipam, pool: &Pool) -> Result<()> {
    for node in nodes {
        let (section, top) = ipam.section(pool, node);
        let mut plugin = json!({"type": "bridge", "bridge": "bench0", "ipam": section});
        if let (Some(plugin), Some(top)) = (plugin.as_object_mut(), top.as_object()) {
            plugin.extend(top.clone());
        }
        let conf = json!({"cniVersion": "1.0.0", "name": "bench", "plugins": [plugin]});
        let dir = node.root.join("etc/cni/net.d");
        let tmp = dir.join(".05-bench.tmp");
        std::fs::write(&tmp, serde_json::to_vec_pretty(&conf)?)?;
        std::fs::rename(&tmp, dir.join("05-bench.conflist"))?;
    }
    Ok(())
}

/// The image directory the lab runs `ip-control-loop` from (made before the lab starts).
pub fn whereabouts_image(dir: &Path) -> Result<PathBuf> {
    let rootfs = dir.join("rootfs");
    std::fs::create_dir_all(&rootfs)?;
    let binary = allot_lab::paths::tools_dir().join("ip-control-loop");
    std::fs::copy(&binary, rootfs.join("ip-control-loop"))
        .with_context(|| format!("copying {}", binary.display()))?;
    let config = json!({
        "Entrypoint": ["/ip-control-loop"],
        "Cmd": ["-log-level", "error"],
        "User": "0:0",
        "Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
    });
    std::fs::write(dir.join("config.json"), serde_json::to_vec_pretty(&config)?)?;
    Ok(dir.to_path_buf())
}

async fn install_whereabouts(s: &Suite, nodes: &[NodeInfo]) -> Result<()> {
    let crds = [
        allot_cluster_tests::peers::crds_dir("whereabouts"),
        allot_cluster_tests::peers::crds_dir("network-attachment-definition"),
    ];
    for dir in &crds {
        apply_dir(s, dir)?;
    }
    s.must(
        "kubectl",
        &[
            "wait",
            "--for=condition=Established",
            "crd/ippools.whereabouts.cni.cncf.io",
            "crd/overlappingrangeipreservations.whereabouts.cni.cncf.io",
            "crd/network-attachment-definitions.k8s.cni.cncf.io",
            "--timeout=60s",
        ],
    );
    let ns = WHEREABOUTS_NS;
    // daemonset-install.yaml of v0.9.2: the ServiceAccount, its ClusterRole and binding, the
    // reconciler's schedule; the DaemonSet runs ip-control-loop (its install-cni.sh part is
    // done below, on the nodes' files).
    let yaml = format!(
        r#"apiVersion: v1
kind: ServiceAccount
metadata: {{name: whereabouts, namespace: {ns}}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {{name: whereabouts-cni}}
rules:
- apiGroups: [whereabouts.cni.cncf.io]
  resources: [ippools, overlappingrangeipreservations, nodeslicepools]
  verbs: [get, list, watch, create, update, patch, delete]
- apiGroups: [coordination.k8s.io]
  resources: [leases]
  verbs: ["*"]
- apiGroups: [""]
  resources: [pods]
  verbs: [get, list, watch]
- apiGroups: [""]
  resources: [nodes]
  verbs: [get, list, watch]
- apiGroups: [k8s.cni.cncf.io]
  resources: [network-attachment-definitions]
  verbs: [get, list, watch]
- apiGroups: ["", events.k8s.io]
  resources: [events]
  verbs: [create, patch, update]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {{name: whereabouts}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: whereabouts-cni}}
subjects: [{{kind: ServiceAccount, name: whereabouts, namespace: {ns}}}]
---
apiVersion: v1
kind: ConfigMap
metadata: {{name: whereabouts-config, namespace: {ns}}}
data: {{cron-expression: "30 4 * * *"}}
---
apiVersion: apps/v1
kind: DaemonSet
metadata: {{name: whereabouts, namespace: {ns}}}
spec:
  selector: {{matchLabels: {{name: whereabouts}}}}
  template:
    metadata: {{labels: {{name: whereabouts, app: whereabouts}}}}
    spec:
      hostNetwork: true
      serviceAccountName: whereabouts
      tolerations: [{{operator: Exists}}]
      containers:
      - name: whereabouts
        image: {WHEREABOUTS_IMAGE}
        imagePullPolicy: Never
        env:
        - name: NODENAME
          valueFrom: {{fieldRef: {{fieldPath: spec.nodeName}}}}
        - name: WHEREABOUTS_NAMESPACE
          valueFrom: {{fieldRef: {{fieldPath: metadata.namespace}}}}
        volumeMounts:
        - {{name: cron-scheduler-configmap, mountPath: /cron-schedule}}
      volumes:
      - name: cron-scheduler-configmap
        configMap:
          name: whereabouts-config
          items: [{{key: cron-expression, path: config}}]
"#
    );
    s.must_apply(&yaml);
    // install-cni.sh: the plugin into /opt/cni/bin, a kubeconfig with the ServiceAccount's
    // token (and the cluster's CA) into /etc/cni/net.d/whereabouts.d.
    let plugin = allot_lab::paths::tools_dir().join("whereabouts");
    for node in nodes {
        write_kubeconfig(
            s,
            node,
            ns,
            "whereabouts",
            &format!("{WHEREABOUTS_DIR}/whereabouts.kubeconfig"),
        )?;
        // The flat file the plugin requires beside its net conf (install-cni.sh writes it).
        let flat = json!({
            "datastore": "kubernetes",
            "kubernetes": {"kubeconfig": format!("/{WHEREABOUTS_DIR}/whereabouts.kubeconfig")},
        });
        std::fs::write(
            node.root.join(WHEREABOUTS_DIR).join("whereabouts.conf"),
            serde_json::to_vec_pretty(&flat)?,
        )?;
        install_plugin(node, &plugin, "whereabouts")?;
    }
    let want = nodes.len();
    for _ in 0..360 {
        let ready = crate::phases::pods(s, ns, "name=whereabouts")
            .await
            .unwrap_or_default()
            .iter()
            .filter(|p| allot_lab::testing::condition(p, "Ready").as_deref() == Some("True"))
            .count();
        if ready >= want {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    bail!("Whereabouts' DaemonSet was not Ready on {want} nodes within 180 s")
}

/// Where Debian's CNI plugins are (the lab links them into every node's `/opt/cni/bin`).
const SYSTEM_CNI_DIR: &str = "/usr/lib/cni";

/// The host-local plugin: `target/tools`' if built there, else Debian's.
fn host_local_binary() -> Option<PathBuf> {
    [
        allot_lab::paths::tools_dir().join("host-local"),
        Path::new(SYSTEM_CNI_DIR).join("host-local"),
    ]
    .into_iter()
    .find(|p| p.exists())
}

/// Copies a CNI plugin into the node's `/opt/cni/bin` as `name`.
fn install_plugin(node: &NodeInfo, binary: &Path, name: &str) -> Result<()> {
    let bin = node.root.join("opt/cni/bin").join(name);
    let _ = std::fs::remove_file(&bin);
    std::fs::copy(binary, &bin).with_context(|| format!("copying {}", binary.display()))?;
    Ok(())
}

/// Writes, at `path` under the node's root, a kubeconfig of ServiceAccount `ns/account`'s
/// token (6 hours) and the cluster's CA (beside it, `ca.crt`), as the peers' install scripts do.
fn write_kubeconfig(s: &Suite, node: &NodeInfo, ns: &str, account: &str, path: &str) -> Result<()> {
    let token = s
        .must(
            "kubectl",
            &["-n", ns, "create", "token", account, "--duration=6h"],
        )
        .trim()
        .to_string();
    let info = s.lab.info();
    let file = node.root.join(path);
    let dir = file.parent().context("a directory")?;
    std::fs::create_dir_all(dir)?;
    let ca = Path::new(path).with_file_name(format!("{account}-ca.crt"));
    std::fs::copy(&info.ca, node.root.join(&ca))?;
    let kubeconfig = json!({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "local", "cluster": {
            "server": info.server,
            "certificate-authority": format!("/{}", ca.display())}}],
        "users": [{"name": account, "user": {"token": token}}],
        "contexts": [{"name": account, "context": {"cluster": "local", "user": account}}],
        "current-context": account,
    });
    std::fs::write(&file, serde_json::to_vec_pretty(&kubeconfig)?)?;
    Ok(())
}

/// calico-ipam with the Kubernetes datastore, as Calico's manifests set it up for its CNI
/// plugin: its CRDs, the ServiceAccount `calico-cni-plugin` with the IPAM's rules (those of
/// `/work/notes/calico-build.md`), a kubeconfig of its token on each node, the plugin in
/// `/opt/cni/bin`. No calico-node (the dataplane agent, not the IPAM) and no
/// calico-kube-controllers (its IPAM garbage collection, not built here).
async fn install_calico(s: &Suite, nodes: &[NodeInfo]) -> Result<()> {
    apply_dir(s, &allot_cluster_tests::peers::crds_dir("calico"))?;
    s.must(
        "kubectl",
        &[
            "wait",
            "--for=condition=Established",
            "crd/ippools.crd.projectcalico.org",
            "crd/ipamblocks.crd.projectcalico.org",
            "crd/blockaffinities.crd.projectcalico.org",
            "crd/ipamhandles.crd.projectcalico.org",
            "crd/ipamconfigs.crd.projectcalico.org",
            "crd/ipreservations.crd.projectcalico.org",
            "--timeout=60s",
        ],
    );
    let ns = CALICO_NS;
    s.must_apply(&format!(
        r#"apiVersion: v1
kind: ServiceAccount
metadata: {{name: calico-cni-plugin, namespace: {ns}}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {{name: calico-cni-plugin}}
rules:
- apiGroups: [""]
  resources: [nodes, namespaces]
  verbs: [get]
- apiGroups: [crd.projectcalico.org]
  resources: [ippools, ipamblocks, blockaffinities, ipamhandles, ipamconfigs, ipreservations, clusterinformations]
  verbs: [get, list, watch, create, update, delete]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {{name: calico-cni-plugin}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: calico-cni-plugin}}
subjects: [{{kind: ServiceAccount, name: calico-cni-plugin, namespace: {ns}}}]
"#
    ));
    let plugin = allot_lab::paths::tools_dir().join("calico-ipam");
    for node in nodes {
        write_kubeconfig(s, node, ns, "calico-cni-plugin", CALICO_KUBECONFIG)?;
        install_plugin(node, &plugin, "calico-ipam")?;
    }
    Ok(())
}

/// `kubectl apply -f` of a directory of YAML files (kubectl does not follow a link to one).
fn apply_dir(s: &Suite, dir: &Path) -> Result<()> {
    let dir = std::fs::canonicalize(dir).with_context(|| format!("{}", dir.display()))?;
    s.must("kubectl", &["apply", "-f", dir.to_str().context("a path")?]);
    Ok(())
}
