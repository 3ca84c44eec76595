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
use allot_cluster_tests::objects::{Held, claims_in, pod_ips};
use allot_lab::capture::Capture;
use allot_lab::testing::wait_for;
use k8s_openapi::api::core::v1::{Event, Node, Pod};
use kube::api::{Api, EvictParams, ListParams};

/// KubeVirt's VirtualMachine and VirtualMachineInstance as CRDs of the same group, version,
/// names and subresources (status; a VM's scale is left out), with open schemas.
const KUBEVIRT_CRDS: &str = r#"apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: virtualmachines.kubevirt.io}
spec:
  group: kubevirt.io
  scope: Namespaced
  names: {plural: virtualmachines, singular: virtualmachine, kind: VirtualMachine, shortNames: [vm, vms]}
  versions:
    - name: v1
      served: true
      storage: true
      subresources: {status: {}}
      schema:
        openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}
---
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: virtualmachineinstances.kubevirt.io}
spec:
  group: kubevirt.io
  scope: Namespaced
  names: {plural: virtualmachineinstances, singular: virtualmachineinstance, kind: VirtualMachineInstance, shortNames: [vmi, vmis]}
  versions:
    - name: v1
      served: true
      storage: true
      subresources: {status: {}}
      schema:
        openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}
"#;

const VM: &str = "db";

/// The lab's L2 segment, in this machine's namespace (see `allot_lab::net`).
const SEGMENT: &str = allot_lab::net::BRIDGE;

/// The UID of `kind/name` in `ns`.
fn uid(s: &Suite, ns: &str, kind: &str, name: &str) -> String {
    s.must(
        "kubectl",
        &[
            "-n",
            ns,
            "get",
            kind,
            name,
            "-o",
            "jsonpath={.metadata.uid}",
        ],
    )
}

/// A VirtualMachineInstance of the VM, as the VM controller creates it (owned by the VM).
fn start_instance(s: &Suite, ns: &str) -> String {
    let vm_uid = uid(s, ns, "virtualmachines.kubevirt.io", VM);
    s.must_apply(&format!(
        r#"apiVersion: kubevirt.io/v1
kind: VirtualMachineInstance
metadata:
  name: {VM}
  namespace: {ns}
  labels: {{kubevirt.io/domain: {VM}}}
  ownerReferences:
    - {{apiVersion: kubevirt.io/v1, kind: VirtualMachine, name: {VM}, uid: "{vm_uid}", controller: true, blockOwnerDeletion: true}}
spec: {{domain: {{devices: {{}}}}}}
"#
    ));
    uid(s, ns, "virtualmachineinstances.kubevirt.io", VM)
}

/// A launcher pod of the VM's instance on `node`, as virt-controller builds it; a live
/// migration's target carries the migration's UID.
fn launcher(s: &Suite, ns: &str, name: &str, node: &str, migration: Option<&str>) {
    let vmi_uid = uid(s, ns, "virtualmachineinstances.kubevirt.io", VM);
    let migration = migration
        .map(|m| format!(", kubevirt.io/migrationJobUID: \"{m}\""))
        .unwrap_or_default();
    s.must_apply(&format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: {name}
  namespace: {ns}
  labels: {{kubevirt.io: virt-launcher, kubevirt.io/created-by: "{vmi_uid}", vm.kubevirt.io/name: {VM}, kubevirt.io/domain: {VM}{migration}}}
  annotations: {{kubevirt.io/domain: {VM}}}
  ownerReferences:
    - {{apiVersion: kubevirt.io/v1, kind: VirtualMachineInstance, name: {VM}, uid: "{vmi_uid}", controller: true, blockOwnerDeletion: true}}
spec:
  nodeName: {node}
  terminationGracePeriodSeconds: 1
  containers: [{{name: compute, image: busybox, command: [sleep, "3600"]}}]
"#
    ));
}

/// The addresses of launcher pod `name` once it runs.
async fn addresses_of(s: &Suite, ns: &str, name: &str) -> Vec<IpAddr> {
    let pods: Api<Pod> = Api::namespaced(s.client.clone(), ns);
    wait_for(
        &format!("{ns}/{name} running with addresses"),
        Duration::from_secs(90),
        || async {
            let pod = pods.get(name).await.map_err(|e| e.to_string())?;
            let ips = pod_ips(&pod);
            (ips.len() == 2)
                .then_some(ips)
                .ok_or(format!("{:?}", pod.status))
        },
    )
    .await
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
/// guest is handed over there and not before, and are released once the VM is gone.
#[tokio::test]
async fn a_virtual_machine_keeps_its_addresses_through_restarts_evictions_and_migrations() {
    let Some(s) = Suite::shared(
        "a_virtual_machine_keeps_its_addresses_through_restarts_evictions_and_migrations",
    )
    .await
    else {
        return;
    };
    s.must_apply(KUBEVIRT_CRDS);
    s.must(
        "kubectl",
        &[
            "wait",
            "--for=condition=Established",
            "crd/virtualmachines.kubevirt.io",
            "crd/virtualmachineinstances.kubevirt.io",
        ],
    );
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
    s.must_apply(&format!(
        r#"apiVersion: kubevirt.io/v1
kind: VirtualMachine
metadata: {{name: {VM}, namespace: {ns}}}
spec:
  runStrategy: Always
  template: {{spec: {{domain: {{devices: {{}}}}}}}}
"#
    ));

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
    s.must(
        "kubectl",
        &[
            "-n",
            &ns,
            "patch",
            "virtualmachineinstances.kubevirt.io",
            VM,
            "--subresource=status",
            "--type=merge",
            "-p",
            &format!(
                r#"{{"status":{{"nodeName":"{two}","migrationState":{{"migrationUid":"migration-1","sourceNode":"{one}","targetNode":"{two}","completed":true}}}}}}"#
            ),
        ],
    );
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
    gone(&s, &ns, "virt-launcher-db-ddddd").await;
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
