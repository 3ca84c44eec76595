//! Every API path of the Kubernetes store against kube's own mock service (tower-test), in
//! controller-rs's style: an `ApiServerVerifier` checks each request the store makes (method,
//! path, body) and answers it as the API server would, including its refusals: 409 `Conflict`
//! and `AlreadyExists`, 410 `Gone` on a watch, 403 `Forbidden`, and no answer at all.

use std::net::IpAddr;
use std::time::{Duration, Instant};

use allot_core::store::{ChangeKind, Changes, Claim, Store, StoreError, system_clock};
use allot_store::contract::{attachment, claim, ip, pod};
use allot_store::{KubeConfig, KubeStore};
use allot_test_apiserver::verifier::{ApiServerVerifier, answer, refusal};
use http::{Request, Response};
use kube::client::Body;
use serde_json::{Value, json};
use tower_test::mock;

const T0: u64 = 1_700_000_000;

const BLOCKS: &str = "/apis/allot.dev/v1alpha1/ipblocks";

fn list(rv: u64, items: Vec<Value>) -> Value {
    json!({"apiVersion": "allot.dev/v1alpha1", "kind": "IPBlockList",
           "metadata": {"resourceVersion": rv.to_string()}, "items": items})
}

/// The block 10.0.0.0/26 at `rv` with claims `address → container id`.
fn block(rv: u64, claims: &[(&str, &str)]) -> Value {
    let claims: serde_json::Map<String, Value> = claims
        .iter()
        .map(|(a, c)| {
            (
                a.to_string(),
                json!({"pool": "p", "network": "net", "containerId": c,
                "interface": "eth0", "namespace": "ns", "pod": c, "uid": "u", "updatedAt": T0}),
            )
        })
        .collect();
    json!({"apiVersion": "allot.dev/v1alpha1", "kind": "IPBlock",
           "metadata": {"name": "v4-10-0-0-0-26", "resourceVersion": rv.to_string()},
           "spec": {"cidr": "10.0.0.0/26", "claims": claims}})
}

fn fresh(address: &str, container: &str) -> Claim {
    claim(
        address,
        "p",
        Some(&attachment(container, "eth0")),
        &pod("ns", container, "u"),
        T0,
    )
}

/// The runtime a test's mock API server answers on.
fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap()
}

/// A store on kube's mock service, opened while the verifier answers its first list with
/// `listed`; returns the store, the verifier (on its own runtime) to script.
fn open(
    listed: Value,
    timeout: Duration,
) -> (KubeStore, ApiServerVerifier, tokio::runtime::Runtime) {
    let rt = runtime();
    let (service, handle) = mock::pair::<Request<Body>, Response<Body>>();
    let mut verifier = ApiServerVerifier::new(handle);
    let answered = rt.spawn(async move {
        let (_, send) = verifier.expect("GET", BLOCKS).await;
        answer(send, 200, listed);
        verifier
    });
    let config = KubeConfig {
        node: Some("node-a".into()),
        timeout: Some(timeout),
        scope: Default::default(),
        ..KubeConfig::default()
    };
    let store = KubeStore::open_with(&config, system_clock(), move || async move {
        Ok(kube::Client::new(service, "default"))
    })
    .expect("open");
    let verifier = rt.block_on(answered).unwrap();
    (store, verifier, rt)
}

/// Runs `call` on a thread while `script` answers its requests.
fn scripted<T: Send + 'static>(
    rt: &tokio::runtime::Runtime,
    verifier: ApiServerVerifier,
    call: impl FnOnce() -> T + Send + 'static,
    script: impl AsyncFnOnce(&mut ApiServerVerifier) + Send + 'static,
) -> (T, ApiServerVerifier) {
    let caller = std::thread::spawn(call);
    let verifier = rt.block_on(async move {
        let mut v = verifier;
        script(&mut v).await;
        v
    });
    (caller.join().expect("the call panicked"), verifier)
}

/// A large list comes in pages (`limit`, then `continue`), all read before the store opens,
/// and every page's blocks are in the mirror.
#[test]
fn the_blocks_are_listed_in_pages() {
    let rt = runtime();
    let (service, handle) = mock::pair::<Request<Body>, Response<Body>>();
    let served = rt.spawn(async move {
        let mut handle = handle;
        let mut queries = Vec::new();
        for page in 0..2 {
            let (request, send) = handle.next_request().await.expect("a list");
            queries.push(request.uri().query().unwrap_or_default().to_string());
            let mut second = block(12, &[("10.0.0.70", "c2")]);
            second["metadata"]["name"] = json!("v4-10-0-0-64-26");
            second["spec"]["cidr"] = json!("10.0.0.64/26");
            let body = if page == 0 {
                let mut l = list(12, vec![block(11, &[("10.0.0.7", "c1")])]);
                l["metadata"]["continue"] = json!("page-2");
                l
            } else {
                list(12, vec![second])
            };
            answer(send, 200, body);
        }
        (queries, handle)
    });
    let store = KubeStore::open_with(&KubeConfig::default(), system_clock(), move || async move {
        Ok(kube::Client::new(service, "default"))
    })
    .expect("open");
    let (queries, _handle) = rt.block_on(served).unwrap();
    assert!(queries[0].contains("limit=500"), "{queries:?}");
    assert!(queries[1].contains("continue=page-2"), "{queries:?}");
    let addresses: Vec<IpAddr> = store.all().unwrap().iter().map(|c| c.address).collect();
    assert_eq!(addresses, [ip("10.0.0.7"), ip("10.0.0.70")]);
}

#[test]
fn a_claim_in_a_new_block_creates_it_with_the_claim() {
    let (store, v, rt) = open(list(10, vec![]), Duration::from_secs(5));
    let s = std::sync::Arc::new(store);
    let s2 = s.clone();
    let (result, _v) = scripted(
        &rt,
        v,
        move || s2.claim(&[fresh("10.0.0.7", "c1")]),
        async |v| {
            let (body, send) = v.expect("POST", BLOCKS).await;
            assert_eq!(body["metadata"]["name"], "v4-10-0-0-0-26");
            assert_eq!(body["spec"]["cidr"], "10.0.0.0/26");
            assert_eq!(body["spec"]["node"], "node-a");
            assert_eq!(body["spec"]["claims"]["10.0.0.7"]["containerId"], "c1");
            let mut stored = body.clone();
            stored["metadata"]["resourceVersion"] = json!("11");
            answer(send, 201, stored);
        },
    );
    result.expect("claimed");
    assert_eq!(s.claims_of(&attachment("c1", "eth0")).unwrap().len(), 1);
}

#[test]
fn a_lost_compare_and_swap_reads_the_block_again_and_keeps_the_other_writers_claim() {
    let (store, v, rt) = open(
        list(10, vec![block(5, &[("10.0.0.1", "c1")])]),
        Duration::from_secs(5),
    );
    let s = std::sync::Arc::new(store);
    let s2 = s.clone();
    let (result, _v) = scripted(
        &rt,
        v,
        move || s2.claim(&[fresh("10.0.0.3", "c3")]),
        async |v| {
            let (body, send) = v.expect("PUT", &format!("{BLOCKS}/v4-10-0-0-0-26")).await;
            assert_eq!(
                body["metadata"]["resourceVersion"], "5",
                "written on the version read"
            );
            answer(
                send,
                409,
                refusal(409, "Conflict", "the object has been modified"),
            );
            let (_, send) = v.expect("GET", &format!("{BLOCKS}/v4-10-0-0-0-26")).await;
            answer(
                send,
                200,
                block(7, &[("10.0.0.1", "c1"), ("10.0.0.2", "c2")]),
            );
            let (body, send) = v.expect("PUT", &format!("{BLOCKS}/v4-10-0-0-0-26")).await;
            assert_eq!(
                body["metadata"]["resourceVersion"], "7",
                "recomputed on the fresh version"
            );
            let claims = body["spec"]["claims"].as_object().unwrap();
            let mut held: Vec<&String> = claims.keys().collect();
            held.sort();
            assert_eq!(
                held,
                ["10.0.0.1", "10.0.0.2", "10.0.0.3"],
                "the other writer's claim kept"
            );
            let mut stored = body.clone();
            stored["metadata"]["resourceVersion"] = json!("8");
            answer(send, 200, stored);
        },
    );
    result.expect("claimed after one retry");
    assert_eq!(s.stats().conflicts, 1);
    assert_eq!(s.all().unwrap().len(), 3);
}

#[test]
fn an_address_taken_by_the_writer_that_won_is_a_lost_race_and_nothing_is_written() {
    let (store, v, rt) = open(list(10, vec![block(5, &[])]), Duration::from_secs(5));
    let (result, mut v) = scripted(
        &rt,
        v,
        move || store.claim(&[fresh("10.0.0.3", "c3")]),
        async |v| {
            let (_, send) = v.expect("PUT", &format!("{BLOCKS}/v4-10-0-0-0-26")).await;
            answer(
                send,
                409,
                refusal(409, "Conflict", "the object has been modified"),
            );
            let (_, send) = v.expect("GET", &format!("{BLOCKS}/v4-10-0-0-0-26")).await;
            answer(send, 200, block(6, &[("10.0.0.3", "someone")]));
        },
    );
    assert_eq!(result, Err(StoreError::Conflict(ip("10.0.0.3"))));
    rt.block_on(async {
        // The store is gone with the call's thread: whatever it sent after the lost race is
        // still queued. Only watches may be there.
        while let Ok(Some((request, _))) =
            tokio::time::timeout(Duration::from_millis(300), v.handle.next_request()).await
        {
            assert!(
                request
                    .uri()
                    .query()
                    .is_some_and(|q| q.contains("watch=true")),
                "no write after the lost race, got {} {}",
                request.method(),
                request.uri()
            );
        }
    });
}

#[test]
fn a_block_created_by_another_node_first_is_read_and_updated() {
    let (store, v, rt) = open(list(10, vec![]), Duration::from_secs(5));
    let (result, _v) = scripted(
        &rt,
        v,
        move || store.claim(&[fresh("10.0.0.9", "c9")]),
        async |v| {
            let (_, send) = v.expect("POST", BLOCKS).await;
            answer(
                send,
                409,
                refusal(
                    409,
                    "AlreadyExists",
                    "ipblocks.allot.dev \"v4-10-0-0-0-26\" already exists",
                ),
            );
            let (_, send) = v.expect("GET", &format!("{BLOCKS}/v4-10-0-0-0-26")).await;
            answer(send, 200, block(12, &[("10.0.0.1", "c1")]));
            let (body, send) = v.expect("PUT", &format!("{BLOCKS}/v4-10-0-0-0-26")).await;
            assert_eq!(body["metadata"]["resourceVersion"], "12");
            assert_eq!(body["spec"]["claims"].as_object().unwrap().len(), 2);
            let mut stored = body.clone();
            stored["metadata"]["resourceVersion"] = json!("13");
            answer(send, 200, stored);
        },
    );
    result.expect("claimed in the other node's block");
}

#[test]
fn endless_conflicts_end_as_unavailable_after_bounded_attempts() {
    let (store, v, rt) = open(list(10, vec![block(5, &[])]), Duration::from_secs(20));
    let (result, _v) = scripted(
        &rt,
        v,
        move || store.claim(&[fresh("10.0.0.3", "c3")]),
        async |v| {
            for i in 0..allot_store::kubernetes::MAX_ATTEMPTS as u64 {
                let (_, send) = v.expect("PUT", &format!("{BLOCKS}/v4-10-0-0-0-26")).await;
                answer(send, 409, refusal(409, "Conflict", "modified"));
                let (_, send) = v.expect("GET", &format!("{BLOCKS}/v4-10-0-0-0-26")).await;
                answer(send, 200, block(6 + i, &[]));
            }
        },
    );
    match result {
        Err(StoreError::Unavailable { message: m, .. }) => {
            assert!(m.contains("writes in a row lost"), "{m}")
        }
        other => panic!("expected Unavailable, got {other:?}"),
    }
}

#[test]
fn forbidden_writes_name_the_missing_rbac_verb() {
    let (store, v, rt) = open(list(10, vec![]), Duration::from_secs(5));
    let (result, _v) = scripted(
        &rt,
        v,
        move || store.claim(&[fresh("10.0.0.7", "c1")]),
        async |v| {
            let (_, send) = v.expect("POST", BLOCKS).await;
            answer(
                send,
                403,
                refusal(
                    403,
                    "Forbidden",
                    "ipblocks.allot.dev is forbidden: User \"system:serviceaccount:allot:allot-agent\" cannot create resource \"ipblocks\" in API group \"allot.dev\" at the cluster scope",
                ),
            );
        },
    );
    match result {
        Err(StoreError::Backend { message: m, .. }) => {
            assert!(m.contains("cannot create resource \"ipblocks\""), "{m}");
            assert!(
                m.contains("needs get, list, watch, create and update on ipblocks.allot.dev"),
                "{m}"
            );
        }
        other => panic!("expected a Backend error naming RBAC, got {other:?}"),
    }
}

/// Opens a store whose first list the API server refuses with `code`, `reason`, `message`.
fn open_refused(code: u16, reason: &'static str, message: &'static str) -> StoreError {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (service, handle) = mock::pair::<Request<Body>, Response<Body>>();
    let mut v = ApiServerVerifier::new(handle);
    rt.spawn(async move {
        let (_, send) = v.expect("GET", BLOCKS).await;
        answer(send, code, refusal(code, reason, message));
    });
    KubeStore::open_with(&KubeConfig::default(), system_clock(), move || async move {
        Ok(kube::Client::new(service, "default"))
    })
    .expect_err("a store that cannot list cannot open")
}

#[test]
fn forbidden_list_at_start_fails_the_open_naming_the_verb() {
    let m = open_refused(
        403,
        "Forbidden",
        "ipblocks.allot.dev is forbidden: User \"system:serviceaccount:allot:allot-agent\" cannot list resource \"ipblocks\" in API group \"allot.dev\" at the cluster scope",
    )
    .to_string();
    assert!(m.contains("cannot list resource \"ipblocks\""), "{m}");
    assert!(m.contains("ServiceAccount needs"), "{m}");
}

#[test]
fn a_missing_crd_says_to_install_the_crds() {
    let err = open_refused(
        404,
        "NotFound",
        "the server could not find the requested resource",
    );
    assert!(err.to_string().contains("kubectl apply -f crds/"), "{err}");
}

#[test]
fn an_api_server_that_does_not_answer_fails_the_call_within_its_budget() {
    let (store, v, rt) = open(list(10, vec![]), Duration::from_secs(1));
    let started = Instant::now();
    let (result, _v) = scripted(
        &rt,
        v,
        move || store.claim(&[fresh("10.0.0.7", "c1")]),
        async |v| {
            // Take the request and never answer it.
            let (_, send) = v.expect("POST", BLOCKS).await;
            tokio::time::sleep(Duration::from_secs(3)).await;
            drop(send);
        },
    );
    assert!(
        matches!(result, Err(StoreError::Unavailable { .. })),
        "{result:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(5));
}

/// An ADD that gives up while its write is on its way fails, but the write may still land:
/// the DEL that follows reads the attachment's claims only once that write is settled, so it
/// sees (and releases) what landed instead of releasing nothing and leaking the address.
#[test]
fn a_del_after_an_add_that_gave_up_sees_the_claim_its_write_landed() {
    let (store, v, rt) = open(list(10, vec![]), Duration::from_secs(1));
    let ((added, held), _v) = scripted(
        &rt,
        v,
        move || {
            let added = store.claim(&[fresh("10.0.0.7", "c1")]);
            (added, store.claims_of(&attachment("c1", "eth0")))
        },
        async |v| {
            // Answered after the call's budget (1 s), as an overloaded API server does.
            let (body, send) = v.expect("POST", BLOCKS).await;
            tokio::time::sleep(Duration::from_millis(1500)).await;
            let mut stored = body.clone();
            stored["metadata"]["resourceVersion"] = json!("11");
            answer(send, 201, stored);
        },
    );
    assert!(
        matches!(added, Err(StoreError::Unavailable { .. })),
        "{added:?}"
    );
    let held: Vec<IpAddr> = held.unwrap().iter().map(|c| c.address).collect();
    assert_eq!(
        held,
        [ip("10.0.0.7")],
        "the DEL sees the claim that landed late"
    );
}

#[test]
fn a_watch_answered_gone_lists_again_and_the_feed_reports_what_changed() {
    let (store, mut v, rt) = open(list(10, vec![]), Duration::from_secs(5));
    let start = store.snapshot(0).unwrap().revision;
    rt.block_on(async {
        let watch = v.watch().await;
        let gone = json!({"type": "ERROR", "object": refusal(410, "Expired", "too old resource version: 10 (40)")});
        watch.send_response(
            Response::builder()
                .status(200)
                .body(Body::from(format!("{gone}\n").into_bytes()))
                .unwrap(),
        );
        let (_, send) = v.expect("GET", BLOCKS).await;
        answer(send, 200, list(42, vec![block(41, &[("10.0.0.5", "c5")])]));
    });
    let deadline = Instant::now() + Duration::from_secs(10);
    let changes = loop {
        match store.changes_since(start).unwrap() {
            Changes::Since { changes, .. } if !changes.is_empty() => break changes,
            _ if Instant::now() > deadline => panic!("the relist's change never reached the feed"),
            _ => std::thread::sleep(Duration::from_millis(10)),
        }
    };
    let seen: Vec<(IpAddr, ChangeKind)> = changes.iter().map(|c| (c.address, c.kind)).collect();
    assert_eq!(seen, [(ip("10.0.0.5"), ChangeKind::Claimed)]);
    assert_eq!(store.all().unwrap().len(), 1);
}

/// A block with no claim, named after `cidr` (a /26 of 10.0.0.0/24), at `rv`, whose one
/// address was released at `released_at`.
fn emptied(cidr_start: u8, rv: u64, released_at: u64) -> Value {
    let name = format!("v4-10-0-0-{cidr_start}-26");
    let released = format!("10.0.0.{}", cidr_start + 3);
    json!({"apiVersion": "allot.dev/v1alpha1", "kind": "IPBlock",
           "metadata": {"name": name, "resourceVersion": rv.to_string()},
           "spec": {"cidr": format!("10.0.0.{cidr_start}/26"), "released": {released: released_at}}})
}

/// After a scan the controller deletes blocks that hold no claim and whose last release is
/// old: each delete carries the version the block was seen empty at, and a deleted block is
/// not asked for again. A block still cooling down and a block with a claim are left alone.
#[test]
fn emptied_blocks_past_their_cool_down_are_deleted_on_the_version_seen_empty() {
    let mut with_claim = block(7, &[("10.0.0.130", "c1")]);
    with_claim["metadata"]["name"] = json!("v4-10-0-0-128-26");
    with_claim["spec"]["cidr"] = json!("10.0.0.128/26");
    let listed = list(
        10,
        vec![emptied(0, 5, T0 - 7200), emptied(64, 6, T0), with_claim],
    );
    let (store, v, rt) = open(listed, Duration::from_secs(5));
    let s = std::sync::Arc::new(store);
    let s2 = s.clone();
    let (deleted, v) = scripted(
        &rt,
        v,
        move || s2.remove_emptied(T0 - 3600, 100),
        async |v| {
            let (options, send) = v
                .expect("DELETE", &format!("{BLOCKS}/v4-10-0-0-0-26"))
                .await;
            assert_eq!(
                options["preconditions"]["resourceVersion"], "5",
                "{options}"
            );
            answer(send, 200, emptied(0, 11, T0 - 7200));
        },
    );
    assert_eq!(deleted.unwrap(), 1);
    // Out of the mirror: a second pass asks for nothing.
    let s3 = s.clone();
    let (again, _v) = scripted(
        &rt,
        v,
        move || s3.remove_emptied(T0 - 3600, 100),
        async |v| v.expect_nothing(Duration::from_millis(300)).await,
    );
    assert_eq!(again.unwrap(), 0);
    assert_eq!(s.all().unwrap().len(), 1, "the claimed block is untouched");
}

/// A node claimed in the block after the controller saw it empty: the API server refuses the
/// delete on the stale version, and the block (with the new claim) stays.
#[test]
fn a_block_written_since_it_was_seen_empty_is_not_deleted() {
    let (store, v, rt) = open(
        list(10, vec![emptied(0, 5, T0 - 7200)]),
        Duration::from_secs(5),
    );
    let (deleted, _v) = scripted(
        &rt,
        v,
        move || store.remove_emptied(T0 - 3600, 100),
        async |v| {
            let (_, send) = v
                .expect("DELETE", &format!("{BLOCKS}/v4-10-0-0-0-26"))
                .await;
            answer(
                send,
                409,
                refusal(
                    409,
                    "Conflict",
                    "Precondition failed: ResourceVersion in precondition: 5, ResourceVersion in object meta: 12",
                ),
            );
        },
    );
    assert_eq!(deleted.unwrap(), 0);
}

/// The other side of that race: a node writing a claim into a block the controller deleted
/// meanwhile gets 404, reads again, finds no block and creates it with the claim.
#[test]
fn a_claim_into_a_block_deleted_meanwhile_creates_it_again() {
    let (store, v, rt) = open(
        list(10, vec![emptied(0, 5, T0 - 7200)]),
        Duration::from_secs(5),
    );
    let s = std::sync::Arc::new(store);
    let s2 = s.clone();
    let (result, _v) = scripted(
        &rt,
        v,
        move || s2.claim(&[fresh("10.0.0.7", "c1")]),
        async |v| {
            let path = format!("{BLOCKS}/v4-10-0-0-0-26");
            let (body, send) = v.expect("PUT", &path).await;
            assert_eq!(body["metadata"]["resourceVersion"], "5");
            let gone = r#"ipblocks.allot.dev "v4-10-0-0-0-26" not found"#;
            answer(send, 404, refusal(404, "NotFound", gone));
            let (_, send) = v.expect("GET", &path).await;
            answer(send, 404, refusal(404, "NotFound", gone));
            let (body, send) = v.expect("POST", BLOCKS).await;
            assert_eq!(body["spec"]["claims"]["10.0.0.7"]["containerId"], "c1");
            let mut stored = body.clone();
            stored["metadata"]["resourceVersion"] = json!("13");
            answer(send, 201, stored);
        },
    );
    result.expect("claimed");
    assert_eq!(s.claims_of(&attachment("c1", "eth0")).unwrap().len(), 1);
}

/// Without the delete verb the controller says which verb its ServiceAccount lacks.
#[test]
fn a_forbidden_delete_of_an_emptied_block_names_the_missing_verb() {
    let (store, v, rt) = open(
        list(10, vec![emptied(0, 5, T0 - 7200)]),
        Duration::from_secs(5),
    );
    let (result, _v) = scripted(
        &rt,
        v,
        move || store.remove_emptied(T0 - 3600, 100),
        async |v| {
            let (_, send) = v
                .expect("DELETE", &format!("{BLOCKS}/v4-10-0-0-0-26"))
                .await;
            answer(
                send,
                403,
                refusal(
                    403,
                    "Forbidden",
                    "ipblocks.allot.dev \"v4-10-0-0-0-26\" is forbidden: User \"system:serviceaccount:allot:allot-controller\" cannot delete resource \"ipblocks\"",
                ),
            );
        },
    );
    let message = result.unwrap_err().to_string();
    assert!(
        message.contains("needs delete on ipblocks.allot.dev"),
        "{message}"
    );
}

/// A block named `name` for `cidr` at `rv`, holding `address` for container `container`.
fn block_holding(name: &str, cidr: &str, rv: u64, address: &str, container: &str) -> Value {
    let mut b = block(rv, &[(address, container)]);
    b["metadata"]["name"] = json!(name);
    b["spec"]["cidr"] = json!(cidr);
    b
}

/// A dual-stack DEL releases in two IPBlocks, each its own compare-and-swap. When the API
/// server takes the IPv6 block's write and refuses the IPv4 block's, the call must not say
/// "unavailable, nothing written" (the IPv6 address is free to others from now on): it says
/// what it released, `StoreError::Partial`, and the same call again releases the rest only.
#[test]
fn a_release_across_two_blocks_refused_for_one_says_what_it_released() {
    let v6 = "v6-2001-0db8-0000-0000-0000-0000-0000-0000-122";
    let listed = list(
        10,
        vec![
            block(5, &[("10.0.0.5", "c5")]),
            block_holding(v6, "2001:db8::/122", 6, "2001:db8::5", "c5"),
        ],
    );
    let (store, v, rt) = open(listed, Duration::from_secs(5));
    let store = std::sync::Arc::new(store);
    let s = store.clone();
    let (result, v) = scripted(
        &rt,
        v,
        move || s.release_attachment(&attachment("c5", "eth0")),
        async move |v| {
            // Both writes go out at once; answer each by its block.
            for _ in 0..2 {
                let (method, uri, body, send) = v.next().await.expect("a write");
                assert_eq!(method, "PUT", "{uri}");
                if uri.contains(v6) {
                    let mut written = body.clone();
                    written["metadata"]["resourceVersion"] = json!("11");
                    answer(send, 200, written);
                } else {
                    answer(
                        send,
                        503,
                        refusal(503, "ServiceUnavailable", "etcd is down"),
                    );
                }
            }
        },
    );
    match result {
        Err(e @ StoreError::Partial { .. }) => {
            let done: Vec<IpAddr> = e.done().iter().map(|c| c.address).collect();
            assert_eq!(done, [ip("2001:db8::5")], "{e}");
            assert!(
                matches!(e.failure(), StoreError::Unavailable { .. }),
                "the rest failed as the API server said: {e}"
            );
            assert!(e.to_string().contains("2001:db8::5"), "{e}");
        }
        other => panic!("expected a partial release, got {other:?}"),
    }
    // The same call again writes the IPv4 block only.
    let s = store.clone();
    let (again, _v) = scripted(
        &rt,
        v,
        move || s.release_attachment(&attachment("c5", "eth0")),
        async |v| {
            let (body, send) = v.expect("PUT", &format!("{BLOCKS}/v4-10-0-0-0-26")).await;
            let mut written = body.clone();
            written["metadata"]["resourceVersion"] = json!("12");
            answer(send, 200, written);
            v.expect_nothing(Duration::from_millis(300)).await;
        },
    );
    let released: Vec<IpAddr> = again.unwrap().iter().map(|c| c.address).collect();
    assert_eq!(released, [ip("10.0.0.5")]);
}
