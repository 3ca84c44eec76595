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
        });
    }
    Ok(out)
}
