//! The chart installed as the README says, and what a user then does with it: a first pod, a
//! Deployment spread over the nodes and scaled down, the admission webhook's refusals.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::time::Duration;

use allot_cluster_tests::objects::{self, claims_in, endpoint_ips, pod_ips, pool_counts};
use allot_cluster_tests::{NAMESPACE, Suite};
use allot_k8s::Policy;
use allot_lab::testing::wait_for;
use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ListParams};

/// What `helm install` left: every CRD Established, the Policy serving a digest, the webhook
/// configuration calling the chart's Service with the controller's CA; then the README's
/// `kubectl run` gets an address from the default pool, recorded in its Endpoint and released
/// when the pod goes.
#[tokio::test]
async fn helm_install_as_the_readme_says_serves_a_first_pod() {
    let Some(s) = Suite::shared("helm_install_as_the_readme_says_serves_a_first_pod").await else {
        return;
    };
    let crds: Api<CustomResourceDefinition> = Api::all(s.client.clone());
    let ours: Vec<CustomResourceDefinition> = crds
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|c| c.spec.group == "allot.dev")
        .collect();
    assert_eq!(ours.len(), 8, "allot's CRDs");
    for crd in &ours {
        let established = crd
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|c| {
                c.iter()
                    .any(|c| c.type_ == "Established" && c.status == "True")
            });
        assert!(established, "{:?} is not Established", crd.metadata.name);
    }
    let policies: Api<Policy> = Api::all(s.client.clone());
    wait_for(
        "the Policy serving a digest",
        Duration::from_secs(60),
        || async {
            let p = policies.get("default").await.map_err(|e| e.to_string())?;
            p.status
                .and_then(|s| s.serving_digest)
                .filter(|d| d.starts_with("sha256:"))
                .ok_or_else(|| "no digest yet".to_string())
        },
    )
    .await;
    let configs: Api<ValidatingWebhookConfiguration> = Api::all(s.client.clone());
    let config = configs.get("allot").await.unwrap();
    let hook = &config.webhooks.as_ref().unwrap()[0];
    let service = hook
        .client_config
        .service
        .as_ref()
        .expect("a Service reference");
    assert_eq!(
        (service.namespace.as_str(), service.name.as_str()),
        (NAMESPACE, "allot-webhook")
    );
    assert!(hook.client_config.ca_bundle.is_some(), "no caBundle");

    let ns = s.namespace("first-pod").await;
    s.must(
        "kubectl",
        &[
            "-n",
            &ns,
            "run",
            "demo",
            "--image=busybox",
            "--restart=Never",
            "--",
            "sleep",
            "3600",
        ],
    );
    let pod = s.ready_pods(&ns, "run=demo", 1).await.remove(0);
    let ips = pod_ips(&pod);
    assert_eq!(ips.len(), 2, "an IPv4 and an IPv6 address: {ips:?}");
    assert_eq!(endpoint_ips(&s.client, &ns, "demo").await, ips);
    let held = claims_in(&s.client, &ns).await;
    assert_eq!(held.keys().copied().collect::<Vec<_>>(), ips);
    assert!(
        held.values().all(|h| h.pool.starts_with("default-v")),
        "{held:?}"
    );

    s.must(
        "kubectl",
        &["-n", &ns, "delete", "pod", "demo", "--wait=true"],
    );
    wait_for(
        "demo's addresses released",
        Duration::from_secs(60),
        || async {
            let held = claims_in(&s.client, &ns).await;
            held.is_empty().then_some(()).ok_or(held)
        },
    )
    .await;
    assert!(endpoint_ips(&s.client, &ns, "demo").await.is_empty());
    s.no_refusals();
}

const DEPLOY_V4: &str = "198.51.100.192-198.51.100.223";
const DEPLOY_V6: &str = "2001:db8:1ab::2:0-2001:db8:1ab::2:ffff";

/// A Deployment of 20 pods over 3 nodes: each pod's `status.podIPs` is what its Endpoint
/// records and what the IPBlocks hold for it, no address twice, the pools' counts agree;
/// scaled to 5, the other 15 pods' addresses are released and the counts follow.
#[tokio::test]
async fn a_deployment_over_the_nodes_holds_what_its_pods_use_and_scaling_down_releases() {
    let Some(s) = Suite::shared(
        "a_deployment_over_the_nodes_holds_what_its_pods_use_and_scaling_down_releases",
    )
    .await
    else {
        return;
    };
    let ns = s.namespace("deploy").await;
    s.must_apply(&objects::pool_yaml(
        "deploy-v4",
        "198.51.100.0/24",
        "198.51.100.1",
        DEPLOY_V4,
    ));
    s.must_apply(&objects::pool_yaml(
        "deploy-v6",
        "2001:db8:1ab::/64",
        "2001:db8:1ab::1",
        DEPLOY_V6,
    ));
    let annotation = objects::pools_annotation("deploy-v4", "deploy-v6");
    s.must_apply(
        &objects::Workload::deployment(&ns, "web", 20)
            .pools(&annotation)
            .spread("DoNotSchedule")
            .yaml(),
    );

    let check = |pods: Vec<k8s_openapi::api::core::v1::Pod>| {
        let s = &s;
        let ns = ns.clone();
        async move {
            let mut used = BTreeSet::new();
            let nodes: BTreeSet<String> = pods
                .iter()
                .filter_map(|p| p.spec.as_ref()?.node_name.clone())
                .collect();
            for pod in &pods {
                let name = pod.metadata.name.clone().unwrap();
                let ips = pod_ips(pod);
                assert_eq!(ips.len(), 2, "{name}: {ips:?}");
                assert_eq!(
                    endpoint_ips(&s.client, &ns, &name).await,
                    ips,
                    "{name}'s Endpoint"
                );
                for ip in &ips {
                    assert!(used.insert(*ip), "{ip} is used twice");
                }
            }
            let held = claims_in(&s.client, &ns).await;
            let held_ips: BTreeSet<IpAddr> = held.keys().copied().collect();
            assert_eq!(
                held_ips, used,
                "the IPBlocks hold exactly the pods' addresses"
            );
            for pod in &pods {
                let uid = pod.metadata.uid.clone().unwrap();
                for ip in pod_ips(pod) {
                    assert_eq!(held[&ip].uid, uid, "{ip} is held for its pod");
                }
            }
            nodes
        }
    };
    let pods = s.ready_pods(&ns, "app=web", 20).await;
    let nodes = check(pods).await;
    assert_eq!(nodes.len(), 3, "spread over the three nodes: {nodes:?}");
    wait_for("the pools' counts", Duration::from_secs(60), || async {
        let counts = (
            pool_counts(&s.client, "deploy-v4").await,
            pool_counts(&s.client, "deploy-v6").await,
        );
        (counts == (Some((20, 32)), Some((20, 65536))))
            .then_some(())
            .ok_or(counts)
    })
    .await;

    s.must(
        "kubectl",
        &["-n", &ns, "scale", "deployment/web", "--replicas=5"],
    );
    let pods = s.ready_pods(&ns, "app=web", 5).await;
    wait_for(
        "the other 15 released",
        Duration::from_secs(120),
        || async {
            let held = claims_in(&s.client, &ns).await.len();
            (held == 10).then_some(()).ok_or(held)
        },
    )
    .await;
    check(pods).await;
    wait_for(
        "the pools' counts after scaling down",
        Duration::from_secs(60),
        || async {
            let counts = pool_counts(&s.client, "deploy-v4").await;
            (counts == Some((5, 32))).then_some(()).ok_or(counts)
        },
    )
    .await;
    s.must("kubectl", &["delete", "namespace", &ns, "--wait=true"]);
    wait_for(
        "every address of the namespace released",
        Duration::from_secs(120),
        || async {
            let held = claims_in(&s.client, &ns).await.len();
            (held == 0).then_some(()).ok_or(held)
        },
    )
    .await;
    s.must(
        "kubectl",
        &["delete", "ippool", "deploy-v4", "deploy-v6", "--wait=true"],
    );
    s.no_refusals();
}

/// The real admission webhook, reached through the chart's Service, refuses with the reason: an
/// invalid IPPool, one overlapping another, and the deletion of a pool that holds addresses.
#[tokio::test]
async fn the_admission_webhook_refuses_what_would_strand_or_double_an_address() {
    let Some(s) =
        Suite::shared("the_admission_webhook_refuses_what_would_strand_or_double_an_address").await
    else {
        return;
    };
    let refused = |yaml: &str, why: &str| {
        let out = s.apply(yaml);
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(!out.status.success(), "accepted:\n{yaml}");
        assert!(
            stderr.contains("admission webhook \"validate.allot.dev\" denied the request")
                && stderr.contains(why),
            "{stderr}"
        );
    };
    refused(
        &objects::pool_yaml(
            "backwards",
            "203.0.113.0/24",
            "203.0.113.1",
            "203.0.113.20-203.0.113.10",
        ),
        "ends before it starts",
    );
    refused(
        &objects::pool_yaml(
            "overlapping",
            "198.51.100.0/24",
            "198.51.100.1",
            "198.51.100.150-198.51.100.160",
        ),
        "are also in IPPool default-v4",
    );

    let ns = s.namespace("webhook").await;
    s.must(
        "kubectl",
        &[
            "-n",
            &ns,
            "run",
            "holder",
            "--image=busybox",
            "--restart=Never",
            "--",
            "sleep",
            "3600",
        ],
    );
    let pod = s.ready_pods(&ns, "run=holder", 1).await.remove(0);
    let v4 = pod_ips(&pod).into_iter().find(IpAddr::is_ipv4).unwrap();
    let out = s.kubectl(&["delete", "ippool", "default-v4", "--wait=false"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "a pool in use was deleted");
    assert!(
        stderr.contains("holds")
            && stderr.contains(&v4.to_string())
            && stderr.contains(&format!("{ns}/holder")),
        "the refusal names the address and its pod: {stderr}"
    );
    s.must("kubectl", &["delete", "namespace", &ns, "--wait=true"]);

    // The webhook listens on both families: an IPv6-only cluster's API server dials a webhook
    // endpoint's IPv6 address, which a listener on 0.0.0.0 never answers. Every controller
    // replica accepts on each of its pod's addresses (on the host network here: its node's).
    let controllers = s
        .pods(NAMESPACE, "app.kubernetes.io/component=controller")
        .await;
    assert!(!controllers.is_empty(), "no controller pods");
    for pod in &controllers {
        let ips = pod_ips(pod);
        assert!(
            ips.iter().any(IpAddr::is_ipv6) && ips.iter().any(IpAddr::is_ipv4),
            "{:?}: podIPs {ips:?}",
            pod.metadata.name
        );
        for ip in ips {
            let address = std::net::SocketAddr::new(ip, 9443);
            std::net::TcpStream::connect_timeout(&address, Duration::from_secs(5))
                .unwrap_or_else(|e| panic!("the webhook on {address}: {e}"));
        }
    }
    s.no_refusals();
}
