//! Contract checks of holders that outlive their pods: a KubeVirt virtual machine's claims
//! pass from one launcher pod (another name each time) to the next, and to nobody else.

use allot_core::store::{PodRef, Store, StoreError, VIRTUAL_MACHINE_KIND};

use super::{T0, all, attachment, claim, ip, must, pod, reattach, sorted, stateful_pod};

/// The launcher pod `name` of the virtual machine `vm`.
pub fn launcher_pod(namespace: &str, vm: &str, name: &str, uid: &str) -> PodRef {
    PodRef {
        owner_kind: Some(VIRTUAL_MACHINE_KIND.to_string()),
        owner_name: Some(vm.to_string()),
        ..pod(namespace, name, uid)
    }
}

/// A virtual machine's next launcher pod (another name) takes its detached address back; the
/// claim then names the new pod, so the by-pod lookup follows it, and the VM lookup finds it.
pub fn reattach_by_the_same_virtual_machine_succeeds(store: &dyn Store) {
    let old = attachment("c1", "net1");
    let first = launcher_pod("vms", "db", "virt-launcher-db-abcde", "uid-1");
    must(
        "claim",
        store.claim(&[
            claim("10.0.0.1", "p", Some(&old), &first, T0),
            claim("2001:db8::1", "p6", Some(&old), &first, T0),
        ]),
    );
    assert_eq!(
        must(
            "claims_of_virtual_machine",
            store.claims_of_virtual_machine("vms", "db")
        )
        .len(),
        2
    );
    must("detach", store.detach(&old, T0 + 10));

    let new = attachment("c2", "net1");
    let next = launcher_pod("vms", "db", "virt-launcher-db-fghij", "uid-2");
    let back = must(
        "reattach",
        reattach(store, ip("10.0.0.1"), &next, &new, T0 + 20),
    );
    assert_eq!(
        (back.pod.clone(), back.attachment.clone()),
        (next.clone(), Some(new.clone()))
    );
    assert_eq!(
        must(
            "claims_of_pod",
            store.claims_of_pod("vms", "virt-launcher-db-fghij")
        ),
        vec![back.clone()]
    );
    let earlier = must(
        "claims_of_pod",
        store.claims_of_pod("vms", "virt-launcher-db-abcde"),
    );
    assert!(
        earlier.iter().all(|c| c.address == ip("2001:db8::1")),
        "the earlier pod keeps only what was not taken back: {earlier:?}"
    );
    let of_vm = sorted(must(
        "claims_of_virtual_machine",
        store.claims_of_virtual_machine("vms", "db"),
    ));
    assert_eq!(of_vm.len(), 2, "{of_vm:?}");
    assert_eq!(of_vm[0], back);
    assert_eq!(of_vm[1].attachment, None);
}

/// Another virtual machine, a pod of no VM, a VM of the same name in another namespace, and a
/// StatefulSet pod cannot take a VM's detached address.
pub fn reattach_by_another_holder_of_a_virtual_machines_address_is_stale(store: &dyn Store) {
    let old = attachment("c1", "net1");
    let owner = launcher_pod("vms", "db", "virt-launcher-db-abcde", "uid-1");
    must(
        "claim",
        store.claim(&[claim("10.0.0.1", "p", Some(&old), &owner, T0)]),
    );
    let detached = must("detach", store.detach(&old, T0 + 10));
    let new = attachment("c2", "net1");
    for other in [
        launcher_pod("vms", "web", "virt-launcher-web-abcde", "uid-2"),
        pod("vms", "virt-launcher-db-fghij", "uid-3"),
        launcher_pod("other", "db", "virt-launcher-db-fghij", "uid-4"),
        stateful_pod("vms", "db-0", "uid-5"),
        PodRef {
            owner_name: Some(String::new()),
            ..launcher_pod("vms", "", "virt-launcher-x", "uid-6")
        },
    ] {
        assert_eq!(
            reattach(store, ip("10.0.0.1"), &other, &new, T0 + 20),
            Err(StoreError::Stale(ip("10.0.0.1"))),
            "{other:?} took the address of virtual machine vms/db"
        );
    }
    assert_eq!(all(store), detached);
    assert_eq!(
        must(
            "claims_of_virtual_machine",
            store.claims_of_virtual_machine("other", "db")
        ),
        vec![]
    );
    assert_eq!(
        must(
            "claims_of_virtual_machine",
            store.claims_of_virtual_machine("vms", "web")
        ),
        vec![]
    );
}
