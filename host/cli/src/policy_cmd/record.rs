//! `allotctl policy record --out DIR`: the decisions an agent made recently (its ring, served on
//! its socket as `GET /v1/decisions`) written as scenario files, one per decision, whose
//! expectation is what the agent's policy decided. `allotctl policy test` against that policy
//! passes them; `allotctl policy diff` shows what another policy would decide differently.

use std::io::{Read as _, Write as _};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use allot_api::{RecordedDecision, RecordedDecisions};
use anyhow::{Context as _, bail};

/// The largest answer read from the agent (a ring of big inventories can be large).
const MAX_RESPONSE: u64 = 512 << 20;

pub fn record(socket: &Path, out: &Path, sha256: Option<&str>) -> anyhow::Result<ExitCode> {
    let body = get(socket, allot_api::DECISIONS)?;
    let recorded: RecordedDecisions = serde_json::from_slice(&body).context(
        "the agent's answer is not a list of recorded decisions (is it older than this allotctl?)",
    )?;
    if recorded.capacity == 0 {
        bail!(
            "the agent keeps no decisions: start it with --record-decisions N (N > 0) and let it \
             serve some pods"
        );
    }
    let wanted: Vec<&RecordedDecision> = recorded
        .decisions
        .iter()
        .filter(|d| sha256.is_none_or(|h| d.sha256.starts_with(&h.to_ascii_lowercase())))
        .collect();
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let mut policies = std::collections::BTreeMap::<(&str, &str), usize>::new();
    for d in &wanted {
        let path = out.join(file_name(d));
        let yaml = serde_yaml::to_string(&d.scenario).context("writing a scenario as YAML")?;
        std::fs::write(&path, yaml).with_context(|| format!("writing {}", path.display()))?;
        *policies.entry((&d.policy, &d.sha256)).or_default() += 1;
    }
    println!(
        "wrote {} scenario(s) to {} ({} recorded, the agent keeps {})",
        wanted.len(),
        out.display(),
        recorded.decisions.len(),
        recorded.capacity
    );
    for ((policy, sha), n) in &policies {
        println!("  {n} decided by {policy} (sha256 {sha})");
    }
    if policies.len() > 1 {
        println!(
            "  (more than one policy decided: test each file against its own policy, or record \
             with --sha256)"
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// `SEQ-NAMESPACE-POD.yaml`, with anything but letters, digits, '-', '_' and '.' replaced.
fn file_name(d: &RecordedDecision) -> String {
    let pod: String = d
        .pod
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.' {
                c
            } else {
                '-'
            }
        })
        .take(100)
        .collect();
    format!("{:08}-{pod}.yaml", d.seq)
}

/// A GET on the agent's socket (HTTP/1.1, one request per connection): the body of a 200.
fn get(socket: &Path, path: &str) -> anyhow::Result<Vec<u8>> {
    let unreachable = || {
        format!(
            "cannot reach the agent on {}: is it running? (--socket PATH)",
            socket.display()
        )
    };
    let mut stream = UnixStream::connect(socket).with_context(unreachable)?;
    stream.set_read_timeout(Some(Duration::from_secs(60)))?;
    stream.set_write_timeout(Some(Duration::from_secs(10)))?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: allot-agent\r\nConnection: close\r\n\r\n"
    )
    .with_context(unreachable)?;
    let mut raw = Vec::new();
    stream
        .take(MAX_RESPONSE)
        .read_to_end(&mut raw)
        .with_context(|| format!("reading the agent's answer on {}", socket.display()))?;
    let end = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .context("the agent's answer has no HTTP head")?;
    let head = String::from_utf8_lossy(&raw[..end]);
    let status = head.split_whitespace().nth(1).unwrap_or("");
    let body = raw[end + 4..].to_vec();
    if head
        .lines()
        .any(|l| l.to_ascii_lowercase().starts_with("transfer-encoding:"))
    {
        bail!("the agent answered with a transfer encoding this client does not read");
    }
    if status != "200" {
        bail!(
            "the agent answered {path} with {status}: {} (an agent older than this allotctl has \
             no {path})",
            String::from_utf8_lossy(&body).trim()
        );
    }
    Ok(body)
}
