//! The API server's audit log: every request's user, verb, resource and response code (no
//! bodies), so that a test can say which requests of which accounts the server refused, as
//! RBAC decided them.

use std::io::BufRead;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde_json::Value;

/// Every request at the Metadata level, once its response is known.
pub const POLICY: &str = "\
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived, ResponseStarted]
rules:
  - level: Metadata
";

pub fn policy_path(logs: &Path) -> PathBuf {
    logs.join("audit-policy.yaml")
}

pub fn log_path(logs: &Path) -> PathBuf {
    logs.join("audit.log")
}

/// One request the API server answered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    pub user: String,
    pub verb: String,
    /// `group/resource[/subresource]`, the core group empty.
    pub resource: String,
    pub namespace: String,
    pub name: String,
    pub code: u16,
    /// What the server said when it refused.
    pub reason: String,
    /// When the server received it (`requestReceivedTimestamp`).
    pub received: Option<jiff::Timestamp>,
}

impl std::fmt::Display for Request {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} {} {} {}/{} -> {} {}",
            self.user, self.verb, self.resource, self.namespace, self.name, self.code, self.reason
        )
    }
}

/// The requests in the audit log under `logs` whose user starts with `user_prefix` and whose
/// response code is `code` (403 for RBAC's refusals).
pub fn requests(logs: &Path, user_prefix: &str, code: u16) -> Result<Vec<Request>> {
    Ok(read(logs)?
        .into_iter()
        .filter(|r| r.code == code && r.user.starts_with(user_prefix))
        .collect())
}

/// Where the lab notes each kube-apiserver restart: one JSON line `{"from", "until"}` per
/// restart, from the moment it was told to stop until its `/readyz` (which includes RBAC's
/// informers having synced) answered `ok` again.
pub fn restarts_path(logs: &Path) -> PathBuf {
    logs.join("apiserver-restarts.jsonl")
}

/// One kube-apiserver restart as [`restarts_path`] notes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Restart {
    pub from: jiff::Timestamp,
    pub until: jiff::Timestamp,
}

impl Restart {
    /// Whether `request` reached the server while it was restarting (and not yet ready).
    pub fn covers(&self, request: &Request) -> bool {
        request
            .received
            .is_some_and(|at| self.from <= at && at <= self.until)
    }
}

/// Notes a restart under `logs`.
pub fn note_restart(logs: &Path, restart: Restart) -> Result<()> {
    use std::io::Write;
    let path = restarts_path(logs);
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .with_context(|| format!("opening {}", path.display()))?;
    writeln!(file, "{}", serde_json::to_string(&restart)?)
        .with_context(|| format!("writing {}", path.display()))
}

/// The restarts noted under `logs`, oldest first.
pub fn restarts(logs: &Path) -> Result<Vec<Restart>> {
    let path = restarts_path(logs);
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).with_context(|| format!("{}: {l}", path.display())))
        .collect()
}

/// Every request in the audit log under `logs`, in the order answered.
pub fn read(logs: &Path) -> Result<Vec<Request>> {
    let path = log_path(logs);
    let file = match std::fs::File::open(&path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    let mut out = Vec::new();
    for line in std::io::BufReader::new(file).lines() {
        let line = line?;
        let Ok(event) = serde_json::from_str::<Value>(&line) else {
            continue;
        };
        let text = |v: &Value| v.as_str().unwrap_or_default().to_string();
        let object = &event["objectRef"];
        let mut resource = format!(
            "{}/{}",
            text(&object["apiGroup"]),
            text(&object["resource"])
        );
        if let Some(sub) = object["subresource"].as_str() {
            resource = format!("{resource}/{sub}");
        }
        out.push(Request {
            user: text(&event["user"]["username"]),
            verb: text(&event["verb"]),
            resource,
            namespace: text(&object["namespace"]),
            name: text(&object["name"]),
            code: event["responseStatus"]["code"].as_u64().unwrap_or(0) as u16,
            reason: text(&event["responseStatus"]["message"]),
            received: event["requestReceivedTimestamp"]
                .as_str()
                .and_then(|t| t.parse().ok()),
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One audit event as kube-apiserver 1.35 writes it at the Metadata level (trimmed).
    fn event(received: &str, code: u16) -> String {
        serde_json::json!({
            "kind": "Event", "apiVersion": "audit.k8s.io/v1", "level": "Metadata",
            "stage": "ResponseComplete", "verb": "watch",
            "user": {"username": "system:serviceaccount:allot-system:allot-agent"},
            "objectRef": {"resource": "ipblocks", "apiGroup": "allot.dev", "apiVersion": "v1alpha1"},
            "responseStatus": {"code": code, "message": "ipblocks.allot.dev is forbidden"},
            "requestReceivedTimestamp": received,
            "stageTimestamp": received,
        })
        .to_string()
    }

    #[test]
    fn only_refusals_received_while_the_server_restarted_are_covered() {
        let dir = tempfile::tempdir().unwrap();
        let lines = [
            event("2026-11-26T20:00:00.500000Z", 403),
            event("2026-11-26T20:00:02.000000Z", 403),
            event("2026-11-26T20:00:09.000000Z", 403),
            event("2026-11-26T20:00:03.000000Z", 200),
        ];
        std::fs::write(log_path(dir.path()), lines.join("\n")).unwrap();
        note_restart(
            dir.path(),
            Restart {
                from: "2026-11-26T20:00:01Z".parse().unwrap(),
                until: "2026-11-26T20:00:05Z".parse().unwrap(),
            },
        )
        .unwrap();
        let restarts = restarts(dir.path()).unwrap();
        assert_eq!(restarts.len(), 1);
        let refused = requests(dir.path(), "system:serviceaccount:allot-system:", 403).unwrap();
        assert_eq!(refused.len(), 3);
        let left: Vec<_> = refused
            .iter()
            .filter(|r| !restarts.iter().any(|w| w.covers(r)))
            .map(|r| r.received.unwrap().to_string())
            .collect();
        assert_eq!(
            left,
            ["2026-11-26T20:00:00.5Z", "2026-11-26T20:00:09Z"],
            "before and after the restart still count"
        );
    }
}
