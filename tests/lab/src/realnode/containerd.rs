//! containerd's configuration on a real node (containerd 2.x, config version 3; containerd's
//! `docs/cri/config.md`), with the paths as the node sees them (its mount namespace gives it its
//! own `/etc/containerd`, `/var/lib/containerd`, `/run`, `/etc/cni/net.d` and `/opt/cni/bin`).
//!
//! What this machine needs beyond the defaults (checked here, each by turning it off):
//! `restrict_oom_score_adj` (the machine withholds CAP_SYS_RESOURCE, and runc cannot lower a
//! sandbox's `oom_score_adj` without it: "failed to update /proc/self/oom_score_adj: Permission
//! denied"); `imports = []` (containerd 2 also reads `/etc/containerd/conf.d/*.toml`); NRI off and
//! the `opt` plugin moved (they would listen on and write machine-wide paths). Images come from
//! the lab's registry through a mirror per upstream registry host (`certs.d/<host>/hosts.toml`,
//! containerd's `docs/hosts.md`), as pulls go through a registry cache in many data centres.

use std::fmt::Write as _;
use std::fs;
use std::path::Path;

use anyhow::{Context, Result};

/// The registry hosts whose images the lab mirrors (those its pods and charts name).
pub const MIRRORED_HOSTS: [&str; 4] = ["docker.io", "registry.k8s.io", "ghcr.io", "localhost"];

/// Where containerd listens, in the node's view.
pub const SOCKET: &str = "/run/containerd/containerd.sock";

/// containerd's `config.toml` for a node: `tools` holds runc (and, on PATH, the shim),
/// `sandbox_image` is the pause image every pod sandbox runs.
pub fn config(tools: &Path, sandbox_image: &str) -> String {
    format!(
        r#"version = 3
root = '/var/lib/containerd'
state = '/run/containerd'
imports = []
disabled_plugins = ['io.containerd.nri.v1.nri']

[grpc]
  address = '{SOCKET}'
[ttrpc]
  address = '{SOCKET}.ttrpc'

[plugins.'io.containerd.internal.v1.opt']
  path = '/var/lib/containerd/opt'

[plugins.'io.containerd.cri.v1.images']
  snapshotter = 'overlayfs'
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = '{sandbox_image}'
  [plugins.'io.containerd.cri.v1.images'.registry]
    config_path = '/etc/containerd/certs.d'

[plugins.'io.containerd.cri.v1.runtime']
  restrict_oom_score_adj = true
  enable_unprivileged_ports = true
  enable_unprivileged_icmp = true
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = 'runc'
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = 'io.containerd.runc.v2'
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        BinaryName = '{runc}'
        SystemdCgroup = false
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ['/opt/cni/bin']
    conf_dir = '/etc/cni/net.d'
    max_conf_num = 1

[plugins.'io.containerd.grpc.v1.cri']
  stream_server_address = '127.0.0.1'
  stream_server_port = '0'
"#,
        runc = tools.join("runc").display(),
    )
}

/// `certs.d/<host>/hosts.toml` for `host`: pulls go to the lab's registry at `registry`
/// (`HOST:PORT`, plain HTTP), where the lab pushed `host`'s images under a path of that name
/// (`override_path`: the mirror's URL is the API root).
pub fn hosts_toml(host: &str, registry: &str) -> String {
    let upstream = if host == "localhost" {
        "http://localhost".to_string()
    } else if host == "docker.io" {
        "https://registry-1.docker.io".to_string()
    } else {
        format!("https://{host}")
    };
    let mut out = String::new();
    let _ = writeln!(out, "server = \"{upstream}\"");
    let _ = writeln!(out);
    let _ = writeln!(out, "[host.\"http://{registry}/v2/{host}\"]");
    let _ = writeln!(out, "  capabilities = [\"pull\", \"resolve\"]");
    let _ = writeln!(out, "  override_path = true");
    out
}

/// Writes the configuration into the node's `etc/containerd` (under `root`).
pub fn write(root: &Path, tools: &Path, sandbox_image: &str, registry: &str) -> Result<()> {
    let etc = root.join("etc/containerd");
    fs::create_dir_all(&etc)?;
    fs::write(etc.join("config.toml"), config(tools, sandbox_image))
        .context("writing containerd's config.toml")?;
    for host in MIRRORED_HOSTS {
        let dir = etc.join("certs.d").join(host);
        fs::create_dir_all(&dir)?;
        fs::write(dir.join("hosts.toml"), hosts_toml(host, registry))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pulls_of_each_host_go_to_its_path_in_the_lab_registry() {
        let t = hosts_toml("docker.io", "198.51.100.1:5000");
        assert!(
            t.starts_with("server = \"https://registry-1.docker.io\""),
            "{t}"
        );
        assert!(
            t.contains("[host.\"http://198.51.100.1:5000/v2/docker.io\"]"),
            "{t}"
        );
        assert!(t.contains("override_path = true"), "{t}");
        let c = config(Path::new("/tools"), "registry.k8s.io/pause:3.10.2");
        assert!(c.contains("BinaryName = '/tools/runc'"), "{c}");
        assert!(c.contains("restrict_oom_score_adj = true"), "{c}");
        assert!(
            c.contains("sandbox = 'registry.k8s.io/pause:3.10.2'"),
            "{c}"
        );
    }
}
