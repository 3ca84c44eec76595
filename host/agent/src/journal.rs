//! The DEL journal: DELs the plugin remembered while the agent was away (see
//! `allot_api::journal`), and DELs the agent remembered while its store was unavailable.
//!
//! An entry is settled under its attachment's lock ([`allot_core::engine::Engine::serialize`]):
//! by an ADD of the same attachment before it is served, and by the replay at start (before the
//! socket accepts anything) and at every tick. A runtime sends the ADD that reuses a container
//! ID only after the DEL was answered, and the DEL was answered only once its entry was
//! written, so an entry present when an ADD arrives is a DEL issued before that ADD: settling it
//! first orders the two exactly, whatever the clocks say (`podman restart` reuses container
//! IDs; a repeated ADD writes nothing; a re-ADD may fall in the DEL's second).

use std::path::Path;

use allot_api::journal;
use allot_core::engine::{AllocError, DelRequest, Serialized};
use allot_core::store::{Attachment, Claim, StoreError};

use crate::server::Shared;

/// Replays every entry of `dir`; returns how many were replayed. An entry the engine cannot
/// take now (the store unavailable) stays for the next tick, or for the ADD of its attachment;
/// one that does not decode is renamed `*.invalid` (kept for the operator, never retried) with
/// an error in the log.
pub fn replay(shared: &Shared, dir: &Path) -> usize {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return 0,
        Err(e) => {
            tracing::warn!(dir = %dir.display(), "cannot read the DEL journal: {e}");
            return 0;
        }
    };
    let mut replayed = 0;
    for entry in entries.filter_map(Result::ok) {
        let path = entry.path();
        if path.extension().and_then(|e| e.to_str()) != Some("json") {
            continue;
        }
        // The attachment is read from the entry, then the entry again under its lock: an ADD of
        // the attachment may have settled it meanwhile.
        let request = match read(&path) {
            Ok(Some(request)) => request,
            Ok(None) => continue,
            Err(e) => {
                tracing::warn!(entry = %path.display(), "cannot read the DEL journal entry: {e}");
                continue;
            }
        };
        let attachment = attachment(&request.attachment);
        let lock = shared.engine.serialize(&attachment);
        match settle_at(shared, &lock, dir) {
            Ok(Some(_)) => replayed += 1,
            Ok(None) => {}
            Err(e) => {
                tracing::warn!(entry = %path.display(), "cannot replay the DEL yet, retrying: {e}")
            }
        }
    }
    replayed
}

/// Settles the DEL remembered for the attachment whose lock `lock` is, if there is one: the
/// DEL is served as it would have been, then its entry removed. `Ok(None)` when nothing was
/// remembered. An error leaves the entry for later, and the caller's ADD must not be served:
/// the DEL comes first.
pub fn settle(shared: &Shared, lock: &Serialized<'_>) -> Result<Option<Vec<Claim>>, AllocError> {
    settle_at(shared, lock, &shared.journal)
}

fn settle_at(
    shared: &Shared,
    lock: &Serialized<'_>,
    dir: &Path,
) -> Result<Option<Vec<Claim>>, AllocError> {
    let held = lock.attachment();
    let path = journal::path_of(dir, &id(held));
    let Some(request) = read(&path).map_err(|e| unavailable(&path, "cannot read", &e))? else {
        return Ok(None);
    };
    if attachment(&request.attachment) != *held {
        tracing::error!(entry = %path.display(), "the entry names another attachment ({}/{}); renamed *.invalid, not replayed", request.attachment.container_id, request.attachment.if_name);
        let _ = std::fs::rename(&path, path.with_extension("invalid"));
        return Ok(None);
    }
    let del = DelRequest {
        attachment: held.clone(),
        owner_replicas: request.owner_replicas,
        issued_at: request.issued_at,
    };
    let touched = crate::server::release_serialized(shared, lock, del)?;
    // Until the entry is gone the DEL would be served again, and a later ADD's claims with it.
    forget_at(dir, held).map_err(|e| unavailable(&path, "replayed, but cannot remove", &e))?;
    let released = touched.iter().filter(|c| c.attachment.is_some()).count();
    tracing::info!(container = %held, released, kept = touched.len() - released, "replayed a DEL the plugin or the agent remembered while it could not be served");
    Ok(Some(touched))
}

/// Removes the entry of `attachment`, if any: a DEL served now supersedes one remembered.
pub fn forget(shared: &Shared, lock: &Serialized<'_>) -> std::io::Result<()> {
    forget_at(&shared.journal, lock.attachment())
}

fn forget_at(dir: &Path, attachment: &Attachment) -> std::io::Result<()> {
    match std::fs::remove_file(journal::path_of(dir, &id(attachment))) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        other => other,
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

fn unavailable(path: &Path, what: &str, e: &std::io::Error) -> AllocError {
    AllocError::Store(StoreError::Unavailable(format!(
        "{what} the DEL journal entry {}: {e}; fix its directory's permissions (the agent's --journal)",
        path.display()
    )))
}

fn attachment(a: &allot_api::AttachmentId) -> Attachment {
    Attachment {
        container_id: a.container_id.clone(),
        interface: a.if_name.clone(),
    }
}

fn id(a: &Attachment) -> allot_api::AttachmentId {
    allot_api::AttachmentId {
        container_id: a.container_id.clone(),
        if_name: a.interface.clone(),
    }
}
