//! Addresses users declare, on the real control plane: a legacy application given its address
//! by annotation (allot's and Calico's spelling), and a database StatefulSet that declares an
//! address per ordinal, scaled 3 → 1 → 3.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::time::Duration;

use allot_cluster_tests::Suite;
use allot_cluster_tests::objects::{Workload, claims_in, pod_ips, pool_yaml};
use allot_k8s::ReservedIP;
use allot_lab::testing::wait_for;
use k8s_openapi::api::core::v1::Event;
use kube::api::{Api, ListParams};

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// Waits for a Warning Event on pod `ns/name` whose message contains every one of `parts`, and
/// returns the message.
async fn pod_event(s: &Suite, ns: &str, name: &str, parts: &[&str]) -> String {
    let events: Api<Event> = Api::namespaced(s.client.clone(), ns);
    let selector = format!("involvedObject.name={name}");
    wait_for(
        &format!("an event on {ns}/{name} saying {parts:?}"),
        Duration::from_secs(90),
        || async {
            let list = events
                .list(&ListParams::default().fields(&selector))
                .await
                .map(|l| l.items)
                .unwrap_or_default();
            let messages: Vec<String> = list.into_iter().filter_map(|e| e.message).collect();
            messages
                .iter()
                .find(|m| parts.iter().all(|p| m.contains(p)))
                .cloned()
                .ok_or(messages)
        },
    )
    .await
}

fn bare_pod(ns: &str, name: &str, annotations: &[(&str, &str)]) -> String {
    let annotations: Vec<String> = annotations
        .iter()
        .map(|(k, v)| format!("    {k}: '{v}'"))
        .collect();
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  namespace: {ns}\n  labels: \
         {{app: {name}}}\n  annotations:\n{}\nspec:\n  terminationGracePeriodSeconds: 1\n  \
         containers: [{{name: c, image: busybox, command: [sleep, \"3600\"]}}]\n",
        annotations.join("\n")
    )
}

/// A legacy application whose address is written into firewalls and DNS: its Deployment's pod
/// template gives it 198.51.100.115 and 2001:db8:1ab::5:5. Its pod gets exactly those; a pod
/// asking for the same address (in Calico's spelling) does not start, and is told who holds
/// it; an address outside the pools the pod may use is refused with the reason; the pod
/// replaced gets the same addresses again.
#[tokio::test]
async fn a_legacy_app_gets_the_address_its_annotation_gives() {
    let Some(s) = Suite::shared("a_legacy_app_gets_the_address_its_annotation_gives").await else {
        return;
    };
    let ns = s.namespace("legacy").await;
    s.must_apply(&pool_yaml(
        "legacy-v4",
        "198.51.100.0/24",
        "198.51.100.1",
        "198.51.100.112-198.51.100.119",
    ));
    s.must_apply(&pool_yaml(
        "legacy-v6",
        "2001:db8:1ab::/64",
        "2001:db8:1ab::1",
        "2001:db8:1ab::5:0-2001:db8:1ab::5:f",
    ));
    let pools = r#"{"ipv4":["legacy-v4"],"ipv6":["legacy-v6"]}"#;
    s.must_apply(
        &Workload::deployment(&ns, "billing", 1)
            .pools(pools)
            .annotate(
                "ipam.allot.dev/ip",
                r#"{"ipv4":"198.51.100.115","ipv6":"2001:db8:1ab::5:5"}"#,
            )
            .grace(1)
            .yaml(),
    );
    let given = vec![ip("198.51.100.115"), ip("2001:db8:1ab::5:5")];
    let first = s.ready_pods(&ns, "app=billing", 1).await.remove(0);
    assert_eq!(pod_ips(&first), given);

    // Another pod asks for the same address, the way a cluster migrating from Calico writes it.
    s.must_apply(&bare_pod(
        &ns,
        "intruder",
        &[
            ("ipam.allot.dev/ippool", r#"{"ipv4":["legacy-v4"]}"#),
            ("cni.projectcalico.org/ipAddrs", r#"["198.51.100.115"]"#),
        ],
    ));
    let message = pod_event(
        &s,
        &ns,
        "intruder",
        &[
            "cannot get 198.51.100.115",
            "held by pod",
            "no other address",
        ],
    )
    .await;
    assert!(
        message.contains(&format!("{ns}/{}", first.metadata.name.as_ref().unwrap())),
        "{message}"
    );
    // An address of a pool the pod may not use: refused, saying so.
    s.must_apply(&bare_pod(
        &ns,
        "outsider",
        &[
            ("ipam.allot.dev/ippool", r#"{"ipv4":["legacy-v4"]}"#),
            ("ipam.allot.dev/ip", r#"{"ipv4":"198.51.100.140"}"#),
        ],
    ));
    pod_event(
        &s,
        &ns,
        "outsider",
        &[
            "cannot get 198.51.100.140",
            "not among the pools allowed for this pod",
        ],
    )
    .await;
    // Neither got an address instead.
    let held: BTreeSet<IpAddr> = claims_in(&s.client, &ns).await.keys().copied().collect();
    assert_eq!(held, given.iter().copied().collect());

    // Two pods given one address: whichever asks first once it is free gets it (allot cannot
    // tell which one the firewall rules mean), so the others go before billing's pod is
    // replaced.
    s.must(
        "kubectl",
        &[
            "-n",
            &ns,
            "delete",
            "pod",
            "intruder",
            "outsider",
            "--wait=true",
        ],
    );
    // The pod is replaced: its successor gets the same addresses.
    s.must(
        "kubectl",
        &[
            "-n",
            &ns,
            "delete",
            "pod",
            first.metadata.name.as_ref().unwrap(),
            "--wait=true",
        ],
    );
    let second = wait_for("billing's new pod", Duration::from_secs(120), || async {
        let pods = s.ready_pods(&ns, "app=billing", 1).await;
        let pod = pods.into_iter().next().unwrap();
        (pod.metadata.uid != first.metadata.uid)
            .then_some(pod)
            .ok_or(())
    })
    .await;
    assert_eq!(pod_ips(&second), given);

    s.must("kubectl", &["delete", "namespace", &ns, "--wait=true"]);
    s.must(
        "kubectl",
        &["delete", "ippool", "legacy-v4", "legacy-v6", "--wait=true"],
    );
    s.no_refusals();
}

fn database(ns: &str, name: &str, replicas: u32, declared: &str) -> String {
    Workload::statefulset(ns, name, replicas)
        .pools(r#"{"ipv4":["db-v4"]}"#)
        .annotate(
            "ipam.allot.dev/ordinal-ips",
            &format!(r#"{{"ipv4":["{declared}"]}}"#),
        )
        .grace(1)
        .yaml()
}

/// Addresses of the StatefulSet's pods, by pod name.
async fn by_pod(s: &Suite, ns: &str, count: usize) -> Vec<(String, Vec<IpAddr>)> {
    let mut out: Vec<(String, Vec<IpAddr>)> = s
        .ready_pods(ns, "app=db", count)
        .await
        .iter()
        .map(|p| (p.metadata.name.clone().unwrap(), pod_ips(p)))
        .collect();
    out.sort();
    out
}

/// A database StatefulSet declares one address per ordinal; scaled 3 → 1 → 3 it gets its same
/// three addresses, nobody else gets them meanwhile (not by chance, not by asking), the
/// admission webhook refuses another StatefulSet declaring one of them or an address in no
/// pool, and deleting the StatefulSet releases them.
#[tokio::test]
async fn a_database_statefulset_scaled_3_1_3_gets_its_same_three_addresses() {
    let Some(s) =
        Suite::shared("a_database_statefulset_scaled_3_1_3_gets_its_same_three_addresses").await
    else {
        return;
    };
    let ns = s.namespace("db").await;
    s.must_apply(&pool_yaml(
        "db-v4",
        "198.51.100.0/24",
        "198.51.100.1",
        "198.51.100.120-198.51.100.127",
    ));
    s.must_apply(&database(&ns, "db", 3, "198.51.100.121-198.51.100.123"));
    let three = vec![
        ("db-0".to_string(), vec![ip("198.51.100.121")]),
        ("db-1".to_string(), vec![ip("198.51.100.122")]),
        ("db-2".to_string(), vec![ip("198.51.100.123")]),
    ];
    assert_eq!(by_pod(&s, &ns, 3).await, three);
    let reservation = format!("statefulset.{ns}.db.ipv4");
    let reserved: Api<ReservedIP> = Api::all(s.client.clone());
    let kept = wait_for("db's ReservedIP", Duration::from_secs(60), || async {
        reserved
            .get_opt(&reservation)
            .await
            .ok()
            .flatten()
            .ok_or(())
    })
    .await;
    assert_eq!(kept.spec.0.ips, vec!["198.51.100.121-198.51.100.123"]);

    s.must(
        "kubectl",
        &["-n", &ns, "scale", "statefulset/db", "--replicas=1"],
    );
    s.ready_pods(&ns, "app=db", 1).await;
    wait_for(
        "db-1 and db-2 gone, their addresses no pod's",
        Duration::from_secs(120),
        || async {
            let held: Vec<IpAddr> = claims_in(&s.client, &ns)
                .await
                .into_iter()
                .filter(|(_, h)| h.attached)
                .map(|(a, _)| a)
                .collect();
            (held == [ip("198.51.100.121")]).then_some(()).ok_or(held)
        },
    )
    .await;

    // Meanwhile: pods of the same pool never get them by chance...
    s.must_apply(
        &Workload::deployment(&ns, "squatters", 5)
            .pools(r#"{"ipv4":["db-v4"]}"#)
            .grace(1)
            .yaml(),
    );
    let squatters: BTreeSet<IpAddr> = s
        .ready_pods(&ns, "app=squatters", 5)
        .await
        .iter()
        .flat_map(pod_ips)
        .collect();
    let free: BTreeSet<IpAddr> = ["120", "124", "125", "126", "127"]
        .iter()
        .map(|o| ip(&format!("198.51.100.{o}")))
        .collect();
    assert_eq!(
        squatters, free,
        "the pool's other five addresses, and only those"
    );
    // ...nor by asking,
    s.must_apply(&bare_pod(
        &ns,
        "asker",
        &[
            ("ipam.allot.dev/ippool", r#"{"ipv4":["db-v4"]}"#),
            ("ipam.allot.dev/ip", r#"{"ipv4":"198.51.100.122"}"#),
        ],
    ));
    pod_event(
        &s,
        &ns,
        "asker",
        &[
            "cannot get 198.51.100.122",
            &format!("reserved by ReservedIP {reservation}"),
        ],
    )
    .await;
    // ...nor by declaring them: the webhook refuses another StatefulSet's list, and one with an
    // address in no pool.
    let out = s.apply(&database(&ns, "rival", 1, "198.51.100.123"));
    let refusal = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        refusal.contains("198.51.100.123 is reserved by ReservedIP"),
        "{refusal}"
    );
    let out = s.apply(&database(&ns, "nowhere", 1, "203.0.113.5"));
    let refusal = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(refusal.contains("203.0.113.5 is in no IPPool"), "{refusal}");

    s.must(
        "kubectl",
        &[
            "-n",
            &ns,
            "delete",
            "deployment",
            "squatters",
            "--wait=true",
        ],
    );
    s.must(
        "kubectl",
        &["-n", &ns, "delete", "pod", "asker", "--wait=true"],
    );
    s.must(
        "kubectl",
        &["-n", &ns, "scale", "statefulset/db", "--replicas=3"],
    );
    assert_eq!(by_pod(&s, &ns, 3).await, three, "the same three addresses");

    // Deleted, the StatefulSet lets its addresses go.
    s.must(
        "kubectl",
        &["-n", &ns, "delete", "statefulset", "db", "--wait=true"],
    );
    wait_for(
        "db's ReservedIP deleted",
        Duration::from_secs(60),
        || async {
            match reserved.get_opt(&reservation).await {
                Ok(None) => Ok(()),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await;
    wait_for(
        "db's addresses released",
        Duration::from_secs(120),
        || async {
            let held = claims_in(&s.client, &ns).await;
            held.is_empty().then_some(()).ok_or(held.len())
        },
    )
    .await;
    s.must("kubectl", &["delete", "namespace", &ns, "--wait=true"]);
    s.must("kubectl", &["delete", "ippool", "db-v4", "--wait=true"]);
    s.no_refusals();
}
