//! The fault campaign on the real cluster (issue 39, item 1): what it records and how the record
//! is judged. The driver is the test `robustness::a_seeded_fault_campaign_keeps_every_promise`
//! (`make robustness SEED=… SEEDS=… DURATION=…`); this module is the part with no cluster in
//! it, so that the checker is tested by feeding it histories.
//!
//! **What is recorded**, one JSON object per line: every workload action and every fault the
//! seed chose (with when it was injected and healed), and every half second a sample of the
//! truth on the nodes: which addresses each pod's sandboxes have configured, read from each
//! node's CNI result cache (what containerd's libcni keeps for a sandbox it set up and has not
//! torn down), with the pods the API server still has.
//!
//! **The model**, per address: a pod (a UID) *holds* an address from the first sample that
//! shows it in one of the pod's sandboxes until the first sample that shows it in none of them,
//! or until the pod is gone from the API server, whichever comes first (a pod gone from the API
//! server may keep its sandbox while its DEL waits for a stopped agent; allot's GC may then hand
//! the address on after its grace period, as the promise allows). Two pods holding one address
//! at once is a violation, reported with the shortest window that shows it: the samples where
//! each started holding it and every action and fault between them.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use serde::{Deserialize, Serialize};

/// One line of a campaign's history.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", tag = "record")]
pub enum Record {
    /// What the workload did (`scale deployment/app 3`, `recreate pod/same`).
    Action { at_ms: u64, what: String },
    /// A fault injected (`healed_ms`: when it was undone; equal for a one-shot kill).
    Fault {
        at_ms: u64,
        healed_ms: u64,
        what: String,
    },
    /// The truth on the nodes at one moment.
    Sample {
        at_ms: u64,
        /// Per pod UID, the addresses its sandboxes have configured (libcni's result cache).
        sandboxes: BTreeMap<String, Vec<IpAddr>>,
        /// The UIDs of the namespace's pods the API server has.
        pods: BTreeSet<String>,
    },
}

impl Record {
    pub fn at_ms(&self) -> u64 {
        match self {
            Record::Action { at_ms, .. }
            | Record::Fault { at_ms, .. }
            | Record::Sample { at_ms, .. } => *at_ms,
        }
    }
}

/// One pod's holding of one address: `[from_ms, until_ms)` (`u64::MAX`: still at the end).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Holding {
    pub uid: String,
    pub from_ms: u64,
    pub until_ms: u64,
}

/// Two pods holding one address at once.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    pub address: IpAddr,
    pub first: Holding,
    pub second: Holding,
    /// The actions and faults from the first holding's start to the second's: the shortest
    /// story of how it came about.
    pub window: Vec<Record>,
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "{} held by pod {} from {} ms and by pod {} from {} ms, before the first let it go (at {})",
            self.address,
            self.first.uid,
            self.first.from_ms,
            self.second.uid,
            self.second.from_ms,
            match self.first.until_ms {
                u64::MAX => "the end".to_string(),
                t => format!("{t} ms"),
            }
        )?;
        for r in &self.window {
            writeln!(f, "  {}", serde_json::to_string(r).unwrap_or_default())?;
        }
        Ok(())
    }
}

/// Every address's holdings, in order of their start.
pub fn holdings(history: &[Record]) -> BTreeMap<IpAddr, Vec<Holding>> {
    // Open holdings by (address, uid): since when.
    let mut open: BTreeMap<(IpAddr, String), u64> = BTreeMap::new();
    let mut out: BTreeMap<IpAddr, Vec<Holding>> = BTreeMap::new();
    for record in history {
        let Record::Sample {
            at_ms,
            sandboxes,
            pods,
        } = record
        else {
            continue;
        };
        let now: BTreeSet<(IpAddr, String)> = sandboxes
            .iter()
            .filter(|(uid, _)| pods.contains(*uid))
            .flat_map(|(uid, addresses)| addresses.iter().map(move |a| (*a, uid.clone())))
            .collect();
        let ended: Vec<(IpAddr, String)> =
            open.keys().filter(|k| !now.contains(*k)).cloned().collect();
        for key in ended {
            let from_ms = open.remove(&key).expect("open");
            out.entry(key.0).or_default().push(Holding {
                uid: key.1,
                from_ms,
                until_ms: *at_ms,
            });
        }
        for key in now {
            open.entry(key).or_insert(*at_ms);
        }
    }
    for ((address, uid), from_ms) in open {
        out.entry(address).or_default().push(Holding {
            uid,
            from_ms,
            until_ms: u64::MAX,
        });
    }
    for held in out.values_mut() {
        held.sort_by_key(|h| (h.from_ms, h.uid.clone()));
    }
    out
}

/// Every time two pods held one address at once.
pub fn check(history: &[Record]) -> Vec<Violation> {
    let mut violations = Vec::new();
    for (address, held) in holdings(history) {
        for (i, a) in held.iter().enumerate() {
            for b in held[i + 1..].iter().take_while(|b| b.from_ms < a.until_ms) {
                if a.uid == b.uid {
                    continue;
                }
                let window = history
                    .iter()
                    .filter(|r| !matches!(r, Record::Sample { .. }))
                    .filter(|r| {
                        let at = r.at_ms();
                        at >= a.from_ms && at <= b.from_ms
                            || matches!(r, Record::Fault { at_ms, healed_ms, .. }
                                if *at_ms <= b.from_ms && *healed_ms >= a.from_ms)
                    })
                    .cloned()
                    .collect();
                violations.push(Violation {
                    address,
                    first: a.clone(),
                    second: b.clone(),
                    window,
                });
            }
        }
    }
    violations
}

/// Counts of what a seed did, for the report.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Summary {
    pub actions: usize,
    pub faults: usize,
    pub samples: usize,
    /// Distinct (pod, address) holdings seen.
    pub holdings: usize,
    /// Addresses held by more than one pod over the run (handed on).
    pub reused: usize,
}

pub fn summary(history: &[Record]) -> Summary {
    let held = holdings(history);
    Summary {
        actions: history
            .iter()
            .filter(|r| matches!(r, Record::Action { .. }))
            .count(),
        faults: history
            .iter()
            .filter(|r| matches!(r, Record::Fault { .. }))
            .count(),
        samples: history
            .iter()
            .filter(|r| matches!(r, Record::Sample { .. }))
            .count(),
        holdings: held.values().map(Vec::len).sum(),
        reused: held
            .values()
            .filter(|h| h.iter().map(|h| &h.uid).collect::<BTreeSet<_>>().len() > 1)
            .count(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(at_ms: u64, held: &[(&str, &str)], pods: &[&str]) -> Record {
        let mut sandboxes: BTreeMap<String, Vec<IpAddr>> = BTreeMap::new();
        for (uid, address) in held {
            sandboxes
                .entry(uid.to_string())
                .or_default()
                .push(address.parse().unwrap());
        }
        Record::Sample {
            at_ms,
            sandboxes,
            pods: pods.iter().map(|p| p.to_string()).collect(),
        }
    }

    fn fault(at_ms: u64, healed_ms: u64, what: &str) -> Record {
        Record::Fault {
            at_ms,
            healed_ms,
            what: what.into(),
        }
    }

    #[test]
    fn an_address_handed_on_after_its_pod_let_it_go_is_no_violation() {
        let history = vec![
            sample(0, &[("a", "192.0.2.1")], &["a"]),
            sample(500, &[("a", "192.0.2.1")], &["a"]),
            // a's sandbox torn down, then b set up with the address.
            sample(1000, &[], &["a"]),
            sample(1500, &[("b", "192.0.2.1")], &["b"]),
            // a's pod gone while its sandbox lingers (its DEL waits): no longer a holder.
            sample(2000, &[("b", "192.0.2.2"), ("c", "192.0.2.3")], &["b", "c"]),
            sample(2500, &[("b", "192.0.2.2"), ("c", "192.0.2.3")], &["b"]),
            sample(3000, &[("b", "192.0.2.2"), ("d", "192.0.2.3")], &["b", "d"]),
        ];
        assert_eq!(check(&history), vec![]);
        let s = summary(&history);
        assert_eq!((s.samples, s.reused), (7, 2));
    }

    #[test]
    fn two_pods_with_one_address_are_reported_with_the_faults_between() {
        let history = vec![
            // Healed before a held the address: not part of the story.
            fault(100, 150, "etcd restarted"),
            sample(1000, &[("a", "192.0.2.1")], &["a"]),
            fault(1200, 5000, "agent on node-1 stopped"),
            Record::Action {
                at_ms: 1300,
                what: "scale deployment/app 2".into(),
            },
            sample(1500, &[("a", "192.0.2.1"), ("b", "192.0.2.1")], &["a", "b"]),
            Record::Action {
                at_ms: 1600,
                what: "later".into(),
            },
            sample(2000, &[("b", "192.0.2.1")], &["b"]),
        ];
        let found = check(&history);
        assert_eq!(found.len(), 1, "{found:?}");
        let v = &found[0];
        assert_eq!(v.address, "192.0.2.1".parse::<IpAddr>().unwrap());
        assert_eq!((v.first.uid.as_str(), v.second.uid.as_str()), ("a", "b"));
        assert_eq!(v.first.until_ms, 2000);
        // Neither the fault healed before a held it nor what came after b are in the window.
        let whats: Vec<String> = v
            .window
            .iter()
            .map(|r| serde_json::to_string(r).unwrap())
            .collect();
        assert_eq!(whats.len(), 2, "{whats:?}");
        assert!(whats[0].contains("agent on node-1 stopped"), "{whats:?}");
        assert!(whats[1].contains("scale deployment/app 2"), "{whats:?}");
        assert!(
            v.to_string()
                .contains("held by pod a from 1000 ms and by pod b from 1500 ms"),
            "{v}"
        );
    }

    #[test]
    fn a_history_reads_back_as_written() {
        let history = vec![
            sample(0, &[("a", "2001:db8::1")], &["a"]),
            fault(1, 2, "kube-apiserver restarted"),
        ];
        let text: Vec<String> = history
            .iter()
            .map(|r| serde_json::to_string(r).unwrap())
            .collect();
        let back: Vec<Record> = text
            .iter()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(back, history);
        assert!(text[0].starts_with(r#"{"record":"sample""#), "{}", text[0]);
    }
}
