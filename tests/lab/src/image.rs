//! Images the node stand-ins run as real processes. An image is a directory: `config.json`
//! (the part of an OCI image configuration a container start needs: Entrypoint, Cmd, User,
//! Env, WorkingDir) and `rootfs/` (the files the image adds; every other path is the machine's,
//! which stands in for the image's base layers).
//!
//! allot's image is made from the build, with the layout of the repository's Dockerfile.

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};

/// The reference under which the lab offers allot's image.
pub const ALLOT_IMAGE: &str = "localhost/allot:dev";

/// What a container start takes from an image's configuration (OCI image spec, "config").
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct ImageConfig {
    #[serde(default)]
    pub entrypoint: Vec<String>,
    #[serde(default)]
    pub cmd: Vec<String>,
    /// `uid[:gid]`, numeric.
    #[serde(default)]
    pub user: Option<String>,
    /// `KEY=value` entries.
    #[serde(default)]
    pub env: Vec<String>,
    #[serde(default)]
    pub working_dir: Option<String>,
}

impl ImageConfig {
    /// The user and group of `User` (numeric only; a name would need the image's passwd).
    pub fn uid_gid(&self) -> Result<(Option<u32>, Option<u32>)> {
        let Some(user) = self.user.as_deref().filter(|u| !u.is_empty()) else {
            return Ok((None, None));
        };
        let (u, g) = match user.split_once(':') {
            Some((u, g)) => (u, Some(g)),
            None => (user, None),
        };
        let uid = u
            .parse()
            .with_context(|| format!("image User {user:?}: only numeric users are supported"))?;
        let gid = g
            .map(|g| g.parse())
            .transpose()
            .with_context(|| format!("image User {user:?}: only numeric groups are supported"))?;
        Ok((Some(uid), gid))
    }
}

/// An image available to the node stand-ins.
#[derive(Debug, Clone)]
pub struct Image {
    /// Normalized reference (see [`normalize`]).
    pub reference: String,
    pub rootfs: PathBuf,
    pub config: ImageConfig,
    /// The image's files, relative to `rootfs` (each bind-mounted at its path in a container).
    pub files: Vec<PathBuf>,
}

impl Image {
    /// Loads the image in `dir` (`config.json` and `rootfs/`).
    pub fn load(reference: &str, dir: &Path) -> Result<Image> {
        let config_path = dir.join("config.json");
        let config: ImageConfig =
            serde_json::from_slice(&fs::read(&config_path).with_context(|| {
                format!("image {reference}: reading {}", config_path.display())
            })?)
            .with_context(|| format!("image {reference}: parsing {}", config_path.display()))?;
        let rootfs = dir.join("rootfs");
        let mut files = Vec::new();
        walk_files(&rootfs, Path::new(""), &mut files)
            .with_context(|| format!("image {reference}: listing {}", rootfs.display()))?;
        Ok(Image {
            reference: normalize(reference),
            rootfs,
            config,
            files,
        })
    }
}

fn walk_files(root: &Path, rel: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    for entry in fs::read_dir(root.join(rel))? {
        let entry = entry?;
        let rel = rel.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            walk_files(root, &rel, out)?;
        } else {
            out.push(rel);
        }
    }
    Ok(())
}

/// A reference as container runtimes compare them: a registry (`docker.io` when the first
/// component is not a host), `library/` for official images, a tag (`latest` when none).
pub fn normalize(reference: &str) -> String {
    let (name, suffix) = match reference.split_once('@') {
        Some((n, digest)) => (n, format!("@{digest}")),
        None => {
            let last = reference.rsplit('/').next().unwrap_or(reference);
            if last.contains(':') {
                (reference, String::new())
            } else {
                (reference, ":latest".to_string())
            }
        }
    };
    let first = name.split('/').next().unwrap_or(name);
    let has_registry =
        name.contains('/') && (first.contains('.') || first.contains(':') || first == "localhost");
    let name = if has_registry {
        name.to_string()
    } else if name.contains('/') {
        format!("docker.io/{name}")
    } else {
        format!("docker.io/library/{name}")
    };
    format!("{name}{suffix}")
}

/// Writes allot's image into `dest` from the binaries in `allot_bin` and the default policy
/// component, as the Dockerfile lays it out: `/usr/local/bin/{allot, allot-agent,
/// allot-controller, allotctl}`, `/usr/lib/allot/policies/default.wasm`, user 65532,
/// entrypoint allotctl. Files are hard links when possible (the image keeps the build it was
/// made from, as an image would), else copies.
pub fn build_allot_image(dest: &Path, allot_bin: &Path, default_policy: &Path) -> Result<()> {
    let bin = dest.join("rootfs/usr/local/bin");
    let policies = dest.join("rootfs/usr/lib/allot/policies");
    fs::create_dir_all(&bin)?;
    fs::create_dir_all(&policies)?;
    let mut missing = Vec::new();
    let mut files: Vec<(PathBuf, PathBuf)> =
        ["allot", "allot-agent", "allot-controller", "allotctl"]
            .iter()
            .map(|name| (allot_bin.join(name), bin.join(name)))
            .collect();
    files.push((default_policy.to_path_buf(), policies.join("default.wasm")));
    for (from, _) in &files {
        if !from.exists() {
            missing.push(from.display().to_string());
        }
    }
    if !missing.is_empty() {
        bail!(
            "allot's image needs {}: build them (`cargo build --release -p allot-cni -p \
             allot-agent -p allot-controller -p allot-cli`, and `make policies` for the default \
             policy), or point ALLOT_BIN at the directory holding them",
            missing.join(", ")
        );
    }
    for (from, to) in &files {
        if fs::hard_link(from, to).is_err() {
            fs::copy(from, to)
                .with_context(|| format!("copying {} to {}", from.display(), to.display()))?;
        }
    }
    let config = ImageConfig {
        entrypoint: vec!["/usr/local/bin/allotctl".into()],
        cmd: vec!["--help".into()],
        user: Some("65532:65532".into()),
        env: vec!["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into()],
        working_dir: None,
    };
    fs::write(
        dest.join("config.json"),
        serde_json::to_vec_pretty(&config)?,
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::normalize;

    #[test]
    fn references_compare_as_runtimes_compare_them() {
        assert_eq!(normalize("busybox"), "docker.io/library/busybox:latest");
        assert_eq!(normalize("busybox:1.36"), "docker.io/library/busybox:1.36");
        assert_eq!(
            normalize("library/busybox"),
            "docker.io/library/busybox:latest"
        );
        assert_eq!(normalize("localhost/allot:dev"), "localhost/allot:dev");
        assert_eq!(
            normalize("localhost:5000/allot"),
            "localhost:5000/allot:latest"
        );
        assert_eq!(
            normalize("ghcr.io/allot-ipam/allot:0.1.0"),
            "ghcr.io/allot-ipam/allot:0.1.0"
        );
        assert_eq!(
            normalize("registry.k8s.io/pause@sha256:ab"),
            "registry.k8s.io/pause@sha256:ab"
        );
    }
}
