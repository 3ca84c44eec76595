//! Precompiled components on disk, keyed by the component's sha256 and the engine's
//! compatibility hash, so a restart reloads a policy in about a millisecond instead of
//! compiling it again.
//!
//! Deserialising precompiled code is trusted code loading: the directory must be private to
//! this user (mode 0700, owned by us). Anything else and the cache is skipped with a warning.

use std::hash::{DefaultHasher, Hash, Hasher};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use wasmtime::Engine;
use wasmtime::component::Component;

#[derive(Clone, Debug)]
pub struct PrecompiledCache {
    dir: PathBuf,
}

impl PrecompiledCache {
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        PrecompiledCache { dir: dir.into() }
    }

    /// `$ALLOT_CACHE_DIR`, else `$XDG_CACHE_HOME/allot/policies`, else `~/.cache/allot/policies`.
    pub fn default_location() -> Option<Self> {
        if let Some(dir) = std::env::var_os("ALLOT_CACHE_DIR") {
            return Some(Self::new(dir));
        }
        let base = std::env::var_os("XDG_CACHE_HOME")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
        Some(Self::new(base.join("allot").join("policies")))
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn path(&self, engine: &Engine, digest: &str) -> PathBuf {
        let mut h = DefaultHasher::new();
        engine.precompile_compatibility_hash().hash(&mut h);
        self.dir.join(format!("{digest}-{:016x}.cwasm", h.finish()))
    }

    fn private_dir(&self) -> bool {
        match std::fs::metadata(&self.dir) {
            Ok(meta) => {
                // SAFETY-free check: geteuid via the owner of a file we create is overkill; the
                // process's own uid is what `std::os::unix` exposes through metadata of "/proc/self".
                let me = std::fs::metadata("/proc/self").map(|m| m.uid()).ok();
                let private = meta.is_dir()
                    && meta.permissions().mode() & 0o077 == 0
                    && Some(meta.uid()) == me;
                if !private {
                    tracing::warn!(dir = %self.dir.display(), "policy cache directory is not private (0700, ours): not using it");
                }
                private
            }
            Err(_) => false,
        }
    }

    pub(crate) fn get(&self, engine: &Engine, digest: &str) -> Option<Component> {
        let path = self.path(engine, digest);
        if !path.exists() || !self.private_dir() {
            return None;
        }
        // SAFETY: the file was written by `put` into a directory only this user can write, and is
        // named after the sha256 of the component and the engine's compatibility hash.
        match unsafe { Component::deserialize_file(engine, &path) } {
            Ok(c) => Some(c),
            Err(e) => {
                tracing::warn!(path = %path.display(), "discarding unusable precompiled policy: {e:#}");
                let _ = std::fs::remove_file(&path);
                None
            }
        }
    }

    pub(crate) fn put(&self, engine: &Engine, digest: &str, component: &Component) {
        if let Err(e) = self.try_put(engine, digest, component) {
            tracing::warn!(dir = %self.dir.display(), "could not cache the precompiled policy: {e:#}");
        }
    }

    fn try_put(
        &self,
        engine: &Engine,
        digest: &str,
        component: &Component,
    ) -> wasmtime::Result<()> {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&self.dir)?;
        if !self.private_dir() {
            return Ok(());
        }
        let bytes = component.serialize()?;
        let path = self.path(engine, digest);
        let mut tmp = tempfile_in(&self.dir)?;
        tmp.1.write_all(&bytes)?;
        tmp.1.sync_all()?;
        std::fs::rename(&tmp.0, &path)?;
        Ok(())
    }
}

fn tempfile_in(dir: &Path) -> std::io::Result<(PathBuf, std::fs::File)> {
    let path = dir.join(format!(
        ".tmp-{}-{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&path)?;
    Ok((path, file))
}

use std::os::unix::fs::OpenOptionsExt;
