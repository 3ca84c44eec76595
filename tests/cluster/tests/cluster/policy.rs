//! The cluster's pool-selection policy changed as the README says (`helm upgrade --set
//! policy…`): a component from a ConfigMap, verified by its digest, taken by every agent; one
//! with a wrong digest refused with the reason while pods keep starting.

use std::time::Duration;

use allot_cluster_tests::objects::{pod_ips, pool_yaml};
use allot_cluster_tests::{NAMESPACE, RELEASE, Suite, install_args};
use allot_k8s::Policy;
use allot_lab::testing::{container_log, wait_for};
use k8s_openapi::api::core::v1::Event;
use kube::api::{Api, ListParams};

fn sha256_of(path: &std::path::Path) -> String {
    let out = std::process::Command::new("sha256sum")
        .arg(path)
        .output()
        .unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    format!("sha256:{}", text.split_whitespace().next().unwrap())
}

async fn serving(s: &Suite) -> Option<String> {
    let policies: Api<Policy> = Api::all(s.client.clone());
    policies.get("default").await.ok()?.status?.serving_digest
}

#[tokio::test]
async fn the_policy_switches_to_a_configmap_component_and_a_wrong_digest_is_refused() {
    let Some(s) =
        Suite::shared("the_policy_switches_to_a_configmap_component_and_a_wrong_digest_is_refused")
            .await
    else {
        return;
    };
    let component = allot_cluster_tests::root()
        .join("target/wasm-policies/wasm32-wasip2/release/zone_aware.wasm");
    assert!(
        component.exists(),
        "{}: run `make policies`",
        component.display()
    );
    let digest = sha256_of(&component);
    let default_digest = serving(&s).await.expect("the default component serving");
    assert_ne!(digest, default_digest);

    let src = s.namespace("policy-src").await;
    s.must(
        "kubectl",
        &[
            "-n",
            &src,
            "create",
            "configmap",
            "zone-aware",
            &format!("--from-file=policy.wasm={}", component.display()),
        ],
    );
    let mut upgrade = install_args("upgrade");
    let set = format!(
        "policy.source.configMap.namespace={src},policy.source.configMap.name=zone-aware,\
         policy.source.configMap.key=policy.wasm,policy.sha256={digest}"
    );
    upgrade.extend(["--set", set.as_str()]);
    s.must("helm", &upgrade);

    // Every agent serves it, and says so.
    wait_for(
        "the Policy serving the new digest",
        Duration::from_secs(120),
        || async {
            let now = serving(&s).await;
            (now.as_deref() == Some(digest.as_str()))
                .then_some(())
                .ok_or(now)
        },
    )
    .await;
    let agents = s.pods(NAMESPACE, "app.kubernetes.io/component=agent").await;
    assert_eq!(agents.len(), s.lab.nodes().len());
    for agent in &agents {
        let log = container_log(&s.lab, agent, "agent").unwrap();
        allot_lab::testing::wait_for_text(&log, &digest, Duration::from_secs(60))
            .await
            .unwrap();
    }

    // It decides: a pool labelled drained is passed over, which the default policy would not.
    // Labelled as it is created: labelled afterwards, an agent whose watch had shown the pool
    // but not yet the label could serve the pod from it (seen once on a loaded machine).
    s.must_apply(
        &pool_yaml(
            "drained",
            "192.0.2.0/24",
            "192.0.2.1",
            "192.0.2.10-192.0.2.19",
        )
        .replace(
            "  name: drained\n",
            "  name: drained\n  labels: {allot.dev/drain: \"true\"}\n",
        ),
    );
    s.must_apply(&pool_yaml(
        "open",
        "192.0.2.0/24",
        "192.0.2.1",
        "192.0.2.20-192.0.2.29",
    ));
    let ns = s.namespace("policy").await;
    let annotation = r#"{"ipv4":["drained","open"]}"#;
    let run = |name: &str| {
        s.must(
            "kubectl",
            &[
                "-n",
                &ns,
                "run",
                name,
                "--image=busybox",
                "--restart=Never",
                &format!("--annotations=ipam.allot.dev/ippool={annotation}"),
                "--",
                "sleep",
                "3600",
            ],
        );
    };
    run("first");
    let pod = s.ready_pods(&ns, "run=first", 1).await.remove(0);
    let ip = pod_ips(&pod)[0].to_string();
    assert!(
        ip.starts_with("192.0.2.2"),
        "the drained pool was used: {ip}"
    );

    // A component whose digest is not the one named: refused, the serving one stays, and
    // pods keep starting.
    let wrong = format!("sha256:{}", "0".repeat(64));
    let mut again = install_args("upgrade");
    let set = format!(
        "policy.source.configMap.namespace={src},policy.source.configMap.name=zone-aware,\
         policy.source.configMap.key=policy.wasm,policy.sha256={wrong}"
    );
    again.extend(["--set", set.as_str()]);
    s.must("helm", &again);
    let policies: Api<Policy> = Api::all(s.client.clone());
    wait_for(
        "the refusal in the Policy's status",
        Duration::from_secs(120),
        || async {
            let status = policies
                .get("default")
                .await
                .map_err(|e| e.to_string())?
                .status
                .unwrap_or_default();
            match (status.serving_digest, status.refused_reason) {
                (Some(d), Some(why)) if d == digest && why.contains("sha256") => Ok(()),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await;
    let events: Api<Event> = Api::all(s.client.clone());
    wait_for(
        "a Warning Event on the Policy",
        Duration::from_secs(60),
        || async {
            let list = events
                .list(&ListParams::default().fields("involvedObject.kind=Policy"))
                .await
                .map_err(|e| e.to_string())?;
            list.items
                .iter()
                .any(|e| e.type_.as_deref() == Some("Warning"))
                .then_some(())
                .ok_or(format!("{} events, none a Warning", list.items.len()))
        },
    )
    .await;
    run("second");
    let pod = s.ready_pods(&ns, "run=second", 1).await.remove(0);
    assert!(pod_ips(&pod)[0].to_string().starts_with("192.0.2.2"));

    // Back to the chart's default.
    s.must("helm", &install_args("upgrade"));
    wait_for(
        "the default component serving again",
        Duration::from_secs(120),
        || async {
            let now = serving(&s).await;
            (now.as_deref() == Some(default_digest.as_str()))
                .then_some(())
                .ok_or(now)
        },
    )
    .await;
    s.must(
        "kubectl",
        &["delete", "namespace", &ns, &src, "--wait=true"],
    );
    s.must(
        "kubectl",
        &["delete", "ippool", "drained", "open", "--wait=true"],
    );
    let status = s.helm(&["status", RELEASE, "-n", NAMESPACE]);
    assert!(status.status.success());
    s.no_refusals();
}
