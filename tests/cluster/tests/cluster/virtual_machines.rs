//! A KubeVirt virtual machine on the real control plane keeps its addresses: restarted,
//! evicted, live-migrated to another node (and a migration that fails), with no moment where
//! another pod could get them; deleted, it gives them back.
//!
//! No KubeVirt runs here (its controllers need a container runtime and a hypervisor), so the
//! test stands in for virt-controller: KubeVirt's two kinds are registered as structural CRDs
//! (group, version, names and subresources as KubeVirt's, schemas left open), and the launcher
//! pods are built as virt-controller builds them: owned by the VirtualMachineInstance (itself
//! owned by the VirtualMachine), labelled `kubevirt.io: virt-launcher`,
//! `kubevirt.io/created-by: <instance UID>`, `vm.kubevirt.io/name`, and a migration's target
//! `kubevirt.io/migrationJobUID`. Everything else is real: the API server, its garbage
//! collector deleting an instance's launcher pods, the Eviction API, allot's agents on the
//! nodes running the CNI plugin in each pod's network namespace, the controller's GC, and the
//! announcements on the lab's L2 segment.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::Duration;

use allot_cluster_tests::Suite;
use allot_cluster_tests::kubevirt::{self, addresses_of};
use allot_cluster_tests::objects::{Held, claims_in, pod_ips};
use allot_lab::capture::Capture;
use allot_lab::testing::wait_for;
use k8s_openapi::api::core::v1::{Event, Node, Pod};
use kube::api::{Api, EvictParams, ListParams};

const VM: &str = "db";

/// The lab's L2 segment, in this machine's namespace (see `allot_lab::net`).
const SEGMENT: &str = allot_lab::net::BRIDGE;

fn start_instance(s: &Suite, ns: &str) -> String {
    kubevirt::start_instance(s, ns, VM)
}

/// A launcher pod of the VM's instance on `node`; a live migration's target carries the
/// migration's UID.
fn launcher(s: &Suite, ns: &str, name: &str, node: &str, migration: Option<&str>) {
    kubevirt::launcher(s, ns, VM, name, node, migration, "");
}

async fn gone(s: &Suite, ns: &str, name: &str) {
    let pods: Api<Pod> = Api::namespaced(s.client.clone(), ns);
    wait_for(
        &format!("{ns}/{name} gone"),
        Duration::from_secs(90),
        || async {
            match pods.get_opt(name).await {
                Ok(None) => Ok(()),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await;
}

/// The VM's claims: exactly `addresses`, for pod `pod` (or kept for the VM, detached, when
/// `None`).
async fn held_for(s: &Suite, ns: &str, addresses: &[IpAddr], pod: Option<&str>, why: &str) {
    let held: BTreeMap<IpAddr, Held> = claims_in(&s.client, ns).await;
    assert_eq!(
        held.keys().copied().collect::<Vec<_>>(),
        addresses,
        "{why}: {held:?}"
    );
    for h in held.values() {
        match pod {
            Some(p) => assert!(h.attached && h.pod == p, "{why}: {h:?}"),
            None => assert!(!h.attached, "{why}: kept for the VM, detached: {h:?}"),
        }
    }
}

/// A pod given the VM's IPv4 address (allot's annotation): it does not start, and is told the
/// address is held by a launcher pod or kept for the VM.
async fn an_intruder_is_refused(s: &Suite, ns: &str, name: &str, address: IpAddr) {
    s.must_apply(&format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: {name}
  namespace: {ns}
  annotations: {{ipam.allot.dev/ip: '{{"ipv4":"{address}"}}'}}
spec:
  terminationGracePeriodSeconds: 1
  containers: [{{name: c, image: busybox, command: [sleep, "3600"]}}]
"#
    ));
    let events: Api<Event> = Api::namespaced(s.client.clone(), ns);
    let selector = format!("involvedObject.name={name}");
    let wanted = format!("cannot get {address}");
    wait_for(
        &format!("{name} refused {address}"),
        Duration::from_secs(90),
        || async {
            let messages: Vec<String> = events
                .list(&ListParams::default().fields(&selector))
                .await
                .map(|l| l.items)
                .unwrap_or_default()
                .into_iter()
                .filter_map(|e| e.message)
                .collect();
            messages
                .iter()
                .any(|m| {
                    m.contains(&wanted)
                        && (m.contains("held by pod") || m.contains("kept for virtual machine"))
                })
                .then_some(())
                .ok_or(messages)
        },
    )
    .await;
    let pod: Pod = Api::namespaced(s.client.clone(), ns)
        .get(name)
        .await
        .unwrap();
    assert!(pod_ips(&pod).is_empty(), "{name} got no address");
    s.must("kubectl", &["-n", ns, "delete", "pod", name, "--wait=true"]);
}

/// Who announced what: the address and the Ethernet source.
type Announced = (IpAddr, [u8; 6]);

/// Announcements seen on the lab's segment (in this machine's namespace) while a capture runs:
/// gratuitous ARPs (sender and target address the same) and unsolicited Neighbor
/// Advertisements (to all nodes, solicited flag clear), by the address they announce and who
/// sent them.
struct Announcements(Capture);

impl Announcements {
    fn capture() -> Announcements {
        Announcements(Capture::start(None, SEGMENT))
    }

    /// What was announced so far, each as often as it was.
    fn seen(&self) -> Vec<Announced> {
        self.0
            .frames()
            .iter()
            .filter_map(|f| announced(f))
            .collect()
    }

    /// Stops and returns what was announced.
    fn finish(self) -> Vec<Announced> {
        self.0
            .finish()
            .iter()
            .filter_map(|f| announced(f))
            .collect()
    }
}

/// The address `f` announces and its sender, if it is a gratuitous ARP (a request whose sender
/// and target address are the same) or an unsolicited advertisement.
fn announced(f: &[u8]) -> Option<Announced> {
    let from: [u8; 6] = f.get(6..12)?.try_into().ok()?;
    let address = match (f.get(12)?, f.get(13)?) {
        // An ARP request (a reply to an announcement names the same address twice as well).
        (0x08, 0x06) if f.len() >= 42 && f[20..22] == [0, 1] => {
            let sender: [u8; 4] = f[28..32].try_into().ok()?;
            let target: [u8; 4] = f[38..42].try_into().ok()?;
            (sender == target).then(|| IpAddr::from(sender))?
        }
        // IPv6, next header ICMPv6, type 136 (advertisement), solicited flag clear.
        (0x86, 0xdd) if f.len() >= 78 && f[20] == 58 && f[54] == 136 && f[58] & 0x40 == 0 => {
            let target: [u8; 16] = f[62..78].try_into().ok()?;
            IpAddr::from(target)
        }
        _ => return None,
    };
    Some((address, from))
}

/// A VM's story: started on one node, restarted on another, evicted, live-migrated (and a
/// migration that fails), then deleted. Its two addresses never change, are never free
/// meanwhile (a pod given one is refused each time), are announced from the target once the
/// guest is handed over there and not before, can be released on purpose by an operator only
/// once no launcher pod uses them, and are released once the VM is gone.
#[tokio::test]
async fn a_virtual_machine_keeps_its_addresses_through_restarts_evictions_and_migrations() {
    let Some(s) = Suite::shared(
        "a_virtual_machine_keeps_its_addresses_through_restarts_evictions_and_migrations",
    )
    .await
    else {
        return;
    };
    kubevirt::register(&s);
    let nodes: Vec<String> = Api::<Node>::all(s.client.clone())
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|n| n.metadata.name)
        .collect();
    let (one, two) = (nodes[0].as_str(), nodes[1].as_str());
    let ns = s.namespace("vms").await;
    kubevirt::create_vm(&s, &ns, VM);

    // Started on node one.
    start_instance(&s, &ns);
    launcher(&s, &ns, "virt-launcher-db-aaaaa", one, None);
    let addresses = addresses_of(&s, &ns, "virt-launcher-db-aaaaa").await;
    held_for(
        &s,
        &ns,
        &addresses,
        Some("virt-launcher-db-aaaaa"),
        "started",
    )
    .await;

    // Restarted: the instance is deleted (the garbage collector deletes its launcher pod) and
    // created again; while the VM has no pod, its addresses stay held for it.
    s.must(
        "kubectl",
        &[
            "-n",
            &ns,
            "delete",
            "virtualmachineinstances.kubevirt.io",
            VM,
            "--wait=true",
        ],
    );
    gone(&s, &ns, "virt-launcher-db-aaaaa").await;
    held_for(&s, &ns, &addresses, None, "stopped").await;
    an_intruder_is_refused(&s, &ns, "intruder-1", addresses[0]).await;
    start_instance(&s, &ns);
    launcher(&s, &ns, "virt-launcher-db-bbbbb", two, None);
    assert_eq!(
        addresses_of(&s, &ns, "virt-launcher-db-bbbbb").await,
        addresses,
        "restarted on {two}"
    );

    // Evicted (no live migration asked for): the pod goes through the Eviction API, the VM
    // starts again on node one.
    Api::<Pod>::namespaced(s.client.clone(), &ns)
        .evict("virt-launcher-db-bbbbb", &EvictParams::default())
        .await
        .unwrap();
    gone(&s, &ns, "virt-launcher-db-bbbbb").await;
    held_for(&s, &ns, &addresses, None, "evicted").await;
    launcher(&s, &ns, "virt-launcher-db-ccccc", one, None);
    assert_eq!(
        addresses_of(&s, &ns, "virt-launcher-db-ccccc").await,
        addresses,
        "after the eviction"
    );

    // Live migration to node two: the target gets the addresses while the source still runs
    // the guest; they are announced from the target once the instance says it runs there.
    let capture = Announcements::capture();
    launcher(&s, &ns, "virt-launcher-db-ddddd", two, Some("migration-1"));
    assert_eq!(
        addresses_of(&s, &ns, "virt-launcher-db-ddddd").await,
        addresses,
        "the migration's target"
    );
    let source: Pod = Api::namespaced(s.client.clone(), &ns)
        .get("virt-launcher-db-ccccc")
        .await
        .unwrap();
    assert_eq!(pod_ips(&source), addresses, "the source runs on meanwhile");
    held_for(
        &s,
        &ns,
        &addresses,
        Some("virt-launcher-db-ddddd"),
        "migrating",
    )
    .await;
    an_intruder_is_refused(&s, &ns, "intruder-2", addresses[0]).await;
    let before = capture.finish();
    // The macvlan plugin itself sends one gratuitous ARP for the IPv4 address from the
    // target's interface as it configures it (Debian's plugins do, beyond allot's say): that
    // names the target's MAC. The source defends the IPv6 address against the target kernel's
    // duplicate address detection with an advertisement of its own; the target sends none.
    let target = before
        .iter()
        .find(|(a, _)| *a == addresses[0])
        .map(|(_, mac)| *mac)
        .unwrap_or_else(|| panic!("the macvlan plugin's gratuitous ARP: {before:?}"));
    assert!(
        !before.contains(&(addresses[1], target)),
        "the target announced the guest's IPv6 address before the handover: {before:?}"
    );
    let capture = Announcements::capture();
    kubevirt::complete_migration(&s, &ns, VM, "migration-1", one, two);
    wait_for(
        "the target's announcements of both addresses, from its interface",
        Duration::from_secs(30),
        || async {
            let seen = capture.seen();
            addresses
                .iter()
                .all(|a| seen.contains(&(*a, target)))
                .then_some(())
                .ok_or(seen)
        },
    )
    .await;
    capture.finish();
    s.must(
        "kubectl",
        &[
            "-n",
            &ns,
            "delete",
            "pod",
            "virt-launcher-db-ccccc",
            "--wait=true",
        ],
    );
    held_for(
        &s,
        &ns,
        &addresses,
        Some("virt-launcher-db-ddddd"),
        "migrated",
    )
    .await;

    // A migration back to node one that fails: its target is deleted; the addresses stay the
    // VM's (the guest runs on at node two), and nobody else gets them.
    launcher(&s, &ns, "virt-launcher-db-eeeee", one, Some("migration-2"));
    assert_eq!(
        addresses_of(&s, &ns, "virt-launcher-db-eeeee").await,
        addresses
    );
    s.must(
        "kubectl",
        &[
            "-n",
            &ns,
            "delete",
            "pod",
            "virt-launcher-db-eeeee",
            "--wait=true",
        ],
    );
    held_for(&s, &ns, &addresses, None, "after the failed migration").await;
    an_intruder_is_refused(&s, &ns, "intruder-3", addresses[0]).await;
    let running: Pod = Api::namespaced(s.client.clone(), &ns)
        .get("virt-launcher-db-ddddd")
        .await
        .unwrap();
    assert_eq!(pod_ips(&running), addresses);
    // Released on purpose, by name: not while the guest runs with them (the claims are
    // detached, but the source launcher pod uses them)...
    let vm = format!("{ns}/{VM}");
    let refused = s.allotctl(&["ipam", "release", "--virtual-machine", &vm, "--yes"]);
    let out = String::from_utf8_lossy(&refused.stdout).to_string();
    assert!(!refused.status.success(), "{out}");
    assert!(
        out.contains("launcher pod") && out.contains("virt-launcher-db-ddddd"),
        "{out}"
    );
    held_for(
        &s,
        &ns,
        &addresses,
        None,
        "nothing released under the guest",
    )
    .await;

    // ... but once the VM is stopped (its instance deleted, the VirtualMachine kept), without a
    // terminal to confirm on only with --yes, and then its next launcher pod starts with
    // addresses from the pools, whatever they are.
    s.must(
        "kubectl",
        &[
            "-n",
            &ns,
            "delete",
            "virtualmachineinstances.kubevirt.io",
            VM,
            "--wait=true",
        ],
    );
    gone(&s, &ns, "virt-launcher-db-ddddd").await;
    held_for(&s, &ns, &addresses, None, "stopped again").await;
    let unconfirmed = s.allotctl(&["ipam", "release", "--virtual-machine", &vm]);
    let err = String::from_utf8_lossy(&unconfirmed.stderr).to_string();
    assert!(
        !unconfirmed.status.success() && err.contains("--yes"),
        "{err}"
    );
    held_for(&s, &ns, &addresses, None, "nothing released unconfirmed").await;
    let released = s.allotctl(&["ipam", "release", "--virtual-machine", &vm, "--yes"]);
    let out = String::from_utf8_lossy(&released.stdout).to_string();
    assert!(released.status.success(), "{out}");
    for a in &addresses {
        assert!(out.contains(&format!("released {a} ")), "{out}");
    }
    let held = claims_in(&s.client, &ns).await;
    assert!(held.is_empty(), "{held:?}");
    start_instance(&s, &ns);
    launcher(&s, &ns, "virt-launcher-db-fffff", two, None);
    let renewed = addresses_of(&s, &ns, "virt-launcher-db-fffff").await;
    held_for(
        &s,
        &ns,
        &renewed,
        Some("virt-launcher-db-fffff"),
        "started after the release",
    )
    .await;

    // Deleted: the VM, its instance and its pods go; GC gives the addresses back.
    s.must(
        "kubectl",
        &[
            "-n",
            &ns,
            "delete",
            "virtualmachines.kubevirt.io",
            VM,
            "--wait=true",
        ],
    );
    s.must(
        "kubectl",
        &[
            "-n",
            &ns,
            "delete",
            "virtualmachineinstances.kubevirt.io",
            VM,
            "--wait=true",
            "--ignore-not-found",
        ],
    );
    gone(&s, &ns, "virt-launcher-db-fffff").await;
    wait_for(
        "the VM's addresses released",
        Duration::from_secs(180),
        || async {
            let held = claims_in(&s.client, &ns).await;
            held.is_empty().then_some(()).ok_or(held)
        },
    )
    .await;
    s.must("kubectl", &["delete", "namespace", &ns, "--wait=true"]);
    s.must(
        "kubectl",
        &[
            "delete",
            "crd",
            "virtualmachines.kubevirt.io",
            "virtualmachineinstances.kubevirt.io",
            "--wait=true",
        ],
    );
    s.no_refusals();
}
