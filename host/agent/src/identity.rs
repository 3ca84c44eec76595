//! Who this node is: the name pools' `nodeName` and `nodeAffinity` match, and the identity its
//! claims record. The CNI GC verb judges the claims that record this node's identity against
//! the attachments its runtime lists, which are this node's alone: two nodes sharing a store
//! under one identity would release each other's live claims. So on a shared store (etcd) a
//! node that was not given a name keeps an identity of its own, generated once, in its state
//! directory; its hostname (which clones share, and which may be `localhost`) stays the name
//! the policy sees.

use std::io::Write as _;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use anyhow::{Context as _, bail};

/// This machine's hostname, `localhost` when it has none.
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".into())
}

/// The file, in the directory of the agent's `--state`, that keeps the node's identity.
pub const IDENTITY_FILE: &str = "node-id";

/// The node's name and the identity of its claims.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeIdentity {
    /// What the policy matches pools' `nodeName` and `nodeAffinity` against.
    pub name: String,
    /// What its claims record as their node ([`allot_core::store::Claim::node`]).
    pub claims_as: String,
    /// Where `claims_as` is kept, when it is generated rather than the name.
    pub kept_in: Option<PathBuf>,
}

/// The identity of a node given `--node-name` (`explicit`), or else named `hostname`. An
/// explicit name is the claims' identity too: the operator names each node once, as Kubernetes
/// does (cluster mode passes the Node's name, which the API server keeps unique, and which the
/// controller reads in claims). Without one, a node given a `state_dir` (its store is shared
/// with nodes whose names nothing keeps apart: etcd) claims as an identity of its own kept
/// there, generated at its first start; one given none (a SQLite store, which no other node
/// writes) claims as its hostname, as it did before.
pub fn resolve(
    explicit: Option<&str>,
    hostname: &str,
    state_dir: Option<&Path>,
) -> anyhow::Result<NodeIdentity> {
    if let Some(name) = explicit {
        if name.trim().is_empty() {
            bail!("--node-name is empty: give this node's name, or leave the flag out");
        }
        return Ok(NodeIdentity {
            name: name.to_string(),
            claims_as: name.to_string(),
            kept_in: None,
        });
    }
    let Some(dir) = state_dir else {
        return Ok(NodeIdentity {
            name: hostname.to_string(),
            claims_as: hostname.to_string(),
            kept_in: None,
        });
    };
    let file = dir.join(IDENTITY_FILE);
    Ok(NodeIdentity {
        name: hostname.to_string(),
        claims_as: kept(&file)?,
        kept_in: Some(file),
    })
}

/// The identity kept in `file`, generated (a random UUID) and kept there when there is none.
/// Two agents starting at once on one state directory agree: the file is linked into place
/// only if absent, and the loser reads the winner's.
fn kept(file: &Path) -> anyhow::Result<String> {
    let fix = "pass --node-name NAME (unique among the nodes sharing the store), or fix the \
               directory's permissions";
    if let Some(id) = read(file)? {
        return Ok(id);
    }
    let dir = file.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)
        .with_context(|| format!("creating {} for this node's identity; {fix}", dir.display()))?;
    let generated = std::fs::read_to_string("/proc/sys/kernel/random/uuid")
        .context("generating this node's identity from /proc/sys/kernel/random/uuid")?
        .trim()
        .to_string();
    let tmp = dir.join(format!(".{IDENTITY_FILE}.{generated}.tmp"));
    let written = write_synced(&tmp, &generated).and_then(|()| {
        let linked = std::fs::hard_link(&tmp, file);
        let _ = std::fs::remove_file(&tmp);
        match linked {
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
            other => other,
        }
    });
    written
        .with_context(|| format!("keeping this node's identity in {}; {fix}", file.display()))?;
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
    match read(file)? {
        Some(id) => Ok(id),
        None => bail!("{} vanished as it was written; {fix}", file.display()),
    }
}

/// The identity in `file`, `None` when there is no file.
fn read(file: &Path) -> anyhow::Result<Option<String>> {
    let text = match std::fs::read_to_string(file) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => {
            return Err(e).with_context(|| {
                format!(
                    "reading this node's identity from {}; fix its permissions, or pass \
                     --node-name NAME",
                    file.display()
                )
            });
        }
    };
    let id = text.trim();
    let valid = !id.is_empty()
        && id.len() <= 253
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_'));
    if !valid {
        bail!(
            "{} does not hold a node identity (one line of letters, digits, '-', '.', '_'): \
             restore it, or remove it to have a new one generated (this node's CNI GC then \
             leaves the claims it made under the old one alone: they are released by their \
             DEL), or pass --node-name NAME",
            file.display()
        );
    }
    Ok(Some(id.to_string()))
}

fn write_synced(path: &Path, text: &str) -> std::io::Result<()> {
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o644)
        .open(path)?;
    writeln!(file, "{text}")?;
    file.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_explicit_name_is_both_the_name_and_the_claims_identity() {
        let dir = tempfile::tempdir().unwrap();
        for state_dir in [None, Some(dir.path())] {
            let id = resolve(Some("node-a"), "host", state_dir).unwrap();
            assert_eq!(
                (id.name.as_str(), id.claims_as.as_str()),
                ("node-a", "node-a")
            );
        }
        assert!(
            !dir.path().join(IDENTITY_FILE).exists(),
            "nothing generated"
        );
        let e = resolve(Some(" "), "host", Some(dir.path())).unwrap_err();
        assert!(e.to_string().contains("--node-name"), "{e}");
    }

    #[test]
    fn a_store_of_its_own_claims_as_the_hostname() {
        let id = resolve(None, "host", None).unwrap();
        assert_eq!((id.name.as_str(), id.claims_as.as_str()), ("host", "host"));
        assert_eq!(id.kept_in, None);
    }

    /// Two machines that share a hostname, each with its state directory: the policy sees the
    /// hostname on both, and their claims record identities that differ and last.
    #[test]
    fn nodes_named_alike_on_a_shared_store_claim_as_themselves() {
        let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let on_a = resolve(None, "localhost", Some(&a.path().join("state"))).unwrap();
        let on_b = resolve(None, "localhost", Some(b.path())).unwrap();
        assert_eq!(
            (on_a.name.as_str(), on_b.name.as_str()),
            ("localhost", "localhost")
        );
        assert_ne!(on_a.claims_as, on_b.claims_as);
        assert_ne!(on_a.claims_as, "localhost");
        let again = resolve(None, "renamed", Some(&a.path().join("state"))).unwrap();
        assert_eq!(
            again.claims_as, on_a.claims_as,
            "kept across restarts and renames"
        );
        assert_eq!(again.name, "renamed");
        assert_eq!(
            again.kept_in.as_deref(),
            Some(a.path().join("state").join(IDENTITY_FILE).as_path())
        );
    }

    #[test]
    fn agents_starting_together_agree() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join(IDENTITY_FILE);
        let ids: Vec<String> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..8).map(|_| s.spawn(|| kept(&file).unwrap())).collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert!(ids.iter().all(|id| *id == ids[0]), "{ids:?}");
        let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(left.len(), 1, "no temporary files left");
    }

    #[test]
    fn a_damaged_identity_is_refused_with_what_to_do() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join(IDENTITY_FILE);
        std::fs::write(&file, "two words\n").unwrap();
        let e = resolve(None, "host", Some(dir.path()))
            .unwrap_err()
            .to_string();
        assert!(e.contains("remove it") && e.contains("--node-name"), "{e}");
        assert_eq!(
            std::fs::read_to_string(&file).unwrap(),
            "two words\n",
            "left alone"
        );
    }
}
