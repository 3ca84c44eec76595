//! The kubelet's configuration on a real node (`KubeletConfiguration`,
//! kubelet.config.k8s.io/v1beta1), with what this machine and several nodes on one machine need:
//!
//! - `failCgroupV1: false` and the `cgroupfs` driver: the machine mounts cgroup v1 and its
//!   PID 1 is not systemd (KEP-5573 made v1 opt-in);
//! - a `cgroupRoot` of the node's own, made beforehand in every hierarchy (the kubelet refuses a
//!   root with missing paths);
//! - eviction thresholds of 100 MiB (absolute: a share of a large disk is gigabytes) and image GC
//!   off: every node reports the machine's memory and disk, which the lab's builds fill, and a
//!   node under pressure would evict the tests' pods;
//! - the lab's CA for client certificates (the API server's, for logs and exec) and a serving
//!   certificate the lab signs.

use std::fs;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::path::Path;

use anyhow::{Context, Result};

/// The paths and names one node's kubelet takes.
pub struct KubeletFiles<'a> {
    pub ca: &'a Path,
    pub serving_cert: &'a Path,
    pub serving_key: &'a Path,
    pub cgroup_root: &'a str,
    pub ipv4: Ipv4Addr,
    pub max_pods: u32,
}

/// The configuration file's text.
pub fn config(f: &KubeletFiles) -> String {
    format!(
        r#"apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: {cgroup_root}
cgroupsPerQOS: true
enforceNodeAllocatable: [pods]
containerRuntimeEndpoint: unix://{socket}
address: {ipv4}
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
tlsCertFile: {cert}
tlsPrivateKeyFile: {key}
authentication:
  anonymous: {{enabled: false}}
  webhook: {{enabled: true}}
  x509: {{clientCAFile: {ca}}}
authorization:
  mode: Webhook
failSwapOn: false
oomScoreAdj: 0
protectKernelDefaults: false
evictionHard: {{memory.available: 100Mi, nodefs.available: 100Mi, imagefs.available: 100Mi, nodefs.inodesFree: 1%}}
evictionPressureTransitionPeriod: 10s
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
maxPods: {max_pods}
serializeImagePulls: false
registerNode: true
nodeStatusUpdateFrequency: 5s
"#,
        cgroup_root = f.cgroup_root,
        socket = super::containerd::SOCKET,
        ipv4 = f.ipv4,
        cert = f.serving_cert.display(),
        key = f.serving_key.display(),
        ca = f.ca.display(),
        max_pods = f.max_pods,
    )
}

/// Writes the configuration into the node's `var/lib/kubelet/config.yaml` (under `root`).
pub fn write(root: &Path, files: &KubeletFiles) -> Result<()> {
    let dir = root.join("var/lib/kubelet");
    fs::create_dir_all(&dir)?;
    fs::write(dir.join("config.yaml"), config(files)).context("writing the kubelet's config.yaml")
}

/// The kubelet's command line: `config` and `kubeconfig` are paths the node sees (the
/// machine's, outside the node's own directories).
pub fn args(
    name: &str,
    kubeconfig: &Path,
    ipv4: Ipv4Addr,
    ipv6: Ipv6Addr,
) -> Vec<std::ffi::OsString> {
    [
        "--config=/var/lib/kubelet/config.yaml".to_string(),
        format!("--kubeconfig={}", kubeconfig.display()),
        "--root-dir=/var/lib/kubelet".to_string(),
        "--cert-dir=/var/lib/kubelet/pki".to_string(),
        format!("--hostname-override={name}"),
        format!("--node-ip={ipv4},{ipv6}"),
        "--v=1".to_string(),
    ]
    .into_iter()
    .map(Into::into)
    .collect()
}
