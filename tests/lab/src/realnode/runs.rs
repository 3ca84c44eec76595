//! What a real node's containerd says of its pod sandboxes, from its log: when each
//! `RunPodSandbox` began and ended (the pause container's start and the CNI ADD through the
//! node's configuration), and whether it failed. What a test asks of how long pods waited for
//! their network, and which sandboxes failed, on a real node (the stand-in notes its own ADDs,
//! `crate::node::cni::ADD_LOG`).
//!
//! containerd 2.x writes, for one sandbox (logfmt, `internal/cri/server/sandbox_run.go`):
//! `msg="RunPodSandbox for name:\"web-0\"  uid:\"…\"  namespace:\"web\""`, then the same
//! followed by `returns sandbox id \"…\"`, or at level error `… failed, error` with
//! `error="…"`.

use std::collections::HashMap;
use std::path::Path;

/// One `RunPodSandbox`.
#[derive(Debug, Clone, PartialEq)]
pub struct SandboxRun {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    /// From its start to its end.
    pub seconds: f64,
    /// Why it failed, if it did.
    pub error: Option<String>,
}

/// The value of `key` in a logfmt line (quoted, with `\"` escapes, or bare).
fn field(line: &str, key: &str) -> Option<String> {
    let start = line.find(&format!("{key}="))? + key.len() + 1;
    let rest = &line[start..];
    if let Some(quoted) = rest.strip_prefix('"') {
        let mut out = String::new();
        let mut chars = quoted.chars();
        while let Some(c) = chars.next() {
            match c {
                '\\' => out.push(chars.next()?),
                '"' => return Some(out),
                c => out.push(c),
            }
        }
        None
    } else {
        Some(rest.split_whitespace().next()?.to_string())
    }
}

/// The pod a `RunPodSandbox for name:"…" uid:"…" namespace:"…"` message names.
fn pod(msg: &str) -> Option<(String, String, String)> {
    let value = |key: &str| -> Option<String> {
        let start = msg.find(&format!("{key}:\""))? + key.len() + 2;
        Some(msg[start..].split('"').next()?.to_string())
    };
    Some((value("namespace")?, value("name")?, value("uid")?))
}

/// Every sandbox run the log at `path` shows, in the order they ended.
pub fn sandbox_runs(path: &Path) -> Vec<SandboxRun> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let mut started: HashMap<String, jiff::Timestamp> = HashMap::new();
    let mut out = Vec::new();
    for line in text.lines() {
        let (Some(msg), Some(time)) = (field(line, "msg"), field(line, "time")) else {
            continue;
        };
        let Some(rest) = msg.strip_prefix("RunPodSandbox for ") else {
            continue;
        };
        let (Some((namespace, name, uid)), Ok(at)) = (pod(rest), time.parse::<jiff::Timestamp>())
        else {
            continue;
        };
        let ended = rest.contains("returns sandbox id");
        let failed = rest.ends_with("failed, error");
        if !ended && !failed {
            started.insert(uid, at);
            continue;
        }
        let Some(from) = started.remove(&uid) else {
            continue;
        };
        out.push(SandboxRun {
            namespace,
            name,
            uid,
            seconds: at.duration_since(from).as_secs_f64(),
            error: failed.then(|| field(line, "error").unwrap_or_default()),
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_is_its_start_and_its_end() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("containerd.log");
        std::fs::write(
            &log,
            r#"time="2026-11-27T17:46:47.014893627Z" level=info msg="RunPodSandbox for name:\"probe\"  uid:\"u1\"  namespace:\"default\""
time="2026-11-27T17:46:47.339649422Z" level=info msg="RunPodSandbox for name:\"probe\"  uid:\"u1\"  namespace:\"default\" returns sandbox id \"eb27\""
time="2026-11-27T17:46:48.000000000Z" level=info msg="RunPodSandbox for name:\"web\"  uid:\"u2\"  namespace:\"shop\""
time="2026-11-27T17:46:50.500000000Z" level=error msg="RunPodSandbox for name:\"web\"  uid:\"u2\"  namespace:\"shop\" failed, error" error="failed to setup network for sandbox \"x\": plugin type=\"allot\" failed (add): no pool fits"
"#,
        )
        .unwrap();
        let runs = sandbox_runs(&log);
        assert_eq!(runs.len(), 2, "{runs:?}");
        assert_eq!(
            (runs[0].namespace.as_str(), runs[0].name.as_str()),
            ("default", "probe")
        );
        assert!(
            (runs[0].seconds - 0.3248).abs() < 0.001,
            "{}",
            runs[0].seconds
        );
        assert_eq!(runs[0].error, None);
        assert!((runs[1].seconds - 2.5).abs() < 0.001);
        assert!(
            runs[1].error.as_deref().unwrap().contains("no pool fits"),
            "{runs:?}"
        );
    }
}
