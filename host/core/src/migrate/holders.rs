//! Who holds each address the peer records: the pods its records name and the live pods that
//! use it. One holder is what a claim can carry over; two are an address handed out twice,
//! which a migration refuses (it cannot choose whose address it is). The launcher pods of one
//! KubeVirt virtual machine are one holder (a live migration's source and target both use the
//! VM's address), as they are in allot.

use std::collections::BTreeMap;
use std::fmt;
use std::net::IpAddr;

use super::{LivePod, Owner, Record};
use crate::store::VIRTUAL_MACHINE_KIND;

/// The virtual machine an owner stands for.
fn virtual_machine(owner: Option<&Owner>) -> Option<&str> {
    owner
        .filter(|o| o.kind == VIRTUAL_MACHINE_KIND && !o.name.is_empty())
        .map(|o| o.name.as_str())
}

/// A pod said to hold an address, and what says so.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Holder {
    pub namespace: String,
    pub name: String,
    /// The virtual machine whose launcher pod it is.
    pub virtual_machine: Option<String>,
    pub sources: Vec<String>,
}

impl fmt::Display for Holder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}/{} ({})",
            self.namespace,
            self.name,
            self.sources.join(", ")
        )
    }
}

/// The records of one address and its holders.
#[derive(Clone, Debug)]
pub(crate) struct Group {
    pub records: Vec<Record>,
    pub holders: Vec<Holder>,
}

/// The records grouped by address (in address order), each with every pod said to hold it: the
/// pods the records name and the live pods (holding addresses) that use it.
pub(crate) fn group(records: &[Record], pods: &[LivePod]) -> BTreeMap<IpAddr, Group> {
    let mut out: BTreeMap<IpAddr, Group> = BTreeMap::new();
    for r in records {
        let g = out.entry(r.address).or_insert_with(|| Group {
            records: Vec::new(),
            holders: Vec::new(),
        });
        g.records.push(r.clone());
        let vm = virtual_machine(r.owner.as_ref());
        add(&mut g.holders, &r.namespace, &r.name, vm, &r.source);
    }
    for pod in pods.iter().filter(|p| p.holds) {
        for a in &pod.addresses {
            if let Some(g) = out.get_mut(&a.address) {
                let source = format!("pod {}/{} status", pod.namespace, pod.name);
                let vm = virtual_machine(pod.owner.as_ref());
                add(&mut g.holders, &pod.namespace, &pod.name, vm, &source);
            }
        }
    }
    out
}

fn add(
    holders: &mut Vec<Holder>,
    namespace: &str,
    name: &str,
    virtual_machine: Option<&str>,
    source: &str,
) {
    let same = |h: &Holder| {
        h.namespace == namespace
            && (h.name == name
                || virtual_machine.is_some_and(|vm| h.virtual_machine.as_deref() == Some(vm)))
    };
    match holders.iter_mut().find(|h| same(h)) {
        Some(h) => {
            if !h.sources.iter().any(|s| s == source) {
                h.sources.push(source.to_string());
            }
        }
        None => holders.push(Holder {
            namespace: namespace.to_string(),
            name: name.to_string(),
            virtual_machine: virtual_machine.map(str::to_string),
            sources: vec![source.to_string()],
        }),
    }
}

/// Every pod said to hold `address` by `records` and `pods`.
pub fn holders_of(address: IpAddr, records: &[Record], pods: &[LivePod]) -> Vec<Holder> {
    group(records, pods)
        .remove(&address)
        .map(|g| g.holders)
        .unwrap_or_default()
}
