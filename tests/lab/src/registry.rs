//! The lab's OCI registry: Debian's `docker-registry` (CNCF distribution 2.8), on the host's
//! bridge address so that every node reaches it, with storage in the lab's directory. The lab
//! pushes its images there ([`crate::images`]); the nodes' containerd pulls them through a
//! mirror per upstream registry host ([`crate::realnode::containerd`]), so `image: busybox`
//! and `registry.k8s.io/pause:3.10.2` resolve as on a cluster behind a registry cache.

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};

use crate::net::HOST_IPV4;
use crate::process::Supervised;

/// Debian's package `docker-registry` installs it here (`scripts/setup.sh`).
pub const REGISTRY_BIN: &str = "/usr/bin/docker-registry";
/// The registry's port on the host's bridge address.
pub const PORT: u16 = 5000;

/// `HOST:PORT` of the lab's registry.
pub fn address() -> String {
    format!("{HOST_IPV4}:{PORT}")
}

/// Writes the registry's configuration under `dir` and returns the process (not started).
pub fn process(dir: &Path, logs: &Path) -> Result<Supervised> {
    if !Path::new(REGISTRY_BIN).exists() {
        bail!("{REGISTRY_BIN} is missing: run scripts/setup.sh (Debian package docker-registry)");
    }
    std::fs::create_dir_all(dir.join("data"))?;
    let config = dir.join("config.yml");
    std::fs::write(
        &config,
        format!(
            "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {}\n  \
             delete:\n    enabled: true\nhttp:\n  addr: {}\n",
            dir.join("data").display(),
            address()
        ),
    )?;
    Ok(Supervised::new(
        "registry",
        Path::new(REGISTRY_BIN),
        vec!["serve".into(), config.into()],
        logs.join("registry.log"),
    ))
}

/// Waits until the registry answers `/v2/` (it serves the distribution API).
pub async fn wait_ready(registry: &mut Supervised, timeout: Duration) -> Result<()> {
    let addr: SocketAddr = address().parse()?;
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(status) = registry.try_exit() {
            bail!("the registry exited ({status}): {}", registry.log_tail(20));
        }
        let answer = crate::http::get(addr, "registry", "/v2/", &[], Duration::from_secs(2)).await;
        if answer.is_ok_and(|r| r.status == 200) {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!(
                "the registry did not answer on {addr} within {timeout:?}: {}",
                registry.log_tail(20)
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
