//! `allotctl ipam release --virtual-machine NAMESPACE/NAME [--address A] [--yes]`: frees, on
//! purpose, what allot keeps for a KubeVirt virtual machine. A VM's address is never freed by a
//! timer (docs/addresses.md): when its next launcher pod cannot keep it (the policy no longer
//! allows its pool there), the NIC fails rather than give the guest another address, and an
//! operator who decides the VM should get a new one releases the old one here.
//!
//! Only what no launcher pod holds now is released: a detached claim (checked by the store in
//! the same write: `Store::release(address, None)`) that no live launcher pod of the VM reports
//! using (a failed live migration leaves the claim detached while the guest runs on at the
//! source, whose sandbox the claim no longer names), so an address a running guest uses is
//! never freed under it. The VM is named explicitly, what will be released is printed first,
//! and the operator confirms (or passes `--yes`).

use std::io::{BufRead, IsTerminal, Write};
use std::net::IpAddr;
use std::process::ExitCode;

use crate::store_args::StoreArgs;
use allot_core::gc::PodPhase;
use allot_core::store::{Claim, Store, VIRTUAL_MACHINE_KIND};
use allot_k8s::openapi::api::core::v1::Pod;
use anyhow::{Context as _, bail};
use kube::api::{Api, ListParams};

use crate::cluster::connect;

/// A live launcher pod of the VM and the addresses it reports using.
pub struct Launcher {
    pub name: String,
    pub addresses: Vec<IpAddr>,
}

/// The claims of `held` (the VM's) that a release frees: detached ones that none of the VM's
/// live `launchers` reports using, only `address` if given. The others, each with why it is
/// left.
pub fn split(
    held: Vec<Claim>,
    launchers: &[Launcher],
    address: Option<IpAddr>,
) -> (Vec<Claim>, Vec<(Claim, String)>) {
    let mut free = Vec::new();
    let mut left = Vec::new();
    for c in held {
        if address.is_some_and(|a| a != c.address) {
            continue;
        }
        if let Some(l) = launchers.iter().find(|l| l.addresses.contains(&c.address)) {
            let why = format!(
                "launcher pod {}/{} reports using it (a guest may run with it): stop the VM \
                 first, then release it",
                c.pod.namespace, l.name
            );
            left.push((c, why));
            continue;
        }
        match &c.attachment {
            None => free.push(c),
            Some(a) => {
                let why = format!(
                    "launcher pod {}/{} holds it (sandbox {}, {}{}): stop the VM first, its \
                     pod's DEL keeps it for the VM, then release it",
                    c.pod.namespace,
                    c.pod.name,
                    a.container_id,
                    a.interface,
                    if c.node.is_empty() {
                        String::new()
                    } else {
                        format!(", node {}", c.node)
                    }
                );
                left.push((c, why));
            }
        }
    }
    (free, left)
}

pub fn release(
    store: &StoreArgs,
    vm: &str,
    address: Option<IpAddr>,
    yes: bool,
) -> anyhow::Result<ExitCode> {
    let Some((namespace, name)) = vm
        .split_once('/')
        .filter(|(n, v)| !n.is_empty() && !v.is_empty())
    else {
        bail!("--virtual-machine {vm:?}: give NAMESPACE/NAME (the VirtualMachine's)");
    };
    let cluster = connect(store, "ipam release")?;
    let held = cluster
        .store
        .claims_of_virtual_machine(namespace, name)
        .context("cannot read the claims")?;
    if held.is_empty() {
        println!(
            "allot keeps no address for virtual machine {namespace}/{name}: nothing to release"
        );
        return Ok(ExitCode::SUCCESS);
    }
    let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), namespace);
    let pods = cluster
        .runtime
        .block_on(pods.list(&ListParams::default()))
        .with_context(|| format!("cannot list the pods of namespace {namespace}"))?;
    let (free, left) = split(held, &launchers(&pods.items, name), address);
    if let Some(a) = address
        && free.is_empty()
        && left.is_empty()
    {
        bail!("{a} is not an address of virtual machine {namespace}/{name}");
    }
    for (c, why) in &left {
        println!("left {} (IPPool {}): {why}", c.address, c.pool);
    }
    if free.is_empty() {
        println!("nothing to release");
        return Ok(ExitCode::FAILURE);
    }
    for c in &free {
        println!(
            "to release: {} (IPPool {}, network {}) kept for virtual machine {namespace}/{name}",
            c.address,
            c.pool,
            if c.network.is_empty() {
                "-"
            } else {
                &c.network
            }
        );
    }
    if !yes && !confirmed(namespace, name)? {
        println!("nothing was released");
        return Ok(ExitCode::FAILURE);
    }
    let mut released = 0;
    for c in &free {
        // Only while still detached: a launcher pod that took it back meanwhile keeps it.
        let done = cluster
            .store
            .release(c.address, None)
            .with_context(|| format!("cannot release {}", c.address))?;
        if done {
            released += 1;
            println!("released {} (IPPool {})", c.address, c.pool);
        } else {
            println!(
                "kept {} (IPPool {}): a launcher pod took it back meanwhile",
                c.address, c.pool
            );
        }
    }
    println!(
        "{released} address(es) of virtual machine {namespace}/{name} released; its next \
         launcher pod gets new ones from the pools its policy allows"
    );
    Ok(ExitCode::SUCCESS)
}

/// The live launcher pods of virtual machine `vm` among `pods` (their controller is its
/// VirtualMachineInstance, read as allot's agent reads it), with the addresses each reports
/// (`status.podIPs`, Multus's network status).
fn launchers(pods: &[Pod], vm: &str) -> Vec<Launcher> {
    pods.iter()
        .filter(|p| {
            allot_index::pod_controller(&p.metadata)
                .is_some_and(|o| o.kind == VIRTUAL_MACHINE_KIND && o.name == vm)
        })
        .filter(|p| {
            let phase = PodPhase::parse(p.status.as_ref().and_then(|s| s.phase.as_deref()));
            !matches!(phase, PodPhase::Succeeded | PodPhase::Failed)
        })
        .map(|p| Launcher {
            name: p.metadata.name.clone().unwrap_or_default(),
            addresses: allot_index::multus::pod_addresses(p)
                .into_iter()
                .map(|a| a.address)
                .collect(),
        })
        .collect()
}

/// Asks on the terminal; refuses without one (a script passes `--yes`).
fn confirmed(namespace: &str, name: &str) -> anyhow::Result<bool> {
    if !std::io::stdin().is_terminal() {
        bail!(
            "standard input is not a terminal to confirm on: add --yes to release the addresses \
             listed above"
        );
    }
    print!(
        "Release them? The VM {namespace}/{name} gets new addresses at its next start. Type the \
         VM's name to confirm: "
    );
    std::io::stdout().flush()?;
    let mut answer = String::new();
    std::io::stdin().lock().read_line(&mut answer)?;
    Ok(answer.trim() == name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use allot_core::store::{Attachment, PodRef, VIRTUAL_MACHINE_KIND};

    fn vm_claim(address: &str, attached: bool) -> Claim {
        Claim {
            address: address.parse().unwrap(),
            pool: "p".into(),
            network: "underlay".into(),
            attachment: attached.then(|| Attachment {
                container_id: "c1".into(),
                interface: "net1".into(),
            }),
            pod: PodRef {
                namespace: "vms".into(),
                name: "virt-launcher-db-abcde".into(),
                uid: "u".into(),
                owner_kind: Some(VIRTUAL_MACHINE_KIND.into()),
                owner_name: Some("db".into()),
            },
            node: "node-1".into(),
            updated_at: 1,
        }
    }

    #[test]
    fn only_what_no_launcher_pod_holds_or_uses_is_released() {
        let kept = vm_claim("192.0.2.10", false);
        let running = vm_claim("192.0.2.11", true);
        let (free, left) = split(vec![kept.clone(), running.clone()], &[], None);
        assert_eq!(free, std::slice::from_ref(&kept));
        assert_eq!(left.len(), 1);
        assert!(left[0].1.contains("stop the VM first"), "{}", left[0].1);
        let (free, left) = split(
            vec![kept.clone(), running],
            &[],
            Some("192.0.2.11".parse().unwrap()),
        );
        assert!(free.is_empty());
        assert_eq!(left.len(), 1, "only the address named");
        // A failed live migration: the claim is detached, the source pod still runs the guest
        // with the address.
        let source = Launcher {
            name: "virt-launcher-db-src".into(),
            addresses: vec!["192.0.2.10".parse().unwrap()],
        };
        let (free, left) = split(vec![kept], &[source], None);
        assert!(free.is_empty());
        assert!(left[0].1.contains("virt-launcher-db-src"), "{}", left[0].1);
    }
}
