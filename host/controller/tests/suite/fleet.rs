//! Fleet ranges end to end against the in-memory API server (`tests/apiserver`): the
//! controller's watches, passes, full syncs and writes. Two fleet controllers that both believe
//! they lead (no election at all) over many Cluster API clusters and requests hand out no
//! address twice; Clusters deleted, moved and unlabelled; Cluster API not installed; the copy
//! into workload clusters served by a second API server over loopback HTTP.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};

use allot_controller::fleet::{FleetArgs, FleetController};
use allot_controller::lease::Leadership;
use allot_k8s::openapi::ByteString;
use allot_k8s::{AllocationState, IPAMAllocation, IPAMPool};
use allot_test_apiserver::ApiServer;
use serde_json::{Value, json};

fn pool_object() -> Value {
    json!({"apiVersion": "allot.dev/v1alpha1", "kind": "IPAMPool",
           "metadata": {"name": "metallb"},
           "spec": {"datacenters": {
               "hamburg": {"type": "range", "poolCidr": "10.1.0.0/24", "allocationRange": 3,
                           "excludeRanges": ["10.1.0.1-10.1.0.10"]},
               "berlin": {"type": "range", "poolCidr": "10.2.0.0/24", "allocationRange": 3}}}})
}

fn cluster(ns: &str, name: &str, dc: Option<&str>) -> Value {
    let mut labels = json!({"team": "platform"});
    if let Some(dc) = dc {
        labels["allot.dev/datacenter"] = json!(dc);
    }
    json!({"apiVersion": "cluster.x-k8s.io/v1beta1", "kind": "Cluster",
           "metadata": {"namespace": ns, "name": name, "labels": labels},
           "spec": {"paused": false}})
}

fn request(ns: &str, dc: &str) -> Value {
    json!({"apiVersion": "allot.dev/v1alpha1", "kind": "IPAMAllocation",
           "metadata": {"namespace": ns, "name": "metallb"},
           "spec": {"dc": dc}})
}

fn eventually<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(t) = f() {
            return t;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(25));
    }
}

fn allocations(server: &ApiServer) -> BTreeMap<String, IPAMAllocation> {
    server
        .objects("ipamallocations")
        .into_iter()
        .map(|o| serde_json::from_value::<IPAMAllocation>(o).unwrap())
        .map(|a| (a.metadata.namespace.clone().unwrap(), a))
        .collect()
}

fn record(server: &ApiServer) -> BTreeMap<String, allot_k8s::IPAMAllocationSpec> {
    let pool: IPAMPool = serde_json::from_value(
        server
            .objects("ipampools")
            .into_iter()
            .find(|p| p["metadata"]["name"] == "metallb")
            .unwrap(),
    )
    .unwrap();
    pool.status.unwrap_or_default().allocations
}

fn addresses(a: &allot_k8s::IPAMAllocationSpec) -> Vec<Ipv4Addr> {
    a.addresses
        .iter()
        .flat_map(|run| {
            let (f, l) = run.split_once('-').unwrap();
            let (f, l): (Ipv4Addr, Ipv4Addr) = (f.parse().unwrap(), l.parse().unwrap());
            (u32::from(f)..=u32::from(l)).map(Ipv4Addr::from)
        })
        .collect()
}

/// Every namespace in `expected` holds an Allocated IPAMAllocation of its datacenter that is
/// its record and its ConfigMap key, nobody else holds anything, and no address is held twice.
fn settled(server: &ApiServer, expected: &BTreeMap<String, &str>) -> bool {
    let objects = allocations(server);
    let record = record(server);
    if record.len() != expected.len() || objects.len() != expected.len() {
        return false;
    }
    let maps: BTreeMap<String, Value> = server
        .objects("configmaps")
        .into_iter()
        .filter(|c| c["metadata"]["name"] == "allot-ipam-allocations")
        .map(|c| {
            (
                c["metadata"]["namespace"].as_str().unwrap().to_string(),
                c["data"].clone(),
            )
        })
        .collect();
    for (ns, dc) in expected {
        let Some(o) = objects.get(ns) else {
            return false;
        };
        let state = o.status.as_ref().and_then(|s| s.state);
        if o.spec.dc != *dc
            || state != Some(AllocationState::Allocated)
            || record.get(ns) != Some(&o.spec)
            || maps.get(ns).map(|d| d["metallb"].clone()) != Some(json!(o.spec.addresses.join(",")))
        {
            return false;
        }
    }
    no_address_twice(&record);
    true
}

fn no_address_twice(record: &BTreeMap<String, allot_k8s::IPAMAllocationSpec>) {
    let mut seen: BTreeMap<Ipv4Addr, &str> = BTreeMap::new();
    for (ns, a) in record {
        let held = addresses(a);
        assert_eq!(held.len(), 3, "{ns}: {a:?}");
        for ip in held {
            if let Some(other) = seen.insert(ip, ns) {
                panic!("{ip} held by {ns} and {other}");
            }
            assert!(
                !(IpAddr::V4(ip) >= "10.1.0.1".parse::<IpAddr>().unwrap()
                    && IpAddr::V4(ip) <= "10.1.0.10".parse::<IpAddr>().unwrap()),
                "{ip} is excluded"
            );
            let cidr = if a.dc == "hamburg" {
                [10, 1, 0]
            } else {
                [10, 2, 0]
            };
            assert_eq!(ip.octets()[..3], cidr, "{ns} {ip} from {}", a.dc);
        }
    }
}

/// Runs fleet controllers (each on its own client, all leading) until the returned sender is
/// dropped or sent to.
fn start(
    runtime: &tokio::runtime::Runtime,
    server: &ApiServer,
    controllers: usize,
    args: FleetArgs,
) -> (
    tokio::sync::watch::Sender<bool>,
    Vec<tokio::task::JoinHandle<()>>,
) {
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let _guard = runtime.enter();
    let handles = (0..controllers)
        .map(|n| {
            let mut stopped = stopped.clone();
            let controller = FleetController {
                client: server.client(),
                leadership: Leadership::always(),
                args: args.clone(),
                instance: format!("controller-{n}"),
            };
            runtime.spawn(controller.run(async move {
                let _ = stopped.wait_for(|s| *s).await;
            }))
        })
        .collect();
    (stop, handles)
}

fn args() -> FleetArgs {
    FleetArgs {
        resync_seconds: 1,
        ..FleetArgs::default()
    }
}

#[test]
fn two_controllers_that_both_lead_never_hand_out_an_address_twice() {
    let server = ApiServer::new();
    server.insert("ipampools", pool_object());
    let mut expected: BTreeMap<String, &str> = BTreeMap::new();
    for n in 0..30 {
        let dc = if n % 3 == 0 { "berlin" } else { "hamburg" };
        let ns = format!("cluster-{n:02}");
        server.insert("clusters", cluster(&ns, &format!("c{n:02}"), Some(dc)));
        expected.insert(ns, dc);
    }
    for n in 0..8 {
        let ns = format!("edge-{n}");
        server.insert("ipamallocations", request(&ns, "hamburg"));
        expected.insert(ns, "hamburg");
    }
    // A Cluster in a datacenter the pool does not serve asks nothing.
    server.insert("clusters", cluster("cluster-paris", "paris", Some("paris")));
    // Every record write lands a moment late, so the other controller reads the version it
    // replaces meanwhile and loses its compare-and-swap.
    server.delay("update", "ipampools", Duration::from_millis(3));

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    // No full sync during the test: every change is acted on by the passes it triggers.
    let passes_only = FleetArgs {
        resync_seconds: 3600,
        ..FleetArgs::default()
    };
    let (stop, handles) = start(&runtime, &server, 2, passes_only);
    eventually("every cluster allocated", || {
        settled(&server, &expected).then_some(())
    });
    let writes = server.requests("update", "ipampools");
    assert!(
        writes > expected.len() as u64,
        "{writes} record writes for {} clusters: the controllers never raced",
        expected.len()
    );
    // The allocations made for Clusters carry their Cluster's name; requests stay requests.
    let objects = allocations(&server);
    let label = |ns: &str| {
        objects[ns]
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("cluster.x-k8s.io/cluster-name").cloned())
    };
    assert_eq!(label("cluster-07").as_deref(), Some("c07"));
    assert_eq!(label("edge-3"), None);

    // Deleted Clusters and a deleted request are released ...
    for n in [1, 2, 4, 5] {
        assert!(server.remove(
            "cluster.x-k8s.io/v1beta1",
            "clusters",
            Some(&format!("cluster-{n:02}")),
            &format!("c{n:02}")
        ));
        expected.remove(&format!("cluster-{n:02}"));
    }
    assert!(server.remove(
        "allot.dev/v1alpha1",
        "ipamallocations",
        Some("edge-0"),
        "metallb"
    ));
    expected.remove("edge-0");
    // ... moved ones get a range in their new datacenter ...
    let moved: Vec<String> = (7..10).map(|n| format!("cluster-{n:02}")).collect();
    for ns in &moved {
        let name = format!("c{}", &ns[8..]);
        let dc = if expected[ns] == "hamburg" {
            "berlin"
        } else {
            "hamburg"
        };
        server.edit("clusters", cluster(ns, &name, Some(dc)));
        expected.insert(ns.clone(), dc);
    }
    // ... one whose label is removed keeps what it has ...
    let kept = record(&server)["cluster-11"].clone();
    server.edit("clusters", cluster("cluster-11", "c11", None));
    // ... and new ones are served, from what was freed too.
    for n in 30..36 {
        let ns = format!("cluster-{n:02}");
        server.insert(
            "clusters",
            cluster(&ns, &format!("c{n:02}"), Some("hamburg")),
        );
        expected.insert(ns, "hamburg");
    }
    eventually("the fleet settled again", || {
        settled(&server, &expected).then_some(())
    });
    assert_eq!(record(&server)["cluster-11"], kept);
    let events = server.objects("events");
    assert!(
        events
            .iter()
            .any(|e| e["reason"] == "NoDatacenterLabel" && e["regarding"]["name"] == "c11"),
        "{events:?}"
    );

    stop.send(true).unwrap();
    for h in handles {
        runtime.block_on(h).unwrap();
    }
}

#[test]
fn without_cluster_api_requests_are_served_and_the_missing_resource_is_retried() {
    let server = ApiServer::new();
    server.insert("ipampools", pool_object());
    server.insert("ipamallocations", request("edge", "berlin"));
    // Made for a Cluster earlier: kept while nobody can tell whether its Cluster exists.
    server.insert(
        "ipamallocations",
        json!({"apiVersion": "allot.dev/v1alpha1", "kind": "IPAMAllocation",
               "metadata": {"namespace": "cluster-a", "name": "metallb",
                            "labels": {"cluster.x-k8s.io/cluster-name": "shop"}},
               "spec": {"type": "range", "dc": "hamburg", "addresses": ["10.1.0.11-10.1.0.13"]}}),
    );
    server.fail("list", "clusters", 1_000_000, 404, "NotFound");
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let (stop, handles) = start(&runtime, &server, 1, args());
    let expected = BTreeMap::from([
        ("edge".to_string(), "berlin"),
        ("cluster-a".to_string(), "hamburg"),
    ]);
    eventually(
        "the request served, the Cluster's allocation adopted",
        || settled(&server, &expected).then_some(()),
    );
    assert_eq!(
        record(&server)["cluster-a"].addresses,
        ["10.1.0.11-10.1.0.13"]
    );
    // Cluster API installed later: its Clusters are watched, and cluster-a's Cluster is gone.
    let lists = server.requests("list", "clusters");
    server.clear_faults();
    server.insert("clusters", cluster("cluster-b", "lab", Some("hamburg")));
    let expected = BTreeMap::from([
        ("edge".to_string(), "berlin"),
        ("cluster-b".to_string(), "hamburg"),
    ]);
    // The watcher's backoff reaches 30 s at most; allow for it.
    let deadline = Instant::now() + Duration::from_secs(45);
    while !settled(&server, &expected) {
        assert!(Instant::now() < deadline, "Cluster API never picked up");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(lists >= 1);
    stop.send(true).unwrap();
    for h in handles {
        runtime.block_on(h).unwrap();
    }
}

fn kubeconfig_secret(ns: &str, cluster: &str, kubeconfig: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Secret",
           "metadata": {"namespace": ns, "name": format!("{cluster}-kubeconfig")},
           "data": {"value": ByteString(kubeconfig.as_bytes().to_vec())}})
}

fn copy_in(workload: &ApiServer) -> Option<Value> {
    workload.objects("configmaps").into_iter().find(|c| {
        c["metadata"]["namespace"] == "kube-system"
            && c["metadata"]["name"] == "allot-ipam-allocations"
    })
}

#[test]
fn the_configmap_reaches_the_workload_cluster_and_a_dead_one_holds_up_nobody() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let workload = ApiServer::new();
    let bound = runtime
        .block_on(workload.serve("127.0.0.1:0".parse().unwrap()))
        .unwrap();
    // A port nothing listens on any more.
    let dead = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();

    let server = ApiServer::new();
    server.insert("ipampools", pool_object());
    for (ns, name) in [
        ("cluster-a", "shop"),
        ("cluster-b", "dead"),
        ("cluster-c", "new"),
    ] {
        server.insert("clusters", cluster(ns, name, Some("hamburg")));
    }
    server.insert(
        "secrets",
        kubeconfig_secret(
            "cluster-a",
            "shop",
            &ApiServer::kubeconfig(&format!("http://{bound}")),
        ),
    );
    server.insert(
        "secrets",
        kubeconfig_secret(
            "cluster-b",
            "dead",
            &ApiServer::kubeconfig(&format!("http://{dead}")),
        ),
    );
    // cluster-c has no kubeconfig Secret yet.

    let (stop, handles) = start(
        &runtime,
        &server,
        1,
        FleetArgs {
            workload_configmap: true,
            workload_timeout_seconds: 2,
            ..args()
        },
    );
    let copied = eventually("the copy in shop's workload cluster", || copy_in(&workload));
    let held = record(&server)["cluster-a"].addresses.join(",");
    assert_eq!(copied["data"], json!({"metallb": held}));
    assert_eq!(
        copied["metadata"]["annotations"]["allot.dev/copied-from"],
        "cluster-a/shop"
    );
    let failed = |name: &str, words: &str| {
        server.objects("events").into_iter().any(|e| {
            e["reason"] == "WorkloadConfigMapFailed"
                && e["regarding"]["name"] == name
                && e["note"].as_str().unwrap_or_default().contains(words)
        })
    };
    eventually("the dead cluster reported", || {
        failed("dead", "the workload cluster's API server").then_some(())
    });
    eventually("the missing Secret reported", || {
        failed("new", "no Secret cluster-c/new-kubeconfig").then_some(())
    });

    // The pool grows: the copy follows.
    let mut pool = pool_object();
    pool["spec"]["datacenters"]["hamburg"]["allocationRange"] = json!(5);
    server.edit("ipampools", pool);
    eventually("the copy grown", || {
        let held = record(&server)["cluster-a"].clone();
        (addresses(&held).len() == 5
            && copy_in(&workload)?["data"]["metallb"] == json!(held.addresses.join(",")))
        .then_some(())
    });
    // Deleted in the workload cluster: written again at the next check.
    assert!(workload.remove(
        "v1",
        "configmaps",
        Some("kube-system"),
        "allot-ipam-allocations"
    ));
    eventually("the copy written again", || copy_in(&workload));

    stop.send(true).unwrap();
    for h in handles {
        runtime.block_on(h).unwrap();
    }
}
