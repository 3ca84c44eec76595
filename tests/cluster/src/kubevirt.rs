//! KubeVirt as the tests stand in for it: no KubeVirt runs here (its controllers need a container
//! runtime and a hypervisor), so a test plays virt-controller. KubeVirt's two kinds are registered
//! as structural CRDs (group, version, names and subresources as KubeVirt's, schemas left open),
//! and launcher pods are built as virt-controller builds them: owned by the
//! VirtualMachineInstance (itself owned by the VirtualMachine), labelled `kubevirt.io:
//! virt-launcher`, `kubevirt.io/created-by: <instance UID>`, `vm.kubevirt.io/name`, and a live
//! migration's target `kubevirt.io/migrationJobUID`.

use std::net::IpAddr;
use std::time::Duration;

use allot_lab::testing::wait_for;
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;

use crate::Suite;
use crate::objects::pod_ips;

/// KubeVirt's VirtualMachine and VirtualMachineInstance as CRDs of the same group, version,
/// names and subresources (status; a VM's scale is left out), with open schemas.
pub const CRDS: &str = r#"apiVersion: apiextensions.k8s.io/v1
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

/// Registers KubeVirt's kinds and waits until they are served.
pub fn register(s: &Suite) {
    s.must_apply(CRDS);
    s.must(
        "kubectl",
        &[
            "wait",
            "--for=condition=Established",
            "crd/virtualmachines.kubevirt.io",
            "crd/virtualmachineinstances.kubevirt.io",
        ],
    );
}

/// The UID of `kind/name` in `ns`.
pub fn uid(s: &Suite, ns: &str, kind: &str, name: &str) -> String {
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

/// A VirtualMachine `vm` that keeps running (its instance is the test's to create).
pub fn create_vm(s: &Suite, ns: &str, vm: &str) {
    s.must_apply(&format!(
        r#"apiVersion: kubevirt.io/v1
kind: VirtualMachine
metadata: {{name: {vm}, namespace: {ns}}}
spec:
  runStrategy: Always
  template: {{spec: {{domain: {{devices: {{}}}}}}}}
"#
    ));
}

/// A VirtualMachineInstance of `vm`, as the VM controller creates it (owned by the VM).
pub fn start_instance(s: &Suite, ns: &str, vm: &str) -> String {
    let vm_uid = uid(s, ns, "virtualmachines.kubevirt.io", vm);
    s.must_apply(&format!(
        r#"apiVersion: kubevirt.io/v1
kind: VirtualMachineInstance
metadata:
  name: {vm}
  namespace: {ns}
  labels: {{kubevirt.io/domain: {vm}}}
  ownerReferences:
    - {{apiVersion: kubevirt.io/v1, kind: VirtualMachine, name: {vm}, uid: "{vm_uid}", controller: true, blockOwnerDeletion: true}}
spec: {{domain: {{devices: {{}}}}}}
"#
    ));
    uid(s, ns, "virtualmachineinstances.kubevirt.io", vm)
}

/// A launcher pod `name` of `vm`'s instance on `node`, as virt-controller builds it; a live
/// migration's target carries the migration's UID. `annotations`: more of the pod's, as YAML
/// flow-map entries (`key: value, …`), e.g. the pools it names.
pub fn launcher(
    s: &Suite,
    ns: &str,
    vm: &str,
    name: &str,
    node: &str,
    migration: Option<&str>,
    annotations: &str,
) {
    let vmi_uid = uid(s, ns, "virtualmachineinstances.kubevirt.io", vm);
    let migration = migration
        .map(|m| format!(", kubevirt.io/migrationJobUID: \"{m}\""))
        .unwrap_or_default();
    let annotations = if annotations.is_empty() {
        String::new()
    } else {
        format!(", {annotations}")
    };
    s.must_apply(&format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: {name}
  namespace: {ns}
  labels: {{kubevirt.io: virt-launcher, kubevirt.io/created-by: "{vmi_uid}", vm.kubevirt.io/name: {vm}, kubevirt.io/domain: {vm}{migration}}}
  annotations: {{kubevirt.io/domain: {vm}{annotations}}}
  ownerReferences:
    - {{apiVersion: kubevirt.io/v1, kind: VirtualMachineInstance, name: {vm}, uid: "{vmi_uid}", controller: true, blockOwnerDeletion: true}}
spec:
  nodeName: {node}
  terminationGracePeriodSeconds: 1
  containers: [{{name: compute, image: busybox, command: [sleep, "3600"]}}]
"#
    ));
}

/// The two addresses (IPv4, IPv6) of launcher pod `name` once it runs.
pub async fn addresses_of(s: &Suite, ns: &str, name: &str) -> Vec<IpAddr> {
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

/// Marks `vm`'s instance as running on `node` after live migration `migration` from `source`
/// completed, as virt-handler writes it.
pub fn complete_migration(
    s: &Suite,
    ns: &str,
    vm: &str,
    migration: &str,
    source: &str,
    node: &str,
) {
    s.must(
        "kubectl",
        &[
            "-n",
            ns,
            "patch",
            "virtualmachineinstances.kubevirt.io",
            vm,
            "--subresource=status",
            "--type=merge",
            "-p",
            &format!(
                r#"{{"status":{{"nodeName":"{node}","migrationState":{{"migrationUid":"{migration}","sourceNode":"{source}","targetNode":"{node}","completed":true}}}}}}"#
            ),
        ],
    );
}
