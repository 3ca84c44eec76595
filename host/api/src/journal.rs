//! The DEL journal: a DEL the agent could not take (down, restarting, stuck) is remembered in
//! a small file for the agent to replay when it is back, so that no runtime GC is needed to
//! avoid a leak (containerd never calls GC). One file per attachment,
//! `CONTAINERID@IFNAME.json`, holding an [`allot_api::DelRequest`] with the time it was issued:
//! the agent leaves alone claims made after it (a later ADD of the same attachment).

use std::io::Write as _;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use crate::{AttachmentId, DelRequest};

/// The file remembering the DEL of this attachment. Container IDs and interface names are
/// validated before (no `/`, not `.` or `..`), so the name stays inside `dir`.
pub fn entry_path(dir: &Path, request: &DelRequest) -> PathBuf {
    path_of(dir, &request.attachment)
}

/// The file that remembers a DEL of `attachment`, whether or not there is one.
pub fn path_of(dir: &Path, attachment: &AttachmentId) -> PathBuf {
    dir.join(format!(
        "{}@{}.json",
        attachment.container_id, attachment.if_name
    ))
}

/// Writes `request` into `dir` atomically (a temporary file renamed into place), creating the
/// directory (mode 0700) if needed. A later DEL of the same attachment replaces the entry.
pub fn record(dir: &Path, request: &DelRequest) -> std::io::Result<PathBuf> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    let path = entry_path(dir, request);
    let tmp = dir.join(format!(
        ".{}.{}.tmp",
        path.file_name().and_then(|n| n.to_str()).unwrap_or("entry"),
        std::process::id()
    ));
    let body = serde_json::to_vec(request).map_err(std::io::Error::other)?;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)?;
    file.write_all(&body)?;
    file.sync_all()?;
    drop(file);
    std::fs::rename(&tmp, &path)?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_are_written_whole_and_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let journal = dir.path().join("var/lib/allot/journal");
        let mut request = DelRequest {
            attachment: AttachmentId {
                container_id: "c1".into(),
                if_name: "eth0".into(),
            },
            owner_replicas: Some(2),
            issued_at: Some(100),
            monotonic_deadline_ms: None,
        };
        let path = record(&journal, &request).unwrap();
        assert_eq!(path, journal.join("c1@eth0.json"));
        request.issued_at = Some(200);
        record(&journal, &request).unwrap();
        let entries: Vec<_> = std::fs::read_dir(&journal).unwrap().collect();
        assert_eq!(entries.len(), 1, "no temporary files left");
        let read: DelRequest = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        assert_eq!(read, request);
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&journal).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700);
    }
}
