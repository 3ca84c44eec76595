//! Replaying the DELs the plugin remembered while the agent was away (see `allot_cni::journal`):
//! each entry is released as the DEL would have been, except claims made after it was issued
//! (a later ADD of the same attachment), and then removed.

use std::path::Path;

use allot_core::engine::DelRequest;
use allot_core::store::Attachment;

use crate::server::Shared;

/// Replays every entry of `dir`; returns how many were replayed. An entry the engine cannot
/// take now (the store unavailable) stays for the next tick; one that does not decode is
/// renamed `*.invalid` (kept for the operator, never retried) with an error in the log.
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
        let request = match std::fs::read(&path)
            .map_err(|e| e.to_string())
            .and_then(|b| {
                serde_json::from_slice::<allot_api::DelRequest>(&b).map_err(|e| e.to_string())
            }) {
            Ok(r) => r,
            Err(e) => {
                tracing::error!(entry = %path.display(), "not a DEL journal entry ({e}); renamed *.invalid, not replayed");
                let _ = std::fs::rename(&path, path.with_extension("invalid"));
                continue;
            }
        };
        let attachment = Attachment {
            container_id: request.attachment.container_id,
            interface: request.attachment.if_name,
        };
        let del = DelRequest {
            attachment: attachment.clone(),
            owner_replicas: request.owner_replicas,
            issued_at: request.issued_at,
        };
        match crate::server::release(shared, del) {
            Ok(touched) => {
                let released = touched.iter().filter(|c| c.attachment.is_some()).count();
                tracing::info!(container = %attachment, released, kept = touched.len() - released, "replayed a DEL the plugin remembered while the agent was away");
                if let Err(e) = std::fs::remove_file(&path) {
                    tracing::warn!(entry = %path.display(), "replayed, but cannot remove the entry: {e}");
                }
                replayed += 1;
            }
            Err(e) => {
                tracing::warn!(entry = %path.display(), "cannot replay the DEL yet, retrying: {e}")
            }
        }
    }
    replayed
}
