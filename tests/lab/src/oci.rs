//! OCI images for the lab's real nodes, written from this machine's files: no container builder
//! runs here, and an image needs none. An image is one layer (an uncompressed tar,
//! `application/vnd.oci.image.layer.v1.tar`) and a configuration (the OCI image spec's
//! `config`: architecture, os, the layer's diff ID, Entrypoint, Cmd, User, Env); [`push`] puts
//! it in the lab's registry ([`crate::registry`]), from which every node's containerd pulls it
//! as from any registry (the kubelet asks, by the pod's pull policy).
//!
//! The images ([`crate::images`]): allot's (the Dockerfile's layout), the pause image (built from
//! Kubernetes' own source), busybox (Debian's static build) and Multus's thin plugin.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};
use oci_client::client::{ClientConfig, ClientProtocol, Config, ImageLayer};
use oci_client::manifest::OciImageManifest;
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference};
use serde_json::json;
use sha2::{Digest, Sha256};

const LAYER_MEDIA_TYPE: &str = "application/vnd.oci.image.layer.v1.tar";
const CONFIG_MEDIA_TYPE: &str = "application/vnd.oci.image.config.v1+json";

/// What a path of the image is.
#[derive(Debug, Clone)]
enum Entry {
    /// A file, copied from this machine (or given), with its mode.
    File {
        from: Source,
        mode: u32,
    },
    Dir {
        mode: u32,
    },
    Symlink {
        target: String,
    },
}

#[derive(Debug, Clone)]
enum Source {
    Path(PathBuf),
    Bytes(Vec<u8>),
}

/// An image's process, as the OCI image spec's `config` says it.
#[derive(Debug, Clone, Default)]
pub struct Process {
    pub entrypoint: Vec<String>,
    pub cmd: Vec<String>,
    /// `uid:gid`, numeric.
    pub user: Option<String>,
    pub env: Vec<String>,
}

/// An image being written: its reference (as pods name it) and its files.
#[derive(Debug, Clone)]
pub struct ImageBuilder {
    reference: String,
    entries: BTreeMap<String, Entry>,
    process: Process,
}

/// A written image: its layer and configuration, ready to push.
#[derive(Debug, Clone)]
pub struct Built {
    /// As pods name it, normalized (`docker.io/library/busybox:latest`).
    pub reference: String,
    /// More references of the same image (normalized).
    pub also: Vec<String>,
    pub layer: Vec<u8>,
    pub config: Vec<u8>,
}

fn relative(path: &str) -> Result<String> {
    let rel = path.trim_start_matches('/');
    if rel.is_empty() || rel.split('/').any(|c| c.is_empty() || c == "..") {
        bail!("{path:?}: not a path of an image");
    }
    Ok(rel.to_string())
}

impl ImageBuilder {
    pub fn new(reference: &str) -> ImageBuilder {
        ImageBuilder {
            reference: crate::image::normalize(reference),
            entries: BTreeMap::new(),
            process: Process {
                env: vec![
                    "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into(),
                ],
                ..Process::default()
            },
        }
    }

    /// The file `from` of this machine at `path` (following links), with `mode`.
    pub fn file(&mut self, path: &str, from: &Path, mode: u32) -> Result<&mut Self> {
        if !from.is_file() {
            bail!(
                "{}: missing, for {path} of image {}",
                from.display(),
                self.reference
            );
        }
        let from = Source::Path(from.to_path_buf());
        self.entries
            .insert(relative(path)?, Entry::File { from, mode });
        Ok(self)
    }

    /// `data` as the file `path`.
    pub fn bytes(&mut self, path: &str, data: &[u8], mode: u32) -> Result<&mut Self> {
        let from = Source::Bytes(data.to_vec());
        self.entries
            .insert(relative(path)?, Entry::File { from, mode });
        Ok(self)
    }

    pub fn dir(&mut self, path: &str, mode: u32) -> Result<&mut Self> {
        self.entries.insert(relative(path)?, Entry::Dir { mode });
        Ok(self)
    }

    pub fn symlink(&mut self, path: &str, target: &str) -> Result<&mut Self> {
        let target = target.to_string();
        self.entries
            .insert(relative(path)?, Entry::Symlink { target });
        Ok(self)
    }

    /// The shared libraries `binary` loads (as `ldd` resolves them on this machine, whose
    /// libraries the nodes' kernel and C library are) at their paths, links kept as links: what
    /// a distroless `cc` base image gives a dynamically linked program.
    pub fn libraries_of(&mut self, binary: &Path) -> Result<&mut Self> {
        let out = Command::new("ldd")
            .arg(binary)
            .output()
            .with_context(|| format!("ldd {}", binary.display()))?;
        let text = String::from_utf8_lossy(&out.stdout);
        if text.contains("not a dynamic executable") || text.contains("statically linked") {
            return Ok(self);
        }
        if !out.status.success() {
            bail!(
                "ldd {}: {}",
                binary.display(),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        for line in text.lines() {
            // "libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x…)" or "/lib64/ld-linux-x86-64.so.2 (0x…)"
            let path = match line.split_once("=>") {
                Some((_, rest)) => rest.split_whitespace().next(),
                None => line
                    .split_whitespace()
                    .next()
                    .filter(|p| p.starts_with('/')),
            };
            let Some(path) = path.filter(|p| p.starts_with('/')) else {
                continue;
            };
            self.with_links(Path::new(path))?;
        }
        Ok(self)
    }

    /// `path` of this machine and, if it is a link, what it leads to, each at its own path.
    fn with_links(&mut self, path: &Path) -> Result<()> {
        let text = path.to_str().context("a library path that is not UTF-8")?;
        let meta = fs::symlink_metadata(path).with_context(|| format!("{}", path.display()))?;
        if meta.file_type().is_symlink() {
            let target = fs::read_link(path)?;
            // Resolved as the image resolves it: lexically, from the link's own directory
            // (which is a directory in the image even where it is a link on this machine).
            let resolved = match target.is_absolute() {
                true => target.clone(),
                false => lexical(&path.parent().unwrap_or(Path::new("/")).join(&target)),
            };
            self.symlink(text, target.to_str().context("a link that is not UTF-8")?)?;
            return self.with_links(&resolved);
        }
        // A library under a linked directory (/lib64 → usr/lib64 on merged-/usr systems) is
        // written at its own path; the loader's path must exist as named.
        self.file(text, path, 0o755)?;
        Ok(())
    }

    pub fn process(&mut self, process: Process) -> &mut Self {
        self.process = Process {
            env: if process.env.is_empty() {
                self.process.env.clone()
            } else {
                process.env
            },
            ..process
        };
        self
    }

    /// The layer (parents of every path made as directories, owned by root, times zero: the
    /// same files make the same layer) and the configuration.
    pub fn build(&self) -> Result<Built> {
        let mut entries = self.entries.clone();
        let mut parents = Vec::new();
        for path in entries.keys() {
            let mut p = Path::new(path).parent();
            while let Some(dir) = p.filter(|d| !d.as_os_str().is_empty()) {
                parents.push(dir.to_str().expect("made from a str").to_string());
                p = dir.parent();
            }
        }
        for dir in parents {
            entries.entry(dir).or_insert(Entry::Dir { mode: 0o755 });
        }
        let mut tar = tar::Builder::new(Vec::new());
        for (path, entry) in &entries {
            let mut header = tar::Header::new_ustar();
            header.set_uid(0);
            header.set_gid(0);
            header.set_mtime(0);
            match entry {
                Entry::Dir { mode } => {
                    header.set_entry_type(tar::EntryType::Directory);
                    header.set_mode(*mode);
                    header.set_size(0);
                    tar.append_data(&mut header, format!("{path}/"), std::io::empty())?;
                }
                Entry::Symlink { target } => {
                    header.set_entry_type(tar::EntryType::Symlink);
                    header.set_mode(0o777);
                    header.set_size(0);
                    tar.append_link(&mut header, path, target)?;
                }
                Entry::File { from, mode } => {
                    let data = match from {
                        Source::Bytes(b) => b.clone(),
                        Source::Path(p) => {
                            fs::read(p).with_context(|| format!("reading {}", p.display()))?
                        }
                    };
                    header.set_entry_type(tar::EntryType::Regular);
                    header.set_mode(*mode);
                    header.set_size(data.len() as u64);
                    tar.append_data(&mut header, path, data.as_slice())?;
                }
            }
        }
        let layer = tar.into_inner()?;
        let diff_id = sha256(&layer);
        let p = &self.process;
        let mut config = json!({
            "architecture": "amd64",
            "os": "linux",
            "rootfs": {"type": "layers", "diff_ids": [diff_id]},
            "config": {"Env": p.env},
        });
        if !p.entrypoint.is_empty() {
            config["config"]["Entrypoint"] = json!(p.entrypoint);
        }
        if !p.cmd.is_empty() {
            config["config"]["Cmd"] = json!(p.cmd);
        }
        if let Some(user) = &p.user {
            config["config"]["User"] = json!(user);
        }
        Ok(Built {
            reference: self.reference.clone(),
            also: Vec::new(),
            layer,
            config: serde_json::to_vec(&config)?,
        })
    }
}

/// `path` with `.` and `..` resolved by name.
fn lexical(path: &Path) -> PathBuf {
    let mut out = PathBuf::from("/");
    for c in path.components() {
        match c {
            std::path::Component::ParentDir => {
                out.pop();
            }
            std::path::Component::Normal(n) => out.push(n),
            _ => {}
        }
    }
    out
}

fn sha256(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
}

/// Where `reference` (normalized: `HOST/REPO:TAG`) lives in the lab's registry at `registry`:
/// under a path named after its upstream host (`docker.io/library/busybox:latest` is
/// `REGISTRY/docker.io/library/busybox:latest`), which each node's containerd maps back with a
/// mirror of that host (`override_path`, see [`crate::realnode::containerd`]).
pub fn mirrored(registry: &str, reference: &str) -> String {
    format!("{registry}/{reference}")
}

impl Built {
    /// The same image under another reference too.
    pub fn also_as(mut self, reference: &str) -> Built {
        self.also.push(crate::image::normalize(reference));
        self
    }
}

/// Pushes `image` (under each of its references) to the lab's registry at `registry`
/// (`HOST:PORT`, plain HTTP).
pub async fn push(registry: &str, image: &Built) -> Result<()> {
    for reference in std::iter::once(&image.reference).chain(&image.also) {
        push_as(registry, image, reference).await?;
    }
    Ok(())
}

async fn push_as(registry: &str, image: &Built, reference: &str) -> Result<()> {
    // oci-client's reqwest uses rustls without a provider of its own: ring, as kube's does.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let target = mirrored(registry, reference);
    let reference: Reference = target
        .parse()
        .with_context(|| format!("{target}: not an image reference"))?;
    let client = Client::new(ClientConfig {
        protocol: ClientProtocol::Http,
        ..ClientConfig::default()
    });
    let layers = [ImageLayer::new(
        image.layer.clone(),
        LAYER_MEDIA_TYPE.to_string(),
        None,
    )];
    let config = Config::new(image.config.clone(), CONFIG_MEDIA_TYPE.to_string(), None);
    let manifest = OciImageManifest::build(&layers, &config, None);
    client
        .push(
            &reference,
            &layers,
            config,
            &RegistryAuth::Anonymous,
            Some(manifest),
        )
        .await
        .with_context(|| format!("pushing {reference} to the lab's registry ({target})"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entries(layer: &[u8]) -> Vec<(String, tar::EntryType, u32, Option<String>)> {
        let mut archive = tar::Archive::new(layer);
        archive
            .entries()
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                let h = e.header();
                (
                    e.path()
                        .unwrap()
                        .to_string_lossy()
                        .trim_end_matches('/')
                        .to_string(),
                    h.entry_type(),
                    h.mode().unwrap(),
                    e.link_name()
                        .unwrap()
                        .map(|l| l.to_string_lossy().to_string()),
                )
            })
            .collect()
    }

    #[test]
    fn a_layer_holds_every_file_with_its_parents_and_is_the_same_each_time() {
        let mut b = ImageBuilder::new("localhost/test:1");
        b.bytes("/usr/local/bin/tool", b"#!/bin/true\n", 0o755)
            .unwrap()
            .symlink("/bin/t", "/usr/local/bin/tool")
            .unwrap()
            .dir("/tmp", 0o1777)
            .unwrap()
            .process(Process {
                entrypoint: vec!["/usr/local/bin/tool".into()],
                user: Some("65532:65532".into()),
                ..Process::default()
            });
        let built = b.build().unwrap();
        assert_eq!(built.reference, "localhost/test:1");
        let seen = entries(&built.layer);
        let names: Vec<&str> = seen.iter().map(|e| e.0.as_str()).collect();
        assert_eq!(
            names,
            [
                "bin",
                "bin/t",
                "tmp",
                "usr",
                "usr/local",
                "usr/local/bin",
                "usr/local/bin/tool"
            ]
        );
        assert!(seen.contains(&("tmp".into(), tar::EntryType::Directory, 0o1777, None)));
        assert!(seen.contains(&(
            "bin/t".into(),
            tar::EntryType::Symlink,
            0o777,
            Some("/usr/local/bin/tool".into())
        )));
        let config: serde_json::Value = serde_json::from_slice(&built.config).unwrap();
        assert_eq!(config["rootfs"]["diff_ids"][0], sha256(&built.layer));
        assert_eq!(config["config"]["User"], "65532:65532");
        assert_eq!(
            b.build().unwrap().layer,
            built.layer,
            "the same files, the same layer"
        );
        assert!(b.bytes("/a/../b", b"", 0o644).is_err());
    }

    #[test]
    fn a_dynamic_binary_brings_its_libraries() {
        let mut b = ImageBuilder::new("localhost/ls:1");
        b.file("/bin/ls", Path::new("/bin/ls"), 0o755)
            .unwrap()
            .libraries_of(Path::new("/bin/ls"))
            .unwrap();
        let built = b.build().unwrap();
        let names: Vec<String> = entries(&built.layer).into_iter().map(|e| e.0).collect();
        assert!(names.iter().any(|n| n.contains("libc.so")), "{names:?}");
        assert!(names.iter().any(|n| n.contains("ld-linux")), "{names:?}");
    }
}
