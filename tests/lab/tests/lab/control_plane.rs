//! The upstream control plane as a user meets it: RBAC decides (the admin may, a
//! ServiceAccount without a binding may not), objects outlive restarts of the API server and
//! of etcd, and a node whose kubelet is lost goes NotReady, then Ready again when it returns.

use std::time::{Duration, Instant};

use allot_lab::testing::{self, wait_for};
use allot_lab::{Component, LabCluster};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Node, Pod, ServiceAccount};
use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};
use kube::api::{Api, ListParams, ObjectMeta, PostParams};

const NS: &str = "lab-rbac";

fn meta(name: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.into()),
        namespace: Some(NS.into()),
        ..Default::default()
    }
}

#[tokio::test]
async fn rbac_restarts_and_a_lost_node() {
    let grace = Duration::from_secs(20);
    let Some(lab) = testing::start(
        "rbac_restarts_and_a_lost_node",
        2,
        env!("CARGO_BIN_EXE_allot-lab-node"),
        |o| {
            o.allot_image = false;
            o.node_monitor_grace = grace;
        },
    )
    .await
    else {
        return;
    };
    let admin = lab.client().await.unwrap();
    // A network configuration on every node, so that they are Ready (a node without one is
    // NotReady, as a kubelet's).
    for (i, node) in lab.nodes().iter().enumerate() {
        testing::macvlan_conflist(node, i + 1).unwrap();
    }

    // The admin (system:masters) may do anything.
    let namespaces: Api<Namespace> = Api::all(admin.clone());
    let ns = Namespace {
        metadata: ObjectMeta {
            name: Some(NS.into()),
            ..Default::default()
        },
        ..Default::default()
    };
    namespaces
        .create(&PostParams::default(), &ns)
        .await
        .expect("the admin creates a namespace");
    let accounts: Api<ServiceAccount> = Api::namespaced(admin.clone(), NS);
    accounts
        .create(
            &PostParams::default(),
            &ServiceAccount {
                metadata: meta("reader"),
                ..Default::default()
            },
        )
        .await
        .unwrap();

    // A ServiceAccount without a binding is refused by the real RBAC authorizer ...
    let reader = testing::service_account_client(&lab, NS, "reader")
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(reader.clone(), NS);
    match pods.list(&ListParams::default()).await {
        Err(kube::Error::Api(e)) => assert_eq!(e.code, 403, "listing pods without RBAC: {e:?}"),
        other => panic!("listing pods without a RoleBinding answered {other:?}, not 403"),
    }
    // ... and allowed once a Role is bound to it.
    let roles: Api<Role> = Api::namespaced(admin.clone(), NS);
    let role = Role {
        metadata: meta("pod-reader"),
        rules: Some(vec![PolicyRule {
            api_groups: Some(vec![String::new()]),
            resources: Some(vec!["pods".into()]),
            verbs: vec!["list".into()],
            ..Default::default()
        }]),
    };
    roles.create(&PostParams::default(), &role).await.unwrap();
    let bindings: Api<RoleBinding> = Api::namespaced(admin.clone(), NS);
    let binding = RoleBinding {
        metadata: meta("reader-reads-pods"),
        role_ref: RoleRef {
            api_group: "rbac.authorization.k8s.io".into(),
            kind: "Role".into(),
            name: "pod-reader".into(),
        },
        subjects: Some(vec![Subject {
            kind: "ServiceAccount".into(),
            name: "reader".into(),
            namespace: Some(NS.into()),
            ..Default::default()
        }]),
    };
    bindings
        .create(&PostParams::default(), &binding)
        .await
        .unwrap();
    wait_for(
        "the reader lists pods once bound",
        Duration::from_secs(10),
        || async { pods.list(&ListParams::default()).await.map(drop) },
    )
    .await;

    // Restarts: objects are still there and the server answers again.
    let maps: Api<ConfigMap> = Api::namespaced(admin.clone(), NS);
    for (component, handle) in [
        (Component::KubeApiserver, None),
        // Through the control socket, as a test attached with ALLOT_LAB_CLUSTER does it.
        (
            Component::Etcd,
            Some(LabCluster::from_file(&lab.info().dir.join("cluster.json")).unwrap()),
        ),
    ] {
        let name = format!("before-{component}-restart");
        maps.create(
            &PostParams::default(),
            &ConfigMap {
                metadata: meta(&name),
                ..Default::default()
            },
        )
        .await
        .unwrap();
        let started = Instant::now();
        match &handle {
            Some(remote) => remote.restart(component).await,
            None => lab.restart(component).await,
        }
        .unwrap_or_else(|e| panic!("restarting {component}: {e:#}"));
        println!("{component} restarted in {:.1?}", started.elapsed());
        let fresh = lab.client().await.unwrap();
        let maps_after: Api<ConfigMap> = Api::namespaced(fresh, NS);
        let kept = wait_for(
            &format!("ConfigMap {name} after restarting {component}"),
            Duration::from_secs(30),
            || async { maps_after.get(&name).await },
        )
        .await;
        assert_eq!(kept.metadata.name.as_deref(), Some(name.as_str()));
        maps_after
            .create(
                &PostParams::default(),
                &ConfigMap {
                    metadata: meta(&format!("after-{component}-restart")),
                    ..Default::default()
                },
            )
            .await
            .unwrap_or_else(|e| panic!("writing after restarting {component}: {e}"));
    }

    // A lost node: its kubelet stops renewing, the node lifecycle controller marks it
    // NotReady (Unknown) after the grace period; back when the kubelet returns.
    let nodes: Api<Node> = Api::all(admin.clone());
    let stopped = Instant::now();
    lab.stop_node("node-2").await.unwrap();
    wait_for(
        "node-2 NotReady after its stand-in was killed",
        grace + Duration::from_secs(30),
        || async {
            let node = nodes.get("node-2").await.map_err(|e| e.to_string())?;
            match allot_lab::node_ready(&node) {
                Some(true) => Err("still Ready".to_string()),
                _ => Ok(()),
            }
        },
    )
    .await;
    let lost_after = stopped.elapsed();
    println!("node-2 NotReady {lost_after:.1?} after its stand-in was killed");
    assert!(
        lost_after >= Duration::from_secs(5),
        "NotReady too soon ({lost_after:?}): not the lease"
    );
    let node1 = nodes.get("node-1").await.unwrap();
    assert_eq!(
        allot_lab::node_ready(&node1),
        Some(true),
        "node-1 stays Ready"
    );
    lab.start_node("node-2").await.unwrap();
    wait_for("node-2 Ready again", Duration::from_secs(30), || async {
        let node = nodes.get("node-2").await.map_err(|e| e.to_string())?;
        match allot_lab::node_ready(&node) {
            Some(true) => Ok(()),
            other => Err(format!("Ready is {other:?}")),
        }
    })
    .await;
}
