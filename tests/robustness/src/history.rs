//! A history: every operation a client (a container runtime on a node) invoked, with what it
//! returned and when, and the store's claims once everything has healed. One JSON object per
//! line, so that a failing seed's history can be read, diffed and fed back to the checker.
//!
//! As in etcd's robustness tests (`tests/robustness` in etcd-io/etcd) and Jepsen, an operation
//! whose reply never came (the agent crashed under it, or the reply was dropped) has the
//! outcome [`Outcome::Unknown`]: it may or may not have taken effect, and the checker must
//! accept either.

use std::io::{BufRead, Write};
use std::net::IpAddr;

use serde::{Deserialize, Serialize};

/// What a client asked for, or what happened to a node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Verb {
    /// CNI ADD of a sandbox's interface: `addresses` are what it returned.
    Add,
    /// CNI DEL: `released` are the addresses the agent said it released.
    Del,
    /// CNI CHECK: `addresses` are what the attachment holds.
    Check,
    /// CNI GC with the node's live attachments: `released` are the addresses reclaimed.
    Gc,
    /// The agent's start: DELs remembered in its journal served; `released` as for DEL.
    Replay,
    /// The agent process died (between two store steps of the operation `note` names).
    Crash,
    /// The agent process started again over the same store file and journal.
    Restart,
}

/// How an operation ended, as its client saw it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", tag = "outcome", content = "message")]
pub enum Outcome {
    Ok,
    /// Refused or failed: took no effect (but a GC, whose batches commit one by one).
    Err(String),
    /// No reply: it may or may not have taken effect.
    Unknown,
}

/// One operation, from its invocation to its completion.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Op {
    pub id: u64,
    /// The node whose agent served it.
    pub node: String,
    pub verb: Verb,
    /// The pod sandbox the operation is for (the holder of what it is given): unique per
    /// sandbox, even when a runtime reuses a container ID.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<String>,
    /// The CNI attachment, `container/interface`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attachment: Option<String>,
    /// The pod, `namespace/name`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<String>,
    /// Addresses returned (ADD, CHECK).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub addresses: Vec<IpAddr>,
    /// Addresses the operation reports it released (DEL, GC, journal replay).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub released: Vec<IpAddr>,
    /// Logical time of the invocation.
    pub call: u64,
    /// Logical time of the completion (for an unknown outcome, when the client gave up).
    pub ret: u64,
    #[serde(flatten)]
    pub outcome: Outcome,
    /// The fault injected into it, if any.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub note: String,
}

/// A claim as the store holds it at the end.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredClaim {
    pub address: IpAddr,
    /// `container/interface`; `None` for a detached claim.
    pub attachment: Option<String>,
    pub node: String,
}

/// One line of a history file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", tag = "record")]
pub enum Record {
    Op(Op),
    /// Every claim in the store after the faults healed, every journal was replayed, every
    /// pending DEL was served and GC ran past its grace period: the state to check for leaks.
    Quiescent {
        time: u64,
        claims: Vec<StoredClaim>,
    },
}

/// Operations in the order they were invoked, and the final state when the run reached one.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct History {
    pub ops: Vec<Op>,
    pub quiescent: Option<Vec<StoredClaim>>,
    /// Logical time of the quiescent state.
    pub end: u64,
}

impl History {
    /// Writes the history as JSON lines: operations by invocation time, then the final state.
    pub fn write_to(&self, mut out: impl Write) -> std::io::Result<()> {
        let mut ops: Vec<&Op> = self.ops.iter().collect();
        ops.sort_by_key(|o| (o.call, o.id));
        for op in ops {
            serde_json::to_writer(&mut out, &Record::Op(op.clone()))?;
            out.write_all(b"\n")?;
        }
        if let Some(claims) = &self.quiescent {
            let record = Record::Quiescent {
                time: self.end,
                claims: claims.clone(),
            };
            serde_json::to_writer(&mut out, &record)?;
            out.write_all(b"\n")?;
        }
        Ok(())
    }

    /// Reads a history written by [`History::write_to`]; blank lines are skipped.
    pub fn read_from(input: impl BufRead) -> anyhow::Result<History> {
        let mut history = History::default();
        for (n, line) in input.lines().enumerate() {
            let line = line?;
            if line.trim().is_empty() {
                continue;
            }
            let record: Record = serde_json::from_str(&line)
                .map_err(|e| anyhow::anyhow!("history line {}: {e}", n + 1))?;
            match record {
                Record::Op(op) => history.ops.push(op),
                Record::Quiescent { time, claims } => {
                    history.end = time;
                    history.quiescent = Some(claims);
                }
            }
        }
        Ok(history)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_history_reads_back_as_written() {
        let history = History {
            ops: vec![
                Op {
                    id: 1,
                    node: "n1".into(),
                    verb: Verb::Add,
                    sandbox: Some("s1".into()),
                    attachment: Some("c1/eth0".into()),
                    pod: Some("ns/p1".into()),
                    addresses: vec!["10.0.0.2".parse().unwrap()],
                    released: vec![],
                    call: 1,
                    ret: 2,
                    outcome: Outcome::Ok,
                    note: String::new(),
                },
                Op {
                    id: 2,
                    node: "n1".into(),
                    verb: Verb::Del,
                    sandbox: Some("s1".into()),
                    attachment: Some("c1/eth0".into()),
                    pod: None,
                    addresses: vec![],
                    released: vec![],
                    call: 3,
                    ret: 4,
                    outcome: Outcome::Err("store unavailable".into()),
                    note: "unavailable".into(),
                },
            ],
            quiescent: Some(vec![StoredClaim {
                address: "10.0.0.2".parse().unwrap(),
                attachment: Some("c1/eth0".into()),
                node: "n1".into(),
            }]),
            end: 9,
        };
        let mut out = Vec::new();
        history.write_to(&mut out).unwrap();
        let text = String::from_utf8(out.clone()).unwrap();
        assert_eq!(text.lines().count(), 3, "{text}");
        assert!(text.contains(r#""outcome":"err","message":"store unavailable""#));
        assert_eq!(History::read_from(&out[..]).unwrap(), history);
    }
}
