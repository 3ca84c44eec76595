//! The controller's index on KubeVirt's virtual machines, fed object by object: what GC may
//! conclude about a launcher pod's address.

use allot_core::gc::OwnerState;
use allot_core::store::{Claim, PodRef, VIRTUAL_MACHINE_KIND};
use allot_index::{
    ClusterIndex, IndexResource, KubeVirt, VirtualMachineInstanceObject, VirtualMachineObject,
};
use kube::api::DynamicObject;
use kube::core::PartialObjectMeta;
use serde_json::json;

fn meta(ns: &str, name: &str) -> PartialObjectMeta<DynamicObject> {
    serde_json::from_value(json!({
        "apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata",
        "metadata": {"namespace": ns, "name": name, "uid": format!("uid-{name}")}
    }))
    .unwrap()
}

fn vm_claim(ns: &str, vm: &str) -> Claim {
    Claim {
        address: "192.0.2.10".parse().unwrap(),
        pool: "p".into(),
        network: "net".into(),
        attachment: None,
        pod: PodRef {
            namespace: ns.into(),
            name: format!("virt-launcher-{vm}-x7k2p"),
            uid: "uid-pod".into(),
            owner_kind: Some(VIRTUAL_MACHINE_KIND.into()),
            owner_name: Some(vm.into()),
        },
        node: "node-1".into(),
        updated_at: 0,
    }
}

#[test]
fn a_virtual_machine_is_gone_only_when_known_to_be() {
    let mut i = ClusterIndex::new();
    let db = vm_claim("vms", "db");
    assert_eq!(
        i.owner_state(&db),
        OwnerState::VirtualMachine,
        "before discovery answered: kept"
    );
    i.set_kubevirt(KubeVirt::Served);
    i.apply(VirtualMachineInstanceObject(meta("vms", "db")));
    assert_eq!(
        i.owner_state(&db),
        OwnerState::VirtualMachine,
        "seen before the lists"
    );
    assert_eq!(
        i.owner_state(&vm_claim("vms", "web")),
        OwnerState::VirtualMachine,
        "not listed yet: kept"
    );
    i.reset(vec![VirtualMachineObject(meta("vms", "db"))]);
    i.reset(Vec::<VirtualMachineInstanceObject>::new());
    assert_eq!(
        i.owner_state(&db),
        OwnerState::VirtualMachine,
        "the VM exists"
    );
    assert_eq!(
        i.owner_state(&vm_claim("vms", "web")),
        OwnerState::VirtualMachineGone
    );
    assert_eq!(
        i.owner_state(&vm_claim("other", "db")),
        OwnerState::VirtualMachineGone,
        "a VM of that name in another namespace is another VM"
    );
    // A bare VirtualMachineInstance is a virtual machine too.
    i.apply(VirtualMachineInstanceObject(meta("vms", "web")));
    assert_eq!(
        i.owner_state(&vm_claim("vms", "web")),
        OwnerState::VirtualMachine
    );
    i.delete(VirtualMachineObject(meta("vms", "db")));
    assert_eq!(i.owner_state(&db), OwnerState::VirtualMachineGone);

    // KubeVirt uninstalled: no VM exists any more; served again: unknown until listed.
    i.set_kubevirt(KubeVirt::Absent);
    assert_eq!(
        i.owner_state(&vm_claim("vms", "web")),
        OwnerState::VirtualMachineGone
    );
    i.set_kubevirt(KubeVirt::Served);
    assert_eq!(i.owner_state(&db), OwnerState::VirtualMachine);
}
