//! The DEL journal's files: DELs the plugin remembered while the agent was away (see
//! `allot_api::journal`), and DELs the agent remembered while its store was unavailable. One
//! file per attachment; what they mean for claims, and when they are settled, is the node's
//! (`Node::settle`, `Node::replay_journal`).

use std::path::{Path, PathBuf};

use allot_api::journal;
use allot_core::store::Attachment;
use allot_engine::DelRequest;

use crate::wire::{attachment, attachment_id as id};

/// The journal directory (the agent's `--journal`, the plugin's ipam `journal`).
#[derive(Clone, Debug)]
pub struct Journal {
    dir: PathBuf,
}

/// Why an entry could not be read or removed: the DEL stays remembered, and whatever depends on
/// it waiting (an ADD of its attachment) must wait too.
#[derive(Debug, thiserror::Error)]
#[error("{what} the DEL journal entry {}: {source}; fix its directory's permissions (the agent's --journal)", path.display())]
pub struct EntryError {
    what: &'static str,
    path: PathBuf,
    #[source]
    source: std::io::Error,
}

impl Journal {
    pub fn new(dir: impl Into<PathBuf>) -> Journal {
        Journal { dir: dir.into() }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The attachments that have an entry, as the entries themselves name them. An entry that
    /// does not decode is renamed `*.invalid` (kept for the operator, never replayed).
    pub fn pending(&self) -> Vec<Attachment> {
        let entries = match std::fs::read_dir(&self.dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Vec::new(),
            Err(e) => {
                tracing::warn!(dir = %self.dir.display(), "cannot read the DEL journal: {e}");
                return Vec::new();
            }
        };
        let mut pending = Vec::new();
        for entry in entries.filter_map(Result::ok) {
            let path = entry.path();
            if path.extension().and_then(|e| e.to_str()) != Some("json") {
                continue;
            }
            match read(&path) {
                Ok(Some(request)) => pending.push(attachment(&request.attachment)),
                Ok(None) => {}
                Err(e) => {
                    tracing::warn!(entry = %path.display(), "cannot read the DEL journal entry: {e}")
                }
            }
        }
        pending
    }

    /// The DEL remembered for `held`, if any. An entry naming another attachment than its file
    /// name says is renamed `*.invalid` and not served.
    pub fn entry(&self, held: &Attachment) -> Result<Option<DelRequest>, EntryError> {
        let path = journal::path_of(&self.dir, &id(held));
        let Some(request) = read(&path).map_err(|source| EntryError {
            what: "cannot read",
            path: path.clone(),
            source,
        })?
        else {
            return Ok(None);
        };
        if attachment(&request.attachment) != *held {
            tracing::error!(entry = %path.display(), "the entry names another attachment ({}/{}); renamed *.invalid, not replayed", request.attachment.container_id, request.attachment.if_name);
            let _ = std::fs::rename(&path, path.with_extension("invalid"));
            return Ok(None);
        }
        Ok(Some(DelRequest {
            attachment: held.clone(),
            owner_replicas: request.owner_replicas,
            issued_at: request.issued_at,
        }))
    }

    /// Removes the entry of `attachment`, if any.
    pub fn forget(&self, attachment: &Attachment) -> Result<(), EntryError> {
        let path = journal::path_of(&self.dir, &id(attachment));
        match std::fs::remove_file(&path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(source) => Err(EntryError {
                what: "cannot remove",
                path,
                source,
            }),
            Ok(()) => Ok(()),
        }
    }

    /// Remembers `request` (a DEL the store could not take now). `None` when its attachment
    /// cannot name a file of the journal (empty, `.`, `..` or with a `/`).
    pub fn remember(&self, request: &allot_api::DelRequest) -> Option<std::io::Result<PathBuf>> {
        let safe = |s: &str| !s.is_empty() && !s.contains('/') && s != "." && s != "..";
        let a = &request.attachment;
        (safe(&a.container_id) && safe(&a.if_name)).then(|| journal::record(&self.dir, request))
    }
}

/// The entry at `path`, or `None` when there is none or it does not decode (then renamed
/// `*.invalid`, kept for the operator).
fn read(path: &Path) -> std::io::Result<Option<allot_api::DelRequest>> {
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    match serde_json::from_slice::<allot_api::DelRequest>(&bytes) {
        Ok(r) => Ok(Some(r)),
        Err(e) => {
            tracing::error!(entry = %path.display(), "not a DEL journal entry ({e}); renamed *.invalid, not replayed");
            let _ = std::fs::rename(path, path.with_extension("invalid"));
            Ok(None)
        }
    }
}
