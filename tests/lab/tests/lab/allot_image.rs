//! allot's own image on the lab (localhost/allot:dev, made from the build): its binaries run
//! as real processes with their pod's projected ServiceAccount token, so the real API server's
//! RBAC decides what they may do. `allotctl crds --apply` as a Job (the chart's CRD hook) fails
//! with 403 in its log without RBAC and completes with it; `allot-agent --kubernetes` crash-loops
//! without RBAC and turns Ready through its /readyz readiness probe once bound.
//!
//! Needs allot's binaries (ALLOT_BIN, default target/release) and the default policy: the
//! test fails, saying how to build them, when they are missing.

use std::time::Duration;

use allot_lab::testing::{self, wait_for};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, PostParams};
use serde_json::json;

const NS: &str = "allot-system";
const CRDS: [&str; 8] = [
    "ippools.allot.dev",
    "subnets.allot.dev",
    "reservedips.allot.dev",
    "endpoints.allot.dev",
    "ipblocks.allot.dev",
    "policies.allot.dev",
    "ipampools.allot.dev",
    "ipamallocations.allot.dev",
];

fn crds_job(name: &str) -> Job {
    serde_json::from_value(json!({
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"backoffLimit": 0, "template": {"spec": {
            "serviceAccountName": "allot-crds",
            "restartPolicy": "Never",
            // As the chart's hook runs it: on the host network, which the kubernetes Service's
            // ClusterIP reaches through kube-proxy (a macvlan pod's traffic leaves past the
            // node's iptables, so its ClusterIPs lead nowhere).
            "hostNetwork": true,
            "securityContext": {"runAsNonRoot": true, "runAsUser": 65532, "runAsGroup": 65532},
            "containers": [{
                "name": "crds", "image": "localhost/allot:dev",
                "args": ["crds", "--apply", "--wait-seconds=60"],
            }],
        }}},
    }))
    .unwrap()
}

async fn job_finished(jobs: &Api<Job>, name: &str) -> String {
    wait_for(
        &format!("Job {name} finished"),
        Duration::from_secs(90),
        || async {
            let job = jobs.get(name).await.map_err(|e| e.to_string())?;
            job.status
                .and_then(|s| s.conditions)
                .unwrap_or_default()
                .into_iter()
                .find(|c| (c.type_ == "Complete" || c.type_ == "Failed") && c.status == "True")
                .map(|c| c.type_)
                .ok_or_else(|| "running".to_string())
        },
    )
    .await
}

async fn job_log(lab: &allot_lab::LabCluster, client: &kube::Client, job: &str) -> String {
    let pods = testing::pods(client, NS, &format!("job-name={job}"))
        .await
        .unwrap();
    let pod = pods
        .first()
        .unwrap_or_else(|| panic!("Job {job} has no pod"));
    std::fs::read_to_string(testing::container_log(lab, pod, "crds").unwrap()).unwrap_or_default()
}

#[tokio::test]
async fn allots_binaries_run_with_their_service_accounts() {
    let Some(lab) = testing::start(
        "allots_binaries_run_with_their_service_accounts",
        2,
        env!("CARGO_BIN_EXE_allot-lab-node"),
        |_| {},
    )
    .await
    else {
        return;
    };
    let client = lab.client().await.unwrap();
    for (i, node) in lab.nodes().iter().enumerate() {
        testing::macvlan_conflist(node, i + 1).unwrap();
    }
    for doc in [
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}}),
        json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "allot-crds", "namespace": NS}}),
        json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "allot-agent", "namespace": NS}}),
    ] {
        testing::apply_yaml(&client, &doc.to_string())
            .await
            .unwrap();
    }
    let jobs: Api<Job> = Api::namespaced(client.clone(), NS);

    // Without RBAC: the Job fails, its log says the API server refused.
    jobs.create(&PostParams::default(), &crds_job("crds-denied"))
        .await
        .unwrap();
    assert_eq!(job_finished(&jobs, "crds-denied").await, "Failed");
    let log = job_log(&lab, &client, "crds-denied").await;
    assert!(
        log.contains("forbidden") && log.contains("system:serviceaccount:allot-system:allot-crds"),
        "{log}"
    );

    // With the CRD hook's rules (the chart's): the Job completes, the CRDs are there. A
    // server-side apply that creates a CRD is authorized as create, which cannot be narrowed
    // by name.
    let rules = json!([
        {"apiGroups": ["apiextensions.k8s.io"], "resources": ["customresourcedefinitions"],
         "resourceNames": CRDS, "verbs": ["get", "patch", "update"]},
        {"apiGroups": ["apiextensions.k8s.io"], "resources": ["customresourcedefinitions"],
         "verbs": ["create"]},
    ]);
    bind(&client, "allot-crds", rules).await;
    jobs.create(&PostParams::default(), &crds_job("crds"))
        .await
        .unwrap();
    let outcome = job_finished(&jobs, "crds").await;
    assert_eq!(
        outcome,
        "Complete",
        "{}",
        job_log(&lab, &client, "crds").await
    );
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for name in CRDS {
        let crd = crds
            .get(name)
            .await
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let established = crd
            .status
            .and_then(|s| s.conditions)
            .unwrap_or_default()
            .iter()
            .any(|c| c.type_ == "Established" && c.status == "True");
        assert!(established, "{name} is not Established");
    }

    // The agent, as the chart runs it (hostNetwork, root, the node's socket and journal
    // directories), with a readiness probe on its metrics address.
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let agent: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "agent", "namespace": NS},
        "spec": {
            "serviceAccountName": "allot-agent",
            "hostNetwork": true,
            "nodeSelector": {"kubernetes.io/hostname": "node-1"},
            "containers": [{
                "name": "agent", "image": "localhost/allot:dev",
                "securityContext": {"runAsUser": 0, "runAsGroup": 0},
                "command": ["/usr/local/bin/allot-agent"],
                "args": ["--kubernetes", "--node-name=$(NODE_NAME)", "--socket=/run/allot/agent.sock",
                         "--journal=/var/lib/allot/journal", "--cache-dir=/var/cache/allot/policies",
                         "--metrics-address=0.0.0.0:9401"],
                "env": [{"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}],
                "ports": [{"name": "metrics", "containerPort": 9401}],
                "readinessProbe": {"httpGet": {"path": "/readyz", "port": "metrics"}, "periodSeconds": 2},
                "volumeMounts": [
                    {"name": "socket", "mountPath": "/run/allot"},
                    {"name": "journal", "mountPath": "/var/lib/allot/journal"},
                    {"name": "cache", "mountPath": "/var/cache/allot"},
                ],
            }],
            "volumes": [
                {"name": "socket", "hostPath": {"path": "/run/allot", "type": "DirectoryOrCreate"}},
                {"name": "journal", "hostPath": {"path": "/var/lib/allot/journal", "type": "DirectoryOrCreate"}},
                {"name": "cache", "emptyDir": {}},
            ],
        },
    }))
    .unwrap();
    pods.create(&PostParams::default(), &agent).await.unwrap();
    let crashed = wait_for(
        "the agent restarted without RBAC",
        Duration::from_secs(60),
        || async {
            let p = pods.get("agent").await.map_err(|e| e.to_string())?;
            let restarts = p
                .status
                .as_ref()
                .and_then(|s| s.container_statuses.as_ref())
                .and_then(|c| c.first())
                .map_or(0, |c| c.restart_count);
            if restarts >= 1 {
                Ok(p)
            } else {
                Err(format!("{:?}", p.status))
            }
        },
    )
    .await;
    assert_ne!(
        testing::condition(&crashed, "Ready").as_deref(),
        Some("True")
    );
    let log = testing::container_log(&lab, &crashed, "agent").unwrap();
    testing::wait_for_text(&log, "forbidden", Duration::from_secs(5))
        .await
        .unwrap();

    // The agent's rules (those of the chart): it lists and watches, and turns Ready.
    let rules = json!([
        {"apiGroups": [""], "resources": ["pods", "namespaces", "nodes"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": ["apps"], "resources": ["replicasets", "statefulsets"], "verbs": ["get"]},
        {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["get"]},
        {"apiGroups": ["allot.dev"], "resources": ["ippools", "subnets", "reservedips", "policies"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": ["allot.dev"], "resources": ["ipblocks"], "verbs": ["get", "list", "watch", "create", "update"]},
        {"apiGroups": ["allot.dev"], "resources": ["endpoints"], "verbs": ["get", "create", "update", "delete"]},
        {"apiGroups": ["allot.dev"], "resources": ["policies/status"], "verbs": ["patch"]},
        {"apiGroups": ["events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch"]},
    ]);
    bind(&client, "allot-agent", rules).await;
    // The crash-loop back-off (10 s, then 20 s) comes first.
    wait_for("the agent Ready", Duration::from_secs(120), || async {
        let p = pods.get("agent").await.map_err(|e| e.to_string())?;
        match testing::condition(&p, "Ready").as_deref() {
            Some("True") => Ok(()),
            other => Err(format!("Ready {other:?}")),
        }
    })
    .await;
    assert!(
        lab.node("node-1")
            .unwrap()
            .root
            .join("run/allot/agent.sock")
            .exists(),
        "the agent's socket is in the node's /run/allot"
    );
}

/// A ClusterRole of `rules` bound to ServiceAccount `allot-system/<name>`.
async fn bind(client: &kube::Client, name: &str, rules: serde_json::Value) {
    let role = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                      "metadata": {"name": name}, "rules": rules});
    let binding = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": NS}]});
    for doc in [role, binding] {
        testing::apply_yaml(client, &doc.to_string()).await.unwrap();
    }
}
