//! The images the lab's real nodes run, made from this machine's files ([`crate::oci`]) and
//! pushed to the lab's registry when it starts:
//!
//! - allot's ([`crate::image::ALLOT_IMAGE`]), with the Dockerfile's layout: the release binaries
//!   in `/usr/local/bin`, the default policy in `/usr/lib/allot/policies/default.wasm`, user
//!   65532, entrypoint `allotctl`, and what distroless' `cc` base gives a dynamically linked
//!   program (its C libraries, `/etc/passwd` naming `nonroot`, `/tmp`);
//! - the pause image every sandbox runs ([`PAUSE_IMAGE`]): Kubernetes' `pause.c`, from the pinned
//!   Kubernetes module, compiled by `scripts/build-upstream.sh` (it sleeps and reaps zombies),
//!   user 65535 as upstream's;
//! - busybox ([`BUSYBOX_IMAGE`], what the tests' and the README's pods run): Debian's static
//!   build, an applet link each in `/bin`;
//! - Multus's thin plugin ([`MULTUS_IMAGE`]): its three static binaries where the upstream image
//!   has them, for Multus's own DaemonSet manifest.

use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result, bail};

use crate::oci::{Built, ImageBuilder, Process};

/// The sandbox image (containerd's `pinned_images.sandbox`); its version is the one
/// `build/pause/Makefile` of the pinned Kubernetes names.
pub const PAUSE_IMAGE: &str = "registry.k8s.io/pause:3.10.2";
/// What `image: busybox` means.
pub const BUSYBOX_IMAGE: &str = "docker.io/library/busybox:latest";
/// Multus's thin plugin at the pinned version (`tools/multus`).
pub const MULTUS_IMAGE: &str = "ghcr.io/k8snetworkplumbingwg/multus-cni:v4.2.3-thin";
/// What Multus's own manifest (`deployments/multus-daemonset.yml`) names: the same image, so
/// that the manifest applies as published.
pub const MULTUS_MANIFEST_IMAGE: &str = "ghcr.io/k8snetworkplumbingwg/multus-cni:snapshot";

const PASSWD: &str = "root:x:0:0:root:/root:/sbin/nologin\n\
                      nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\n\
                      nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n";
const GROUP: &str = "root:x:0:\nnobody:x:65534:\nnonroot:x:65532:\n";

/// What every image has beside its programs: users, groups, `/tmp`.
fn base(b: &mut ImageBuilder) -> Result<()> {
    b.bytes("/etc/passwd", PASSWD.as_bytes(), 0o644)?
        .bytes("/etc/group", GROUP.as_bytes(), 0o644)?
        .dir("/tmp", 0o1777)?
        .dir("/home/nonroot", 0o755)?
        // As distroless (and Debian) lay it out: containerd names pods' namespaces
        // /var/run/netns/cni-… (CNI_NETNS), which the agent opens through this link and the
        // chart's mount of the node's /run/netns.
        .dir("/run", 0o755)?
        .dir("/var", 0o755)?
        .symlink("/var/run", "/run")?;
    Ok(())
}

/// allot's image from the binaries in `allot_bin` and the default policy component.
pub fn allot(allot_bin: &Path, default_policy: &Path) -> Result<Built> {
    let mut b = ImageBuilder::new(crate::image::ALLOT_IMAGE);
    base(&mut b)?;
    for name in ["allot", "allot-agent", "allot-controller", "allotctl"] {
        let from = allot_bin.join(name);
        if !from.exists() {
            bail!(
                "allot's image needs {}: build it (`cargo build --release`), or point ALLOT_BIN \
                 at the directory holding allot's binaries",
                from.display()
            );
        }
        b.file(&format!("/usr/local/bin/{name}"), &from, 0o755)?
            .libraries_of(&from)?;
    }
    if !default_policy.exists() {
        bail!(
            "allot's image needs the default policy {}: `make policies` builds it",
            default_policy.display()
        );
    }
    b.file(
        "/usr/lib/allot/policies/default.wasm",
        default_policy,
        0o644,
    )?;
    b.process(Process {
        entrypoint: vec!["/usr/local/bin/allotctl".into()],
        cmd: vec!["--help".into()],
        user: Some("65532:65532".into()),
        env: Vec::new(),
    });
    b.build()
}

/// The pause image from `tools/pause`.
pub fn pause(tools: &Path) -> Result<Built> {
    let pause = crate::paths::tool(tools, "pause")?;
    let mut b = ImageBuilder::new(PAUSE_IMAGE);
    b.file("/pause", &pause, 0o755)?.process(Process {
        entrypoint: vec!["/pause".into()],
        user: Some("65535:65535".into()),
        ..Process::default()
    });
    b.build()
}

/// busybox from Debian's static build (`/bin/busybox`, package busybox-static).
pub fn busybox() -> Result<Built> {
    let bin = Path::new("/bin/busybox");
    let out = Command::new(bin).arg("--list").output().with_context(|| {
        format!(
            "{}: install Debian's busybox-static (scripts/setup.sh)",
            bin.display()
        )
    })?;
    if !out.status.success() {
        bail!(
            "{} --list failed: is it Debian's busybox-static?",
            bin.display()
        );
    }
    let mut b = ImageBuilder::new(BUSYBOX_IMAGE);
    base(&mut b)?;
    b.file("/bin/busybox", bin, 0o755)?;
    for applet in String::from_utf8_lossy(&out.stdout).lines() {
        let applet = applet.trim();
        if !applet.is_empty() && applet != "busybox" && !applet.contains('/') {
            b.symlink(&format!("/bin/{applet}"), "busybox")?;
        }
    }
    b.process(Process {
        cmd: vec!["sh".into()],
        ..Process::default()
    });
    b.build()
}

/// Multus's thin plugin image from `tools/{multus, thin_entrypoint, install_multus}`.
pub fn multus(tools: &Path) -> Result<Built> {
    let mut b = ImageBuilder::new(MULTUS_IMAGE);
    base(&mut b)?;
    // install_multus copies both into the node's /opt/cni/bin (the layout of Multus's
    // images/Dockerfile: hack/build-go.sh's output under /usr/src/multus-cni/bin).
    for name in ["multus", "passthru"] {
        b.file(
            &format!("/usr/src/multus-cni/bin/{name}"),
            &crate::paths::tool(tools, name)?,
            0o755,
        )?;
    }
    for name in ["thin_entrypoint", "install_multus"] {
        b.file(
            &format!("/{name}"),
            &crate::paths::tool(tools, name)?,
            0o755,
        )?;
    }
    b.process(Process {
        entrypoint: vec!["/thin_entrypoint".into()],
        ..Process::default()
    });
    Ok(b.build()?.also_as(MULTUS_MANIFEST_IMAGE))
}

/// Every image a real node may run: allot's (when `allot` names its binaries and policy), the
/// pause image, busybox, and Multus's.
pub fn all(tools: &Path, allot: Option<(&Path, &Path)>) -> Result<Vec<Built>> {
    let mut out = vec![pause(tools)?, busybox()?, multus(tools)?];
    if let Some((bin, policy)) = allot {
        out.push(self::allot(bin, policy)?);
    }
    Ok(out)
}

/// Pushes every image to the lab's registry.
pub async fn push_all(registry: &str, images: &[Built]) -> Result<()> {
    for image in images {
        crate::oci::push(registry, image).await?;
    }
    Ok(())
}
