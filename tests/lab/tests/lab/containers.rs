//! Containers of an image the nodes have run as real processes, and behave as a user expects
//! of a kubelet: a hostNetwork pod sees the node's files through a hostPath volume and its
//! ServiceAccount through the projected volume; an httpGet readiness probe drives Ready both
//! ways; restart policies restart, complete or fail pods; a start error is reported; a deleted
//! pod's process gets SIGTERM; a pod force-deleted while its node's kubelet was down is cleaned
//! up when it comes back.

use std::time::Duration;

use allot_lab::testing::{self, wait_for};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::{Value, json};

const IMAGE: &str = "localhost/sh:1";

fn pod(name: &str, spec: Value) -> Pod {
    let mut spec = spec;
    spec["containers"][0]["name"] = json!("main");
    spec["containers"][0]["image"] = json!(IMAGE);
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": spec,
    }))
    .unwrap()
}

async fn wait_pod(api: &Api<Pod>, name: &str, what: &str, check: impl Fn(&Pod) -> bool) -> Pod {
    wait_for(
        &format!("pod {name}: {what}"),
        Duration::from_secs(60),
        || async {
            let p = api.get(name).await.map_err(|e| e.to_string())?;
            if check(&p) {
                Ok(p)
            } else {
                Err(format!("{:?}", p.status))
            }
        },
    )
    .await
}

fn phase(p: &Pod) -> &str {
    p.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("")
}

fn main_status(p: &Pod) -> Option<&k8s_openapi::api::core::v1::ContainerStatus> {
    p.status.as_ref()?.container_statuses.as_ref()?.first()
}

#[tokio::test]
async fn real_containers_follow_the_pod_spec() {
    let image_dir = tempfile::tempdir().unwrap();
    let image = testing::shell_image(image_dir.path(), "1000:1000").unwrap();
    let Some(lab) = testing::start(
        "real_containers_follow_the_pod_spec",
        2,
        env!("CARGO_BIN_EXE_allot-lab-node"),
        |o| {
            // What the stand-in's own container runtime does (real nodes' is runc's).
            o.node_kind = allot_lab::NodeKind::StandIn;
            o.allot_image = false;
            o.images.push((IMAGE.into(), image.clone()));
        },
    )
    .await
    else {
        return;
    };
    let client = lab.client().await.unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let nodes = lab.nodes();
    for (i, node) in nodes.iter().enumerate() {
        let first = 20 * (i + 1) + 10;
        testing::bridge_conflist(
            node,
            "10-labnet.conflist",
            "labnet",
            "labbr0",
            "203.0.113.0/24",
            (
                &format!("203.0.113.{first}"),
                &format!("203.0.113.{}", first + 19),
            ),
        )
        .unwrap();
    }

    // hostNetwork and hostPath: the node's files, the node's address, the pod's account.
    let node1 = &nodes[0];
    std::fs::create_dir_all(node1.root.join("var/lib/lab-test")).unwrap();
    std::fs::write(node1.root.join("var/lib/lab-test/hello"), "from node-1\n").unwrap();
    let script = "cat /data/hello; echo \"uid $(id -u) host $(hostname) ns $(cat /var/run/secrets/kubernetes.io/serviceaccount/namespace) image $(cat /etc/lab/image)\"; echo from-pod > /data/reply; exec sleep 3600";
    pods.create(&PostParams::default(), &pod("host", json!({
        "hostNetwork": true,
        "nodeSelector": {"kubernetes.io/hostname": "node-1"},
        "securityContext": {"runAsUser": 0},
        "containers": [{
            "args": [script],
            "volumeMounts": [{"name": "data", "mountPath": "/data"}],
            // An exec probe runs in the container's mount namespace: /data is the hostPath.
            "readinessProbe": {"exec": {"command": ["test", "-s", "/data/reply"]}, "periodSeconds": 1},
        }],
        "volumes": [{"name": "data", "hostPath": {"path": "/var/lib/lab-test", "type": "Directory"}}],
    }))).await.unwrap();
    let host = wait_pod(&pods, "host", "Running and Ready", |p| {
        phase(p) == "Running" && testing::condition(p, "Ready").as_deref() == Some("True")
    })
    .await;
    assert_eq!(
        host.status.as_ref().unwrap().pod_ip.as_deref(),
        Some("198.51.100.11"),
        "a hostNetwork pod has its node's address"
    );
    let log = testing::wait_for_text(
        &testing::container_log(&lab, &host, "main").unwrap(),
        "image",
        Duration::from_secs(10),
    )
    .await
    .unwrap();
    assert!(
        log.contains("from node-1"),
        "the node's file through hostPath: {log}"
    );
    assert!(
        log.contains("uid 0 host node-1 ns default image the lab's shell image"),
        "{log}"
    );
    testing::wait_for_text(
        &node1.root.join("var/lib/lab-test/reply"),
        "from-pod",
        Duration::from_secs(10),
    )
    .await
    .expect("the pod's write lands in the node's directory");

    // An httpGet readiness probe: not Ready until the server answers /ready, Ready while it
    // does, not Ready once it stops.
    let script = "cd /tmp && python3 -m http.server 8080 >/dev/null 2>&1 & sleep 4; touch /tmp/ready; sleep 6; rm /tmp/ready; exec sleep 3600";
    pods.create(&PostParams::default(), &pod("web", json!({
        "securityContext": {"runAsUser": 0},
        "containers": [{
            "args": [script],
            "ports": [{"name": "http", "containerPort": 8080}],
            "readinessProbe": {"httpGet": {"path": "/ready", "port": "http"}, "periodSeconds": 1, "failureThreshold": 1},
        }],
    }))).await.unwrap();
    let mut seen: Vec<(String, String)> = Vec::new();
    for _ in 0..150 {
        let p = pods.get("web").await.unwrap();
        let now = (
            phase(&p).to_string(),
            testing::condition(&p, "Ready").unwrap_or_default(),
        );
        if seen.last() != Some(&now) {
            seen.push(now);
        }
        if seen.iter().filter(|(_, r)| r == "True").count() == 1
            && seen.last().unwrap().1 == "False"
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let ready: Vec<&str> = seen
        .iter()
        .filter(|(p, _)| p == "Running")
        .map(|(_, r)| r.as_str())
        .collect();
    assert_eq!(
        ready,
        ["False", "True", "False"],
        "Ready of the running pod over time: {seen:?}"
    );

    // Restart policies.
    pods.create(
        &PostParams::default(),
        &pod(
            "crash",
            json!({
                "containers": [{"args": ["echo crashing; exit 3"]}],
            }),
        ),
    )
    .await
    .unwrap();
    let crash = wait_pod(&pods, "crash", "restarted and backing off", |p| {
        main_status(p).is_some_and(|s| {
            s.restart_count >= 1
                && s.state
                    .as_ref()
                    .and_then(|st| st.waiting.as_ref())
                    .and_then(|w| w.reason.as_deref())
                    == Some("CrashLoopBackOff")
        })
    })
    .await;
    let last = main_status(&crash)
        .unwrap()
        .last_state
        .as_ref()
        .unwrap()
        .terminated
        .as_ref()
        .unwrap();
    assert_eq!(last.exit_code, 3);
    assert_eq!(
        phase(&crash),
        "Running",
        "a crash-looping pod of restartPolicy Always is Running"
    );
    for (name, args, expected, code) in [
        ("job-ok", json!(["exit 0"]), "Succeeded", 0),
        ("job-fails", json!(["exit 2"]), "Failed", 2),
    ] {
        pods.create(
            &PostParams::default(),
            &pod(
                name,
                json!({
                    "restartPolicy": "Never", "containers": [{"args": args}],
                }),
            ),
        )
        .await
        .unwrap();
        let done = wait_pod(&pods, name, expected, |p| phase(p) == expected).await;
        let t = main_status(&done)
            .unwrap()
            .state
            .as_ref()
            .unwrap()
            .terminated
            .clone()
            .unwrap();
        assert_eq!(t.exit_code, code, "{name}");
    }
    pods.create(
        &PostParams::default(),
        &pod(
            "no-such-program",
            json!({
                "restartPolicy": "Never", "containers": [{"command": ["/no/such/program"]}],
            }),
        ),
    )
    .await
    .unwrap();
    let failed = wait_pod(&pods, "no-such-program", "Failed", |p| phase(p) == "Failed").await;
    let t = main_status(&failed)
        .unwrap()
        .state
        .as_ref()
        .unwrap()
        .terminated
        .clone()
        .unwrap();
    assert_eq!(
        (t.exit_code, t.reason.as_deref()),
        (128, Some("StartError"))
    );
    assert!(t.message.unwrap_or_default().contains("/no/such/program"));

    // Deletion: SIGTERM reaches the process, the pod goes.
    pods.create(&PostParams::default(), &pod("graceful", json!({
        "containers": [{"args": ["trap 'echo got TERM; exit 0' TERM; while true; do sleep 0.2; done"]}],
    }))).await.unwrap();
    let graceful = wait_pod(&pods, "graceful", "Running", |p| phase(p) == "Running").await;
    let log = testing::container_log(&lab, &graceful, "main").unwrap();
    pods.delete("graceful", &DeleteParams::default())
        .await
        .unwrap();
    wait_for("pod graceful deleted", Duration::from_secs(30), || async {
        match pods.get_opt("graceful").await {
            Ok(None) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    testing::wait_for_text(&log, "got TERM", Duration::from_secs(5))
        .await
        .unwrap();

    // A pod force-deleted while its node's kubelet is down: cleaned up when it returns.
    pods.create(
        &PostParams::default(),
        &pod(
            "orphan",
            json!({
                "nodeSelector": {"kubernetes.io/hostname": "node-2"},
                "containers": [{"args": ["exec sleep 3600"]}],
            }),
        ),
    )
    .await
    .unwrap();
    let orphan = wait_pod(&pods, "orphan", "Running", |p| phase(p) == "Running").await;
    let uid = orphan.metadata.uid.clone().unwrap();
    let orphan_ip = orphan.status.as_ref().unwrap().pod_ip.clone().unwrap();
    let node2 = &nodes[1];
    let record: Value = serde_json::from_slice(
        &std::fs::read(
            node2
                .root
                .join(format!("var/lib/kubelet/pods/{uid}/record.json")),
        )
        .unwrap(),
    )
    .unwrap();
    let netns = allot_lab::net::netns_path(record["netns"].as_str().unwrap());
    lab.stop_node("node-2").await.unwrap();
    // A lost node is a machine that lost its power: its containers die with it, and its pod's
    // namespace (kept on the node's disk, as it were) waits for the node to come back.
    wait_for(
        "the lost node's containers gone",
        Duration::from_secs(10),
        || async {
            let left = allot_lab::net::pids_in_netns(&netns);
            if left.is_empty() { Ok(()) } else { Err(left) }
        },
    )
    .await;
    assert!(netns.exists(), "the orphan's namespace waits for its node");
    pods.delete(
        "orphan",
        &DeleteParams {
            grace_period_seconds: Some(0),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    lab.start_node("node-2").await.unwrap();
    wait_for(
        "the orphan's namespace and processes gone",
        Duration::from_secs(30),
        || async {
            if netns.exists() {
                Err("namespace still there")
            } else {
                Ok(())
            }
        },
    )
    .await;
    let held = node2
        .root
        .join("var/lib/cni/networks/labnet")
        .join(&orphan_ip);
    assert!(
        !held.exists(),
        "host-local still holds the orphan's {orphan_ip} on node-2: no DEL"
    );
}
