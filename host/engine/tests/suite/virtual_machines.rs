//! A KubeVirt virtual machine's address: held for the VM across its launcher pods (restarts,
//! evictions, a live migration's target on another node), never free meanwhile, released only
//! by the cluster's GC once the VM is gone.

use std::collections::BTreeSet;
use std::sync::Arc;

use allot_core::policy::Owner;
use allot_core::store::{MemoryStore, Store, VIRTUAL_MACHINE_KIND};
use allot_engine::{AddRequest, AllocError, Engine, EngineConfig};

use crate::common::*;

type Node = Engine<Arc<MemoryStore>, CniDefaultsPolicy>;

/// Two agents (node-1, node-2) on one store, with a pool of exactly `size` addresses.
fn two_nodes(size: u8) -> (Node, Node, Arc<MemoryStore>) {
    let store = Arc::new(MemoryStore::new());
    let last = format!("10.0.0.{}", 9 + size);
    let range = format!("10.0.0.10-{last}");
    let node = |name: &str| {
        engine_on(
            store.clone(),
            vec![pool("a", "10.0.0.0/24", &[&range], None)],
            quick(),
        )
        .on_node(name)
    };
    (node("node-1"), node("node-2"), store)
}

/// The ADD of launcher pod `pod` of virtual machine `vm` (the pod's controller is the
/// VirtualMachineInstance, which the agent reports as the VM), on `net1`.
fn launcher(container: &str, pod: &str, vm: &str) -> AddRequest {
    let mut r = add_req(container, "net1", &["a"], &[]);
    r.pod.name = pod.into();
    r.pod.owner = Some(Owner {
        kind: VIRTUAL_MACHINE_KIND.into(),
        name: vm.into(),
    });
    r
}

fn address(e: &Node, r: &AddRequest) -> std::net::IpAddr {
    e.add(r).unwrap().allocations[0].address
}

/// Restarted, evicted, stopped and started: every new launcher pod (another name each time,
/// on either node) gets the VM's address, and while the VM has no launcher pod the address
/// stays held: a pool of one address has nothing for anyone else.
#[test]
fn a_virtual_machine_keeps_its_address_across_launcher_pods() {
    let (n1, n2, store) = two_nodes(1);
    let first = address(&n1, &launcher("c1", "virt-launcher-db-aaaaa", "db"));
    n1.del(&att("c1", "net1")).unwrap();
    assert_eq!(store.detached().unwrap().len(), 1, "kept for the VM");
    let other = n1.add(&add_req("c9", "eth0", &["a"], &[]));
    assert!(
        matches!(other, Err(AllocError::NoPoolFits { .. })),
        "{other:?}"
    );
    let another_vm = n1.add(&launcher("c8", "virt-launcher-web-zzzzz", "web"));
    assert!(
        matches!(another_vm, Err(AllocError::NoPoolFits { .. })),
        "{another_vm:?}"
    );

    // Started again on the other node: another pod name, the same address.
    assert_eq!(
        address(&n2, &launcher("c2", "virt-launcher-db-bbbbb", "db")),
        first
    );
    let held = store.all().unwrap();
    assert_eq!(held.len(), 1);
    assert_eq!(held[0].pod.name, "virt-launcher-db-bbbbb");
    assert_eq!(held[0].node, "node-2");
}

/// A restart whose old launcher pod's DEL comes late: the new pod takes the address over, and
/// the late DEL takes nothing from it.
#[test]
fn a_late_del_of_the_previous_launcher_pod_takes_nothing() {
    let (n1, _, store) = two_nodes(2);
    let first = address(&n1, &launcher("c1", "virt-launcher-db-aaaaa", "db"));
    assert_eq!(
        address(&n1, &launcher("c2", "virt-launcher-db-bbbbb", "db")),
        first
    );
    assert!(n1.del(&att("c1", "net1")).unwrap().is_empty());
    let held = store.claims_of(&att("c2", "net1")).unwrap();
    assert_eq!(held.len(), 1);
    assert_eq!(held[0].address, first);
}

/// Live migration: the target launcher pod on node-2 gets the address while the source on
/// node-1 still runs the guest (one claim, never free: a third pod gets nothing from a pool of
/// one); at completion the source's DEL releases nothing and the target holds it.
#[test]
fn a_live_migration_target_takes_the_address_and_the_sources_del_leaves_it() {
    let (n1, n2, store) = two_nodes(1);
    let source = launcher("c1", "virt-launcher-db-aaaaa", "db");
    let mut target = launcher("c2", "virt-launcher-db-bbbbb", "db");
    target.node.name = "node-2".into();
    let first = address(&n1, &source);
    assert_eq!(address(&n2, &target), first);
    assert!(
        n1.add(&add_req("c9", "eth0", &["a"], &[])).is_err(),
        "a third pod"
    );
    // The source's CNI GC on node-1 (its sandbox is still valid there) sees nothing of it.
    let valid = BTreeSet::from([att("c1", "net1")]);
    assert!(n1.gc("net-a", &valid).unwrap().released.is_empty());
    assert!(n1.del(&att("c1", "net1")).unwrap().is_empty(), "completion");
    let held = store.all().unwrap();
    assert_eq!(held.len(), 1);
    assert_eq!(held[0].attachment, Some(att("c2", "net1")));
    assert_eq!(held[0].node, "node-2");
    // A retried ADD of the target answers the same.
    assert_eq!(address(&n2, &target), first);
}

/// A failed migration: the target's DEL leaves the address held for the VM (the source runs
/// on with it): no third pod gets it, and the VM's next launcher pod (a retried migration, a
/// restart) takes it back.
#[test]
fn a_failed_migration_leaves_the_address_with_the_virtual_machine() {
    let (n1, n2, store) = two_nodes(1);
    let first = address(&n1, &launcher("c1", "virt-launcher-db-aaaaa", "db"));
    assert_eq!(
        address(&n2, &launcher("c2", "virt-launcher-db-bbbbb", "db")),
        first
    );
    let kept = n2.del(&att("c2", "net1")).unwrap();
    assert_eq!(kept.len(), 1);
    assert_eq!(kept[0].attachment, None, "detached, not released");
    assert!(
        n2.add(&add_req("c9", "eth0", &["a"], &[])).is_err(),
        "a third pod"
    );
    // The source's own DEL, later, finds nothing of it either.
    assert!(n1.del(&att("c1", "net1")).unwrap().is_empty());
    assert_eq!(store.all().unwrap().len(), 1);
    assert_eq!(
        address(&n2, &launcher("c3", "virt-launcher-db-ccccc", "db")),
        first
    );
}

/// Kept addresses of StatefulSets expire on the agent's timer; a VM's are kept however long
/// it is stopped (the cluster's GC releases them when the VM is deleted). A CNI GC that finds
/// a launcher pod's sandbox gone (its DEL lost) keeps the address for the VM too.
#[test]
fn a_stopped_virtual_machines_address_outlives_timers_and_lost_dels() {
    let config = EngineConfig {
        stateful_keep: 10,
        ..quick()
    };
    let (clock, now) = manual_clock(1000);
    let store = Arc::new(MemoryStore::with_clock(clock.clone()));
    let e = Engine::with_config(store.clone(), CniDefaultsPolicy, config, clock).on_node("node-1");
    e.load(
        vec![pool("a", "10.0.0.0/24", &["10.0.0.10-10.0.0.19"], None)],
        vec![],
        vec![],
    )
    .unwrap();
    let first = address(&e, &launcher("c1", "virt-launcher-db-aaaaa", "db"));
    let none = BTreeSet::new();
    e.gc("net-a", &none).unwrap();
    now.store(1001, std::sync::atomic::Ordering::SeqCst);
    let report = e.gc("net-a", &none).unwrap();
    assert!(report.released.is_empty(), "{report:?}");
    assert_eq!(report.kept.len(), 1);
    now.store(100_000, std::sync::atomic::Ordering::SeqCst);
    assert!(e.expire_kept().unwrap().is_empty());
    assert_eq!(
        address(&e, &launcher("c2", "virt-launcher-db-bbbbb", "db")),
        first
    );
}

/// A launcher pod whose VM's address is in a pool the policy does not give it (another node's
/// pool, say) fails the NIC naming the address: the guest keeps its address, so another one
/// would cut it off.
#[test]
fn a_virtual_machine_never_silently_gets_another_address() {
    let (n1, _, _) = two_nodes(4);
    let first = address(&n1, &launcher("c1", "virt-launcher-db-aaaaa", "db"));
    n1.del(&att("c1", "net1")).unwrap();
    n1.load(
        vec![
            pool("a", "10.0.0.0/24", &["10.0.0.10-10.0.0.13"], None),
            pool("b", "10.0.1.0/24", &["10.0.1.10-10.0.1.13"], None),
        ],
        vec![],
        vec![],
    )
    .unwrap();
    let mut elsewhere = launcher("c2", "virt-launcher-db-bbbbb", "db");
    elsewhere.cni_defaults.ipv4 = vec!["b".into()];
    let err = n1.add(&elsewhere).unwrap_err().to_string();
    assert!(
        err.contains(&first.to_string()) && err.contains("db"),
        "{err}"
    );
    assert!(err.contains("no other address"), "{err}");
}

/// The VM's addresses on one network are not taken by its NIC on another.
#[test]
fn each_network_of_a_virtual_machine_keeps_its_own_address() {
    let (n1, _, _) = two_nodes(4);
    let a = address(&n1, &launcher("c1", "virt-launcher-db-aaaaa", "db"));
    let mut second = launcher("c1", "virt-launcher-db-aaaaa", "db");
    second.attachment.interface = "net2".into();
    second.network = "net-b".into();
    let b = address(&n1, &second);
    n1.del(&att("c1", "net1")).unwrap();
    n1.del(&att("c1", "net2")).unwrap();
    let mut again = launcher("c2", "virt-launcher-db-bbbbb", "db");
    again.attachment.interface = "net2".into();
    again.network = "net-b".into();
    assert_eq!(address(&n1, &again), b);
    assert_eq!(
        address(&n1, &launcher("c2", "virt-launcher-db-bbbbb", "db")),
        a
    );
}

/// A VM launcher pod's address carried over by `allotctl migrate` from Spiderpool: the claim
/// names the VM as its owner and no network (Spiderpool records none) nor node, on a sandbox of
/// the migration's. The VM's live migration target on another node takes it over exactly as it
/// takes over allot's own (the same address, never a fresh one: the guest keeps its address),
/// and from then on the claim records the network and node, as if allot had made it.
#[test]
fn a_migrated_virtual_machine_keeps_its_address_through_a_live_migration() {
    let (_, n2, store) = two_nodes(2);
    let source = launcher("c1", "virt-launcher-db-aaaaa", "db");
    let migrated = allot_core::store::Claim {
        address: "10.0.0.11".parse().unwrap(),
        pool: "a".into(),
        network: String::new(),
        attachment: Some(allot_core::store::Attachment {
            container_id: allot_core::migrate::migrated_sandbox(
                allot_core::migrate::Peer::Spiderpool,
                "uid-source",
            ),
            interface: "net1".into(),
        }),
        pod: allot_core::store::PodRef {
            namespace: source.pod.namespace.clone(),
            name: source.pod.name.clone(),
            uid: "uid-source".into(),
            owner_kind: Some(VIRTUAL_MACHINE_KIND.into()),
            owner_name: Some("db".into()),
        },
        node: String::new(),
        updated_at: 0,
    };
    store.claim(std::slice::from_ref(&migrated)).unwrap();
    n2.sync().unwrap();
    let mut target = launcher("c2", "virt-launcher-db-bbbbb", "db");
    target.node.name = "node-2".into();
    assert_eq!(address(&n2, &target), migrated.address);
    let held = store.all().unwrap();
    assert_eq!(held.len(), 1, "one claim, never a second address: {held:?}");
    assert_eq!(held[0].attachment, Some(att("c2", "net1")));
    assert_eq!(held[0].network, target.network, "the network is recorded");
    assert_eq!(held[0].node, "node-2");
    // The VM's other NIC of the same pool, also migrated without a network, stays its own.
    assert!(
        n2.add(&add_req("c9", "eth0", &["a"], &[])).is_ok(),
        "the pool's other address is free"
    );
}
