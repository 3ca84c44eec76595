//! Adoption, on the real control plane: a cluster whose pods got their addresses under
//! Spiderpool (and one workload under Whereabouts) switches to allot. The peers' real CRDs (their
//! published sources at pinned releases); the pods' addresses given by real CNI plugins
//! (macvlan, host-local) from ranges inside the peers' pools, and the peers' objects written as
//! those peers write them, recording exactly those addresses; allot installed by the README's
//! helm install; then `allotctl migrate`, the switch of the nodes' network configuration, and
//! what users must see: every pod keeps its address, new pods never collide, a StatefulSet pod
//! restarted gets its address back, a KubeVirt VM's launcher pod's addresses stay the VM's
//! through a live migration (a target on another node takes them, GC never frees them), a run
//! of the migration after the switch changes nothing allot owns (not a claim GC released since,
//! not an Endpoint the agent wrote), and the audit finds nothing.
//!
//! A lab of its own (the cluster starts without allot): run in the own-lab phase.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::time::Duration;

use allot_cluster_tests::Suite;
use allot_cluster_tests::kubevirt;
use allot_cluster_tests::objects::{Workload, claims_in, endpoint_ips, pod_ips};
use allot_cluster_tests::peers::{
    addresses, crd_files, create, remove_peer_conflist, sandbox_id, spider_endpoint,
    write_peer_conflist,
};
use allot_k8s::peers::{spiderpool, whereabouts};
use allot_k8s::{IPPool, ReservedIP, Subnet};
use allot_lab::testing::wait_for;
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use serde_json::json;

const NS: &str = "shop";
/// The KubeVirt virtual machine whose launcher pod holds Spiderpool addresses.
const VM: &str = "vm";
/// A pod Spiderpool still records but that is gone: its address of `sp-v4`.
const GONE: &str = "198.51.100.215";
/// The VM's launcher pod before the switch, and its live migration's target after it.
const SOURCE: &str = "virt-launcher-vm-aaaaa";
const TARGET: &str = "virt-launcher-vm-bbbbb";
/// The pools the VM's launcher pods name (Spiderpool's annotation, which allot's policy reads).
const LAUNCHER_POOLS: &str = r#"ipam.spidernet.io/ippool: '{"ipv4":["sp-v4"],"ipv6":["sp-v6"]}'"#;

/// Whether the claims `held` are exactly `wanted`, but for [`GONE`]'s (the record of a pod gone
/// since, which GC may have released by now).
fn claimed_exactly(
    held: &BTreeMap<IpAddr, allot_cluster_tests::objects::Held>,
    wanted: &BTreeSet<IpAddr>,
) -> bool {
    let gone: IpAddr = GONE.parse().unwrap();
    let mut held: BTreeSet<IpAddr> = held.keys().copied().collect();
    held.remove(&gone);
    held == *wanted
}

fn workloads() -> String {
    let spider = r#"{"ipv4":["sp-v4"],"ipv6":["sp-v6"]}"#;
    // No Multus in the lab: where a NetworkAttachmentDefinition's ipam section would name the
    // pools once switched, the pods name them.
    let wb = r#"{"ipv4":["whereabouts-198.51.100.0-24"],"ipv6":["whereabouts-2001-db8-1ab---64"]}"#;
    let on_first_two = "      affinity: {nodeAffinity: {requiredDuringSchedulingIgnoredDuringExecution: \
                        {nodeSelectorTerms: [{matchExpressions: [{key: kubernetes.io/hostname, \
                        operator: In, values: [node-1, node-2]}]}]}}}\n";
    [
        Workload::deployment(NS, "web", 3)
            .annotate("ipam.spidernet.io/ippool", spider)
            .grace(1)
            .pod_spec(on_first_two),
        Workload::statefulset(NS, "db", 2)
            .annotate("ipam.spidernet.io/ippool", spider)
            .grace(1)
            .pod_spec(on_first_two),
        Workload::deployment(NS, "wb", 1)
            .pools(wb)
            .grace(1)
            .pod_spec("      nodeSelector: {kubernetes.io/hostname: node-3}\n"),
    ]
    .map(|w| w.yaml())
    .join("---\n")
}

/// Refuses the creation of IPPool `sp-v6` (a ValidatingAdmissionPolicy): a migration that
/// stops there has written everything but that pool, as if interrupted at its last step.
const INTERRUPT: &str = r#"apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata: {name: interrupt-migration}
spec:
  failurePolicy: Fail
  matchConstraints:
    resourceRules:
      - {apiGroups: [allot.dev], apiVersions: ["*"], operations: [CREATE], resources: [ippools]}
  validations:
    - {expression: "object.metadata.name != 'sp-v6'", message: "interrupted for the test"}
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata: {name: interrupt-migration}
spec: {policyName: interrupt-migration, validationActions: [Deny]}
"#;

fn owner(pod: &Pod) -> (&'static str, &'static str) {
    let name = pod.metadata.name.as_deref().unwrap();
    if name.starts_with("db-") {
        ("StatefulSet", "db")
    } else if name.starts_with("virt-launcher-") {
        ("VirtualMachineInstance", VM)
    } else {
        ("Deployment", "web")
    }
}

fn offset(base: &str, address: IpAddr) -> String {
    let n = |ip: IpAddr| match ip {
        IpAddr::V4(v) => u128::from(u32::from(v)),
        IpAddr::V6(v) => u128::from(v),
    };
    (n(address) - n(base.parse().unwrap())).to_string()
}

/// Spiderpool's objects for `pods`, as its controller and agents leave them (a KubeVirt
/// launcher pod's keyed by its instance, with Spiderpool's default `enableKubevirtStaticIP`),
/// and the record of a pod that is gone since.
async fn write_spiderpool(s: &Suite, pods: &[Pod]) {
    let mut allocated: [BTreeMap<String, serde_json::Value>; 2] = Default::default();
    allocated[0].insert(
        GONE.into(),
        json!({"pod": format!("{NS}/web-gone"), "podUid": "uid-of-a-pod-gone-since"}),
    );
    for pod in pods {
        let (v4, v6) = addresses(pod);
        let key = match owner(pod) {
            ("VirtualMachineInstance", vmi) => vmi,
            _ => pod.metadata.name.as_deref().unwrap(),
        };
        let record = json!({
            "pod": format!("{NS}/{key}"),
            "podUid": pod.metadata.uid,
        });
        allocated[0].insert(v4.to_string(), record.clone());
        allocated[1].insert(v6.to_string(), record);
        let e = spider_endpoint(pod, owner(pod), ("sp-v4", v4, 24), ("sp-v6", v6, 64));
        create(&s.client, spiderpool::ENDPOINT, e).await.unwrap();
    }
    create(
        &s.client,
        spiderpool::SUBNET,
        json!({
            "apiVersion": "spiderpool.spidernet.io/v2beta1", "kind": "SpiderSubnet",
            "metadata": {"name": "sp-subnet-v4"},
            "spec": {"ipVersion": 4, "subnet": "198.51.100.0/24",
                     "ips": ["198.51.100.192-198.51.100.223"], "gateway": "198.51.100.1"},
        }),
    )
    .await
    .unwrap();
    create(
        &s.client,
        spiderpool::RESERVED_IP,
        json!({
            "apiVersion": "spiderpool.spidernet.io/v2beta1", "kind": "SpiderReservedIP",
            "metadata": {"name": "sp-reserved"},
            "spec": {"ipVersion": 4, "ips": ["198.51.100.223"]},
        }),
    )
    .await
    .unwrap();
    let pools = [
        (
            "sp-v4",
            4,
            "198.51.100.0/24",
            "198.51.100.192-198.51.100.223",
            "198.51.100.1",
            32,
        ),
        (
            "sp-v6",
            6,
            "2001:db8:1ab::/64",
            "2001:db8:1ab::5:0-2001:db8:1ab::5:ff",
            "2001:db8:1ab::1",
            256,
        ),
    ];
    for (i, (name, version, subnet, ips, gateway, total)) in pools.into_iter().enumerate() {
        let mut labels = json!({});
        if version == 4 {
            // Spiderpool's webhook labels a pool with the SpiderSubnet it lies in.
            labels = json!({"ipam.spidernet.io/owner-spider-subnet": "sp-subnet-v4"});
        }
        let pool = json!({
            "apiVersion": "spiderpool.spidernet.io/v2beta1", "kind": "SpiderIPPool",
            "metadata": {"name": name, "labels": labels, "finalizers": ["spiderpool.spidernet.io"]},
            "spec": {"ipVersion": version, "subnet": subnet, "ips": [ips], "gateway": gateway,
                     "default": false, "disable": false},
            // status.allocatedIPs is a JSON text (convert.MarshalIPPoolAllocatedIPs).
            "status": {
                "allocatedIPs": serde_json::to_string(&allocated[i]).unwrap(),
                "allocatedIPCount": allocated[i].len(),
                "totalIPCount": total,
            },
        });
        create(&s.client, spiderpool::IPPOOL, pool).await.unwrap();
    }
}

/// Whereabouts's objects for `pod`: the network's configuration, the IPPool per range with the
/// allocation keyed by offset, the OverlappingRangeIPReservation per address.
async fn write_whereabouts(s: &Suite, pod: &Pod) {
    let (v4, v6) = addresses(pod);
    let podref = format!("{NS}/{}", pod.metadata.name.as_deref().unwrap());
    let id = sandbox_id(&s.lab, pod);
    let config = json!({
        "cniVersion": "0.3.1", "name": "underlay",
        "plugins": [{"type": "macvlan", "master": "eth0", "mode": "bridge", "ipam": {
            "type": "whereabouts",
            "ipRanges": [
                {"range": "198.51.100.0/24", "range_start": "198.51.100.224",
                 "range_end": "198.51.100.239"},
                {"range": "2001:db8:1ab::/64", "range_start": "2001:db8:1ab::6:0",
                 "range_end": "2001:db8:1ab::6:ff"}
            ],
            "gateway": "198.51.100.1",
            "kubernetes": {"kubeconfig": "/etc/cni/net.d/whereabouts.d/whereabouts.kubeconfig"}
        }}]
    });
    create(
        &s.client,
        whereabouts::NETWORK_ATTACHMENT_DEFINITION,
        json!({
            "apiVersion": "k8s.cni.cncf.io/v1", "kind": "NetworkAttachmentDefinition",
            "metadata": {"name": "underlay", "namespace": NS},
            "spec": {"config": config.to_string()},
        }),
    )
    .await
    .unwrap();
    for (name, range, base, address) in [
        ("198.51.100.0-24", "198.51.100.0/24", "198.51.100.0", v4),
        (
            "2001-db8-1ab---64",
            "2001:db8:1ab::/64",
            "2001:db8:1ab::",
            v6,
        ),
    ] {
        let mut allocations = serde_json::Map::new();
        allocations.insert(
            offset(base, address),
            json!({"id": id, "podref": podref, "ifname": "eth0"}),
        );
        create(
            &s.client,
            whereabouts::IPPOOL,
            json!({
                "apiVersion": "whereabouts.cni.cncf.io/v1alpha1", "kind": "IPPool",
                "metadata": {"name": name, "namespace": "kube-system"},
                "spec": {"range": range, "allocations": allocations},
            }),
        )
        .await
        .unwrap();
        create(
            &s.client,
            whereabouts::RESERVATION,
            json!({
                "apiVersion": "whereabouts.cni.cncf.io/v1alpha1",
                "kind": "OverlappingRangeIPReservation",
                "metadata": {"name": address.to_string().replace(':', "-"), "namespace": "kube-system"},
                "spec": {"podref": podref, "ifname": "eth0"},
            }),
        )
        .await
        .unwrap();
    }
}

fn text(o: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// `allotctl` that must succeed (or fail, `ok: false`), its output.
fn allotctl(s: &Suite, args: &[&str], ok: bool) -> String {
    let out = s.allotctl(args);
    println!("$ allotctl {}\n{}", args.join(" "), text(&out));
    assert_eq!(
        out.status.success(),
        ok,
        "allotctl {}: {}\n{}",
        args.join(" "),
        out.status,
        text(&out)
    );
    text(&out)
}

#[tokio::test]
async fn pods_of_spiderpool_and_whereabouts_keep_their_addresses_through_the_switch() {
    let Some(s) = Suite::own("migration", 3, |_| {}).await else {
        return;
    };
    let nodes = s.lab.nodes();
    assert_eq!(
        nodes.iter().map(|n| n.name.as_str()).collect::<Vec<_>>(),
        ["node-1", "node-2", "node-3"]
    );
    // Before allot: host-local ranges inside Spiderpool's pools on node-1 and node-2, inside
    // Whereabouts's range on node-3.
    write_peer_conflist(
        &nodes[0],
        ("198.51.100.192", "198.51.100.199"),
        ("2001:db8:1ab::5:0", "2001:db8:1ab::5:f"),
    );
    write_peer_conflist(
        &nodes[1],
        ("198.51.100.200", "198.51.100.207"),
        ("2001:db8:1ab::5:10", "2001:db8:1ab::5:1f"),
    );
    write_peer_conflist(
        &nodes[2],
        ("198.51.100.224", "198.51.100.231"),
        ("2001:db8:1ab::6:0", "2001:db8:1ab::6:f"),
    );
    for file in crd_files() {
        s.must(
            "kubectl",
            &["apply", "--server-side", "-f", file.to_str().unwrap()],
        );
    }
    s.must(
        "kubectl",
        &[
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            "crd",
            "--all",
        ],
    );
    s.namespace(NS).await;
    s.must_apply(&workloads());
    // A KubeVirt VM whose launcher pod on node-1 got Spiderpool's addresses.
    kubevirt::register(&s);
    kubevirt::create_vm(&s, NS, VM);
    kubevirt::start_instance(&s, NS, VM);
    kubevirt::launcher(&s, NS, VM, SOURCE, "node-1", None, LAUNCHER_POOLS);
    let vm_addresses = kubevirt::addresses_of(&s, NS, SOURCE).await;
    let web = s.ready_pods(NS, "app=web", 3).await;
    let db = s.ready_pods(NS, "app=db", 2).await;
    let wb = s.ready_pods(NS, "app=wb", 1).await;
    let source: Pod = Api::namespaced(s.client.clone(), NS)
        .get(SOURCE)
        .await
        .unwrap();
    let spider_pods: Vec<Pod> = web.iter().chain(&db).chain([&source]).cloned().collect();
    write_spiderpool(&s, &spider_pods).await;
    write_whereabouts(&s, &wb[0]).await;
    let before: BTreeMap<String, (String, Vec<IpAddr>)> = spider_pods
        .iter()
        .chain(&wb)
        .map(|p| {
            let name = p.metadata.name.clone().unwrap();
            (name, (p.metadata.uid.clone().unwrap(), pod_ips(p)))
        })
        .collect();

    // allot, as the README installs it (its agents write their network configuration, which
    // waits behind the peer's until the switch).
    s.install().await;

    // A dry run writes nothing.
    let dry = allotctl(&s, &["migrate", "spiderpool", "--dry-run"], true);
    assert!(dry.contains("nothing was written (dry run)"), "{dry}");
    assert!(dry.contains("IPPool sp-v4"), "{dry}");
    let pools: Api<IPPool> = Api::all(s.client.clone());
    assert!(pools.get_opt("sp-v4").await.unwrap().is_none());
    assert!(claims_in(&s.client, NS).await.is_empty());

    // Interrupted at its last step: everything but IPPool sp-v6 is written.
    s.must_apply(INTERRUPT);
    let probe = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(
        probe.path(),
        "apiVersion: allot.dev/v1alpha1\nkind: IPPool\nmetadata: {name: sp-v6}\n\
         spec: {subnet: \"2001:db8:1ab::/64\", ips: [\"2001:db8:1ab::5:0\"]}\n",
    )
    .unwrap();
    let probe = probe.path().to_str().unwrap().to_string();
    wait_for(
        "the interrupting policy in force",
        Duration::from_secs(60),
        || async {
            let out = s.kubectl(&["create", "--dry-run=server", "-f", &probe]);
            (!out.status.success()).then_some(()).ok_or(out.status)
        },
    )
    .await;
    let interrupted = allotctl(&s, &["migrate", "spiderpool"], false);
    assert!(
        interrupted.contains("IPPool sp-v6: the API server refused it"),
        "{interrupted}"
    );
    assert!(pools.get_opt("sp-v4").await.unwrap().is_some());
    assert!(pools.get_opt("sp-v6").await.unwrap().is_none());
    let spider_addresses: BTreeSet<IpAddr> = spider_pods.iter().flat_map(pod_ips).collect();
    let held = claims_in(&s.client, NS).await;
    assert!(
        claimed_exactly(&held, &spider_addresses),
        "every claim is in: {held:?}"
    );
    s.must(
        "kubectl",
        &[
            "delete",
            "validatingadmissionpolicybinding,validatingadmissionpolicy",
            "interrupt-migration",
        ],
    );

    // The next run finishes it; the one after finds nothing to do.
    let resumed = wait_for("the migration resumed", Duration::from_secs(60), || async {
        let out = s.allotctl(&["migrate", "spiderpool"]);
        out.status
            .success()
            .then(|| text(&out))
            .ok_or_else(|| text(&out))
    })
    .await;
    assert!(resumed.contains("IPPool sp-v6: created"), "{resumed}");
    assert!(!resumed.contains("IPPool sp-v4: created"), "{resumed}");
    let again = allotctl(&s, &["migrate", "spiderpool"], true);
    assert!(again.contains("nothing to write"), "{again}");

    // An address with two holders is refused, naming both, and nothing is written.
    let (wb_v4, _) = addresses(&wb[0]);
    let intruder = json!({
        "apiVersion": "whereabouts.cni.cncf.io/v1alpha1",
        "kind": "OverlappingRangeIPReservation",
        "metadata": {"name": wb_v4.to_string(), "namespace": "default"},
        "spec": {"podref": format!("{NS}/intruder"), "ifname": "eth0"},
    });
    create(&s.client, whereabouts::RESERVATION, intruder)
        .await
        .unwrap();
    let refused = allotctl(&s, &["migrate", "whereabouts"], false);
    assert!(
        refused.contains(&format!("address {wb_v4} is held by more than one pod"))
            && refused.contains(&format!(
                "{NS}/intruder (OverlappingRangeIPReservation default/{wb_v4})"
            )),
        "{refused}"
    );
    assert!(refused.contains("nothing was written"), "{refused}");
    assert!(
        pools
            .get_opt("whereabouts-198.51.100.0-24")
            .await
            .unwrap()
            .is_none()
    );
    s.must(
        "kubectl",
        &[
            "-n",
            "default",
            "delete",
            "overlappingrangeipreservations.whereabouts.cni.cncf.io",
            &wb_v4.to_string(),
        ],
    );

    let wb_dry = allotctl(&s, &["migrate", "whereabouts", "--dry-run"], true);
    assert!(
        wb_dry.contains("IPPool whereabouts-198.51.100.0-24"),
        "{wb_dry}"
    );
    assert!(
        wb_dry.contains("NetworkAttachmentDefinition shop/underlay"),
        "{wb_dry}"
    );
    allotctl(&s, &["migrate", "whereabouts"], true);
    let wb_again = allotctl(&s, &["migrate", "whereabouts"], true);
    assert!(wb_again.contains("nothing to write"), "{wb_again}");

    // What allot holds: every address, claimed for its pod, recorded in its Endpoint; the VM's
    // for its launcher pod, held for the VM.
    let held = claims_in(&s.client, NS).await;
    let every: BTreeSet<IpAddr> = before.values().flat_map(|(_, ips)| ips.clone()).collect();
    assert!(claimed_exactly(&held, &every), "{held:?}");
    for (name, (uid, ips)) in &before {
        for ip in ips {
            let h = held
                .get(ip)
                .unwrap_or_else(|| panic!("{ip} of {name} is not claimed"));
            assert_eq!((&h.pod, &h.uid), (name, uid), "{ip}");
            assert!(h.attached);
        }
        assert_eq!(
            &endpoint_ips(&s.client, NS, name).await,
            ips,
            "{name}'s Endpoint"
        );
    }
    let reserved: Api<ReservedIP> = Api::all(s.client.clone());
    assert!(reserved.get_opt("sp-reserved").await.unwrap().is_some());
    let subnets: Api<Subnet> = Api::all(s.client.clone());
    assert!(subnets.get_opt("sp-subnet-v4").await.unwrap().is_some());
    let sp_v4 = pools.get("sp-v4").await.unwrap();
    assert_eq!(
        sp_v4
            .metadata
            .labels
            .unwrap()
            .get("ipam.allot.dev/owner-subnet")
            .map(String::as_str),
        Some("sp-subnet-v4")
    );

    // The switch.
    for node in &nodes {
        remove_peer_conflist(node);
    }

    // New pods never collide with the migrated ones (nor take the reserved address).
    s.must(
        "kubectl",
        &["-n", NS, "scale", "deployment/web", "--replicas=8"],
    );
    s.must(
        "kubectl",
        &["-n", NS, "scale", "deployment/wb", "--replicas=3"],
    );
    let web = s.ready_pods(NS, "app=web", 8).await;
    let wb = s.ready_pods(NS, "app=wb", 3).await;
    let mut seen: BTreeSet<IpAddr> = BTreeSet::new();
    let all: Vec<Pod> = web.iter().chain(&wb).chain(&db).cloned().collect();
    for pod in &all {
        for ip in pod_ips(pod) {
            assert!(seen.insert(ip), "{ip} is used twice");
        }
    }
    assert!(!seen.contains(&"198.51.100.223".parse::<IpAddr>().unwrap()));
    let held = claims_in(&s.client, NS).await;
    for pod in &all {
        let name = pod.metadata.name.clone().unwrap();
        for ip in pod_ips(pod) {
            let h = held
                .get(&ip)
                .unwrap_or_else(|| panic!("{ip} of {name} is not claimed"));
            assert_eq!(h.pod, name);
            let expected = if name.starts_with("wb-") {
                "whereabouts-"
            } else {
                "sp-v"
            };
            assert!(
                h.pool.starts_with(expected),
                "{ip} of {name} from {}",
                h.pool
            );
        }
        if let Some((uid, ips)) = before.get(&name) {
            assert_eq!(
                pod.metadata.uid.as_ref(),
                Some(uid),
                "{name} was not restarted"
            );
            assert_eq!(&pod_ips(pod), ips, "{name} keeps its addresses");
        }
    }

    // A StatefulSet pod started again after the switch gets its addresses back.
    let db0 = before["db-0"].clone();
    s.must(
        "kubectl",
        &["-n", NS, "delete", "pod", "db-0", "--wait=false"],
    );
    let restarted = wait_for(
        "db-0 back with a new UID",
        Duration::from_secs(180),
        || async {
            let pods = s.ready_pods(NS, "app=db", 2).await;
            let p = pods
                .into_iter()
                .find(|p| p.metadata.name.as_deref() == Some("db-0"))
                .unwrap();
            (p.metadata.uid.as_ref() != Some(&db0.0))
                .then_some(p)
                .ok_or(())
        },
    )
    .await;
    assert_eq!(pod_ips(&restarted), db0.1, "db-0 keeps its addresses");
    let held = claims_in(&s.client, NS).await;
    for ip in &db0.1 {
        assert_eq!(held[ip].uid, restarted.metadata.uid.clone().unwrap());
        assert!(held[ip].attached);
    }

    // The VM, live-migrated to node-2 after the switch: the target launcher pod's ADD (allot's)
    // takes the VM's addresses over while the source (the peer's sandbox) runs the guest on;
    // once the migration completes and the source is gone, GC never frees them.
    kubevirt::launcher(
        &s,
        NS,
        VM,
        TARGET,
        "node-2",
        Some("migration-1"),
        LAUNCHER_POOLS,
    );
    assert_eq!(
        kubevirt::addresses_of(&s, NS, TARGET).await,
        vm_addresses,
        "the target gets the guest's addresses, not fresh ones"
    );
    kubevirt::complete_migration(&s, NS, VM, "migration-1", "node-1", "node-2");
    s.must(
        "kubectl",
        &["-n", NS, "delete", "pod", SOURCE, "--wait=true"],
    );
    // Two GC scans (every 10 s, 5 s grace in the suite's values) and more.
    tokio::time::sleep(Duration::from_secs(30)).await;
    let held = claims_in(&s.client, NS).await;
    for ip in &vm_addresses {
        let h = held
            .get(ip)
            .unwrap_or_else(|| panic!("the VM's {ip} was released: {held:?}"));
        assert_eq!(h.pod, TARGET, "{ip}");
        assert!(h.attached, "{ip}");
    }

    // A rerun after the switch (pods created and deleted under allot meanwhile, GC run):
    // nothing to write, no note for the addresses allot handed out itself, the claim GC
    // released (the gone pod's) not brought back, the Endpoint the agent wrote for the
    // restarted StatefulSet pod untouched.
    let gone: IpAddr = GONE.parse().unwrap();
    wait_for(
        "GC releases the gone pod's claim",
        Duration::from_secs(120),
        || async {
            let held = claims_in(&s.client, NS).await;
            (!held.contains_key(&gone)).then_some(()).ok_or(())
        },
    )
    .await;
    let endpoints: Api<allot_k8s::Endpoint> = Api::namespaced(s.client.clone(), NS);
    let db0_endpoint = endpoints.get("db-0").await.unwrap().spec;
    let rerun = allotctl(&s, &["migrate", "spiderpool"], true);
    assert!(rerun.contains("nothing to write"), "{rerun}");
    assert!(!rerun.contains("note:"), "{rerun}");
    assert!(
        !claims_in(&s.client, NS).await.contains_key(&gone),
        "{rerun}"
    );
    assert_eq!(
        endpoints.get("db-0").await.unwrap().spec,
        db0_endpoint,
        "{rerun}"
    );

    // And the audit finds nothing to say.
    wait_for("ipam check clean", Duration::from_secs(120), || async {
        let out = s.allotctl(&["ipam", "check"]);
        out.status.success().then_some(()).ok_or_else(|| text(&out))
    })
    .await;
    s.no_refusals();
}
